"""A lane: one independent, deterministic pipeline that produces whole batches.

Lane ℓ owns its slice of every source, a packer per source and its mixing counters. The
global batch g is produced by lane g mod `lanes`, so the global stream does not depend on how
many ranks and workers share the lanes out (see docs/architecture.md).
"""

from __future__ import annotations

from typing import TypedDict

from mixer.cache.store import open_cache
from mixer.config.recipe import Recipe
from mixer.core.errors import StateError
from mixer.pipeline.batch import Batch, BatchLayout
from mixer.pipeline.mix import TARGET_SCALE, choose_by_share, grow_by_share, shares
from mixer.pipeline.packer_state import PackerState
from mixer.pipeline.packers import RowPacker, make_packer
from mixer.pipeline.packing import BLOCKED, Row
from mixer.pipeline.schedule import WeightPlan
from mixer.pipeline.settings import StreamSettings
from mixer.pipeline.stream import SourceStream
from mixer.sources import SourceTable
from mixer.tokenize import Encoder

LANE_STATE_VERSION = 2


class _SourceCounters(TypedDict):
    tokens: int
    mix: int
    deficit: int  # target - mix, milli-tokens
    documents: int
    packer: PackerState | None  # None: from the source's start


class LaneSourceState(_SourceCounters, total=False):
    """One source's entry in a lane's state: the mixing counters of the regime in force,
    the packer's state, and what the metrics resume from (`Lane.state_dict` writes all of
    them but `reasons` and `oversize`; `fresh_state` only the counters)."""

    skipped: int  # informational: the stream's own state counts them
    epochs: float  # passes over the lane's slice (metrics), 4 decimals
    reasons: dict[str, int]  # skipped records per reason, when any
    oversize: int  # image and audio recipes: oversize documents seen


class _LaneCounters(TypedDict):
    v: int
    lane: int
    batches: int
    regime: str
    sources: dict[str, LaneSourceState]


class LaneState(_LaneCounters, total=False):
    """A lane's state (`LANE_STATE_VERSION`): batches made, the regime whose counters the
    sources' entries hold, and one entry per source by name."""

    exhausted: int  # informational (derived on load): 0 or 1; absent from `fresh_state`


class Lane:
    """Batches of one lane, resumable from a small plain-data state."""

    def __init__(
        self,
        lane: int,
        recipe: Recipe,
        tables: list[SourceTable],
        encoder: Encoder,
        state: LaneState | None = None,
        *,
        block_size: int = 8 << 20,
        layout: BatchLayout | None = None,
        plan: WeightPlan | None = None,
    ) -> None:
        self.lane = lane
        self.recipe = recipe
        self.names = [s.name for s in recipe.sources]
        self.plan = plan or WeightPlan(recipe)
        self.pad_id = encoder.info.pad_id
        if layout is None and recipe.has_media:
            raise ValueError(
                "a lane of an image or audio recipe needs its layout "
                "(mixer.images.select.layout_for)"
            )
        self.layout = layout or BatchLayout(seq_len=recipe.seq_len, pad_id=encoder.info.pad_id)
        self.packers: list[RowPacker] = []
        self.streams: list[SourceStream] = []
        cache = open_cache(recipe, encoder.info)
        for src, table in zip(recipe.sources, tables):
            stream = SourceStream(
                table=table,
                lane=lane,
                encode=encoder,
                settings=StreamSettings.from_recipe(recipe, src, block_size=block_size),
                documents=self.layout.document_builder(encoder, src.name),
                token_cache=cache,
                clock=self._global_batch,
            )
            self.streams.append(stream)
            self.packers.append(
                make_packer(
                    recipe.packing,
                    stream,
                    seq_len=recipe.seq_len,
                    pad_id=self.pad_id,
                    mask_document_boundaries=recipe.mask_document_boundaries,
                    window=recipe.pack_window,
                    caps=self.layout.budget(),
                )
            )
        self.load_state_dict(state)

    def close(self) -> None:
        """Close the streams' open readers and give up their unfinished cache entries."""
        for stream in self.streams:
            stream.close()

    def _global_batch(self) -> int:
        """The global index of the batch this lane makes next."""
        return self.batches * self.recipe.lanes + self.lane

    def fresh_state(self) -> LaneState:
        return {
            "v": LANE_STATE_VERSION,
            "lane": self.lane,
            "batches": 0,
            "regime": "",
            "sources": {
                name: {"tokens": 0, "mix": 0, "deficit": 0, "documents": 0, "packer": None}
                for name in self.names
            },
        }

    def load_state_dict(self, state: LaneState | None) -> None:
        fresh = self.fresh_state()
        state = state or fresh
        if state.get("v") != LANE_STATE_VERSION or state.get("lane") != self.lane:
            raise StateError(
                f"lane {self.lane}: state of version {state.get('v')} for lane "
                f"{state.get('lane')} cannot be loaded"
            )
        self.batches = state["batches"]
        # The mixing counters of the regime in force (mix.py): a regime the recipe no longer
        # produces here (its weights were edited, or a source was added) restarts them.
        self.regime = state["regime"]
        self.tokens, self.mix, self.target, self.documents = [], [], [], []
        for name, packer, stream in zip(self.names, self.packers, self.streams):
            entry = state["sources"].get(name)
            if entry is None:
                entry = fresh["sources"][name]
                self.regime = ""
            self.tokens.append(entry["tokens"])
            self.mix.append(entry["mix"])
            # Saved as the deficit (target - mix, milli-tokens): about a row at most, so short.
            self.target.append(entry["deficit"] + TARGET_SCALE * entry["mix"])
            self.documents.append(entry["documents"])
            packer.load_state_dict(entry["packer"])
            if "epochs" in entry and "skipped" in entry:
                stream.resume_metrics(entry["epochs"], entry["skipped"], entry.get("reasons", {}))

    def state_dict(self) -> LaneState:
        """Plain data; `exhausted` and `skipped` are informational (derived on load)."""
        sources: dict[str, LaneSourceState] = {}
        for i, (name, packer, stream) in enumerate(zip(self.names, self.packers, self.streams)):
            sources[name] = {
                "tokens": self.tokens[i],
                "mix": self.mix[i],
                "deficit": self.target[i] - TARGET_SCALE * self.mix[i],
                "documents": self.documents[i],
                "skipped": stream.skipped,
                "epochs": round(packer.progress(), 4),
                "packer": packer.state_dict(),
            }
            reasons = stream.skipped_reasons
            if reasons:
                sources[name]["reasons"] = dict(sorted(reasons.items()))
            if self.recipe.has_media:
                sources[name]["oversize"] = stream.oversize
        return {
            "v": LANE_STATE_VERSION,
            "lane": self.lane,
            "batches": self.batches,
            "exhausted": int(self.exhausted),
            "regime": self.regime,
            "sources": sources,
        }

    starved = False

    @property
    def exhausted(self) -> bool:
        return self.starved or all(p.exhausted for p in self.packers)

    def next_batch(self, batch_size: int) -> Batch:
        """The lane's next batch; all padding once every source has run out.

        With image caps, a source whose next row does not fit what is left of the batch's
        caps sits the rest of this batch out (its document waits); when no source fits, the
        remaining rows are padding.
        """
        length = self.recipe.seq_len
        regime, weights = self.plan.at(self._global_batch())
        if regime != self.regime:  # a new stretch: its counters start from zero
            self.regime = regime
            self.mix = [0] * len(self.mix)
            self.target = [0] * len(self.target)
        rows: list[Row | None] = [None] * batch_size
        sources = [-1] * batch_size
        budget = self.layout.budget()
        blocked = [False] * len(self.packers)
        parts = None  # the sources' parts of a row, while which sources are active holds
        for row_index in range(batch_size):
            while True:
                if parts is None:
                    parts = (
                        shares(
                            weights, [not (p.exhausted or b) for p, b in zip(self.packers, blocked)]
                        )
                        or []
                    )
                choice = choose_by_share(parts, self.mix, self.target, length)
                if choice is None:
                    break
                packer = self.packers[choice]
                row = packer.next_row(budget)
                if row is BLOCKED:
                    blocked[choice] = True
                if row is BLOCKED or row is None:  # (None: that source just ran out)
                    parts = None  # the others' weights renormalize
                    continue
                assert isinstance(row, Row)
                rows[row_index], sources[row_index] = row, choice
                if budget is not None:
                    budget.take(*row.counts)
                self.tokens[choice] += row.real
                self.mix[choice] += row.real
                self.documents[choice] += row.starts
                grow_by_share(self.target, parts, row.real)
                if packer.exhausted:
                    parts = None
                break
            if choice is None:
                break
        if (
            all(r is None for r in rows)
            and not self.exhausted
            and not self.plan.may_draw_later(
                self._global_batch(), [not p.exhausted for p in self.packers]
            )
        ):
            # Only sources weighing 0 from here on are left: nothing will be drawn again.
            self.starved = True
        self.batches += 1
        return self.layout.assemble(rows, sources, padding=all(r is None for r in rows))
