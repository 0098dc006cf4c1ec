"""A lane: one independent, deterministic pipeline that produces whole batches.

Lane ℓ owns its slice of every source, a packer per source and its mixing counters. The
global batch g is produced by lane g mod `lanes`, so the global stream does not depend on how
many ranks and workers share the lanes out (see docs/architecture.md).
"""

from __future__ import annotations

from mixer.batch import Batch, BatchLayout, layout_for
from mixer.errors import StateError
from mixer.mix import choose_source
from mixer.recipe import Recipe
from mixer.sources import SourceTable
from mixer.stream import SourceStream
from mixer.tokenize import BLOCKED, Encoder, Row, make_packer

LANE_STATE_VERSION = 1


class Lane:
    """Batches of one lane, resumable from a small plain-data state."""

    def __init__(self, lane: int, recipe: Recipe, tables: list[SourceTable], encoder: Encoder,
                 state: dict | None = None, *, block_size: int = 8 << 20,
                 layout: BatchLayout | None = None) -> None:
        self.lane = lane
        self.recipe = recipe
        self.names = [s.name for s in recipe.sources]
        self.weights = recipe.weights
        self.pad_id = encoder.info.pad_id
        self.layout = layout or layout_for(recipe, encoder.info)
        self.packers = []
        for src, table in zip(recipe.sources, tables):
            stream = SourceStream(
                table=table, lane=lane, lanes=recipe.lanes, seed=recipe.seed,
                epochs=src.epochs, on_error=src.on_error, text_field=src.chosen_text_field,
                storage_options=src.storage_options, window_docs=recipe.shuffle_window,
                window_bytes=recipe.window_bytes,
                max_document_bytes=recipe.max_document_bytes, encode=encoder,
                block_size=block_size,
                documents=self.layout.document_builder(encoder, src.name),
                prefetch_tokens=2 * recipe.batch_size * recipe.seq_len,
                clock=self._global_batch, batch_tokens=recipe.batch_size * recipe.seq_len,
                lanes_per_batch=recipe.lanes)
            self.packers.append(make_packer(
                recipe.packing, stream, seq_len=recipe.seq_len, pad_id=self.pad_id,
                mask_document_boundaries=recipe.mask_document_boundaries,
                window=recipe.pack_window, caps=self.layout.budget()))
        self.load_state_dict(state)

    def _global_batch(self) -> int:
        """The global index of the batch this lane makes next."""
        return self.batches * self.recipe.lanes + self.lane

    def _weights_key(self) -> dict[str, float]:
        return {name: round(w, 9) for name, w in zip(self.names, self.weights)}

    def fresh_state(self) -> dict:
        return {"v": LANE_STATE_VERSION, "lane": self.lane, "batches": 0,
                "weights": self._weights_key(),
                "sources": {name: {"tokens": 0, "mix": 0, "packer": None}
                            for name in self.names}}

    def load_state_dict(self, state: dict | None) -> None:
        fresh = self.fresh_state()
        state = state or fresh
        if state.get("v") != LANE_STATE_VERSION or state.get("lane") != self.lane:
            raise StateError(f"lane {self.lane}: state of version {state.get('v')} for lane "
                             f"{state.get('lane')} cannot be loaded")
        self.batches = state["batches"]
        # New weights (or a source added since the checkpoint) apply from here on: the mixing
        # counters restart instead of making up for the tokens drawn under the old weights.
        same_weights = state.get("weights") == self._weights_key()
        self.tokens, self.mix = [], []
        for name, packer in zip(self.names, self.packers):
            entry = state["sources"].get(name, fresh["sources"][name])
            self.tokens.append(entry["tokens"])
            self.mix.append(entry["mix"] if same_weights else 0)
            packer.load_state_dict(entry["packer"])

    def state_dict(self) -> dict:
        """Plain data; `exhausted` and `skipped` are informational (derived on load)."""
        sources = {}
        for name, tokens, mix, packer in zip(self.names, self.tokens, self.mix, self.packers):
            sources[name] = {"tokens": tokens, "mix": mix, "skipped": packer.stream.skipped,
                             "packer": packer.state_dict()}
            if self.recipe.images is not None:
                sources[name]["oversize"] = packer.stream.oversize
        return {"v": LANE_STATE_VERSION, "lane": self.lane, "batches": self.batches,
                "exhausted": int(self.exhausted), "weights": self._weights_key(),
                "sources": sources}

    @property
    def exhausted(self) -> bool:
        return all(p.exhausted for p in self.packers)

    def next_batch(self, batch_size: int) -> Batch:
        """The lane's next batch; all padding once every source has run out.

        With image caps, a source whose next row does not fit what is left of the batch's
        caps sits the rest of this batch out (its document waits); when no source fits, the
        remaining rows are padding.
        """
        length = self.recipe.seq_len
        arrays = self.layout.new_rows(batch_size)
        rows: list[Row | None] = [None] * batch_size
        budget = self.layout.budget()
        blocked = [False] * len(self.packers)
        for row_index in range(batch_size):
            while True:
                active = [not (p.exhausted or b) for p, b in zip(self.packers, blocked)]
                choice = choose_source(self.weights, self.mix, active, length)
                if choice is None:
                    break
                row = self.packers[choice].next_row(budget)
                if row is BLOCKED:
                    blocked[choice] = True
                    continue
                if row is None:
                    continue  # that source just ran out; the weights renormalize
                assert isinstance(row, Row)
                self.layout.put_row(arrays, row_index, row, choice)
                rows[row_index] = row
                if budget is not None:
                    budget.take(row.images, row.patches)
                self.tokens[choice] += row.real
                self.mix[choice] += row.real
                break
            if choice is None:
                break
        self.batches += 1
        return self.layout.finish(arrays, rows, padding=all(r is None for r in rows))
