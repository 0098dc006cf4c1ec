"""The user-facing loader: lanes served by DataLoader workers, exact state in the main process.

Rank r at step s consumes global batch g = g0 + s·W + r, produced by lane g mod P. Workers
attach the producing lane's state to every batch; the main process strips it and keeps, per
lane, the state as of the batches actually handed to the user, so `state_dict()` is exact
however far the workers have prefetched.
"""

from __future__ import annotations

import logging
import traceback
import weakref
from collections.abc import Generator, Iterator
from time import perf_counter
from typing import Any

import numpy.random  # noqa: F401  (imported before forking: workers seed it on start)
import torch

from mixer.cache.store import tokenizer_info_dir
from mixer.cache.tokenizer_setup import recipe_backend, recipe_tokenizer
from mixer.config.recipe import Recipe, load_recipe
from mixer.core.errors import DataError, StateError
from mixer.images.select import layout_for
from mixer.pipeline.batch import TEXT_KEYS
from mixer.pipeline.lanes import LaneState
from mixer.runtime import dist
from mixer.runtime.data_tier import DataTier
from mixer.runtime.lane_dataset import as_batch
from mixer.runtime.metrics import MetricsSnapshot, loader_metrics, sum_metrics, warn_left_over
from mixer.runtime.mixture import Mixture
from mixer.runtime.pixel_slots import receive_pixels
from mixer.runtime.profile import (
    StageTotals,
    WaitClock,
    profile_metrics,
    profile_raw,
    sum_profiles,
)
from mixer.runtime.ray_workers import RayWorkers
from mixer.runtime.ring import BatchRing, InRing
from mixer.runtime.state import (
    LoaderPayload,
    check_fingerprint,
    fingerprint,
    merge_payloads,
    pack,
    unpack,
)
from mixer.runtime.topology import check_workers, global_batch, lanes_served
from mixer.runtime.torch_dataset import TorchLaneDataset, worker_batches
from mixer.sources import SourceTable
from mixer.sources.manifest import list_sources
from mixer.tokenize import BackendChoice, TokenizerInfo
from mixer.tokenize.tokenizer import finish_preloads
from mixer.tokenize.verify import preload

log = logging.getLogger("mixer.loader")
BATCH_KEYS = TEXT_KEYS  # every layout has these; image layouts add more


class Loader:
    """Iterable of batches (dicts of [batch_size, seq_len] int64 tensors) with exact state.

    Build it with `mixer.build_loader`. A second `iter()` continues where the first stopped.
    Inside a torch.distributed job `state_dict()` is a collective: every rank must call it.
    """

    def __init__(
        self,
        recipe: Recipe,
        *,
        tables: list[SourceTable],
        tokenizer: TokenizerInfo,
        rank: int,
        world_size: int,
        num_workers: int,
        distributed: bool = False,
        workers: RayWorkers | None = None,
    ) -> None:
        check_workers(recipe.lanes, rank, world_size, num_workers, workers)
        self.workers = workers
        self._tier = DataTier(workers, recipe.lanes, world_size, num_workers)
        self.recipe = recipe
        self.tables = tables
        self.tokenizer = tokenizer
        self.rank = rank
        self.world_size = world_size
        self.num_workers = num_workers
        self._distributed = distributed
        self._fingerprint = fingerprint(recipe, tokenizer, tables)
        self.layout = layout_for(recipe, tokenizer)
        self._next_global = 0  # first global batch of the next step
        self._lane_states: dict[int, LaneState | None] = {}
        self._io: dict[int, dict[str, int]] = {}  # latest remote-read counters per worker
        self._gen: weakref.ref | None = None
        self._closing = False  # set by `close` from another thread while iterating
        self._mixture = Mixture(recipe, world_size, distributed)
        # Bumped by set_weights, online mixing, load_state_dict and resizes: a running
        # iteration restarts from the handed-out (or loaded) lane states.
        self._plan_version = 0
        self.backend: BackendChoice | None = None  # which encodes, and why (build_loader)
        self._stages = StageTotals()  # this iteration's profile (metrics()["stages"], ...)
        self._wait = WaitClock()

    # -- ownership ---------------------------------------------------------------------------
    def own_lanes(self) -> list[int]:
        """Lanes whose batches this rank receives from the current position on."""
        return self._lanes_from(self._next_global)

    def _lanes_from(self, next_global: int) -> list[int]:
        return lanes_served(self.recipe.lanes, next_global, self.rank, self.world_size)

    @property
    def next_global_batch(self) -> int:
        """Global index of the batch this rank receives next (rank r gets g0 + s·W + r)."""
        return global_batch(self._next_global, 0, self.rank, self.world_size)

    @property
    def global_tokens(self) -> int:
        """Global tokens before the batch this rank receives next (its schedule position)."""
        return self._mixture.plan.tokens_at(self.next_global_batch)

    # -- state -------------------------------------------------------------------------------
    def _rank_payload(self) -> LoaderPayload:
        schedule, override = self._mixture.payload(self._next_global)
        payload: LoaderPayload = {
            "kind": "global" if self.world_size == 1 else "rank",
            "fingerprint": self._fingerprint,
            "next_global": self._next_global,
            "world_size": self.world_size,
            "rank": self.rank,
            "lanes": {str(i): self._lane_states.get(i) for i in self.own_lanes()},
            "listing_skipped": {t.name: len(t.skipped) for t in self.tables},
            "global_tokens": self._mixture.plan.tokens_at(self._next_global),
            "schedule": schedule,
            "override": override,
        }
        mixing = self._mixture.mixing_payload()
        if mixing is not None:  # (absent otherwise: other recipes' states keep their shape)
            payload["mixing"] = mixing
        return payload

    def state_dict(self) -> dict[str, Any]:
        """Fixed-shape, JSON-serialisable state (kilobytes).

        Inside a torch.distributed job this is a collective that every rank must call: it
        gathers all ranks' lane states so any rank's checkpoint restores the global position.
        """
        payload = self._rank_payload()
        if self._distributed and self.world_size > 1:
            dist.barrier_or_fail(
                dist.collective_timeout(),
                "loader.state_dict() is a collective: call it on every rank",
            )
            # The gathered payloads are this job's own: joined as they are, not re-checked.
            return pack(merge_payloads(dist.all_gather_objects(payload)))
        return pack(payload)

    def local_state_dict(self) -> dict[str, Any]:
        """This rank's part of the state, never a collective: `merge_states` of all ranks'
        local states of one step is `state_dict()` (a framework's prefetch may need it)."""
        return pack(self._rank_payload())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a state; validated against the recipe. Called while an iteration is
        running, that iteration goes on from the loaded state: its next batch is the state's
        next batch (what the workers prefetched is dropped, as after `set_weights`)."""
        header = unpack(state, lanes=())
        check_fingerprint(header["fingerprint"], self._fingerprint)
        payload = unpack(state, lanes=self._lanes_from(header["next_global"]))
        if payload["kind"] == "rank" and (payload["world_size"], payload["rank"]) != (
            self.world_size,
            self.rank,
        ):
            raise StateError(
                f"this state holds only rank {payload['rank']}'s lanes of a "
                f"{payload['world_size']}-rank job; to resume on {self.world_size} rank(s) "
                "combine all ranks' states with mixer.merge_states (or save from inside the "
                "torch.distributed job, which does it for you)"
            )
        needed = self._lanes_from(payload["next_global"])
        missing = [i for i in needed if str(i) not in payload["lanes"]]
        if missing:
            raise StateError(f"the state lacks lanes {missing} that rank {self.rank} needs")
        lanes = {i: payload["lanes"][str(i)] for i in needed}
        self._mixture.load(
            payload["next_global"],
            payload.get("global_tokens", 0),
            payload.get("schedule"),
            payload.get("override"),
            payload.get("mixing"),
            keep_pending=payload["kind"] == "rank" or self.rank == 0,  # a merged state's: rank 0
        )
        self._next_global = payload["next_global"]
        self._lane_states = lanes
        self._plan_version += 1  # a running iteration restarts from here

    # -- mixture -----------------------------------------------------------------------------
    def set_weights(self, weights: dict[str, float]) -> None:
        """Target these weights (source name → weight, normalized; unnamed sources weigh 0)
        for every batch handed out after this call, overriding the schedule until the next
        call. Recorded in the state. Batches the workers prefetched are produced again.

        Inside a torch.distributed job this is a collective: every rank must call it at the
        same step with the same weights (a mismatch raises on every rank).

        A source that has run out (`epochs` reached) draws nothing, whatever its weight: the
        others renormalize. When every positively weighted source has run out, an unlimited
        recipe raises `DataError`, and a finite one ends (as a schedule's point would) with a
        warning naming the sources whose documents are left undelivered.
        """
        self._mixture.set_weights(weights, self._next_global)
        self._plan_version += 1

    # -- the data tier -----------------------------------------------------------------------
    def resize_workers(self, actors: int) -> None:
        """Run the lanes on `actors` Ray actors from the next batch on (also for the next
        iteration). The batches are unchanged, and so is the state: the lanes restart on
        the new actors from the states of the batches handed out. A count the lanes rule
        refuses raises `TopologyError` listing the valid ones."""
        if self._tier.resize(self._tier.check_resize(actors), "resize_workers"):
            self._plan_version += 1

    # -- online mixing -----------------------------------------------------------------------
    def report_loss(self, token_loss: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
        """Add this batch's per-source loss to the sums of the next online mixing update.

        `token_loss`: the loss of each position of `batch`, `[batch_size, seq_len]` aligned
        with `labels` or `[batch_size, seq_len - 1]` shifted (the loss of predicting
        `labels[:, 1:]`); positions labelled -100 are ignored. Call it once per batch, on
        every rank, before the `next()` that follows (docs/online-mixing.md)."""
        self._mixture.report_loss(token_loss, batch)

    def _mix(self) -> bool:
        """At an update point, the new weights (a collective under torch.distributed): True
        when they changed, and the running iteration restarts."""
        if not self._mixture.update(self._next_global):
            return False
        self._plan_version += 1
        return True

    def metrics(self, all_ranks: bool = False) -> dict[str, Any]:
        """What this rank's lanes delivered so far, per source (docs/metrics.md): `tokens`,
        `documents`, `target_share` (now), `realized_share` (cumulative), `epochs`
        (fractional passes), `skipped`, `skipped_by_reason`, `oversize`; plus `io` (remote
        reads of the current iteration), `next_global_batch`, `global_tokens` and
        `workers` (`kind` "ray", "dataloader" or "none", the `count` running, `resizes`);
        and the current iteration's profile (docs/profile.md): `stages` (busy seconds per
        stage), `wait` (the caller's waits inside `next()`) and `bottleneck`.

        `all_ranks=True` inside a torch.distributed job is a collective that sums the ranks'
        figures (every rank must call it)."""
        snapshot = self._metrics_snapshot()
        mine = {**loader_metrics(snapshot), "workers": self._tier.metrics()}
        profile = profile_raw(self._stages, self._wait)
        if all_ranks and self._distributed and self.world_size > 1:
            gathered = dist.all_gather_objects((mine, profile))
            per_rank = [m for m, _ in gathered]
            summed = sum_metrics(per_rank, snapshot)
            summed["workers"] = {
                "kind": mine["workers"]["kind"],
                "count": sum(m["workers"]["count"] for m in per_rank),
                "resizes": sum(m["workers"]["resizes"] for m in per_rank),
            }
            mine = {**summed, **profile_metrics(sum_profiles([p for _, p in gathered]))}
        else:
            mine = {**mine, **profile_metrics(profile)}
        mixing = self._mixture.mixing_metrics(snapshot.target_share)
        if mixing is not None:
            mine["mixing"] = mixing
        return mine

    def _metrics_snapshot(self) -> MetricsSnapshot:
        next_global = self.next_global_batch
        _, target = self._mixture.plan.at(next_global)
        return MetricsSnapshot(
            names=list(self.recipe.names),
            lane_states={lane: self._lane_states.get(lane) for lane in self.own_lanes()},
            listing_skipped={t.name: len(t.skipped) for t in self.tables},
            target_share=list(target),
            global_tokens=self._mixture.plan.tokens_at(next_global),
            io=list(self._io.values()),
            next_global_batch=next_global,
            next_global=self._next_global,
        )

    # -- iteration ---------------------------------------------------------------------------
    def _lanes_done(self, pending: dict[int, LaneState]) -> bool:
        for lane in self.own_lanes():
            state = pending.get(lane, self._lane_states.get(lane))
            if not state or not state.get("exhausted"):
                return False
        return True

    def _decide(self, padding: bool, done: bool) -> tuple[bool, bool]:
        """(some rank has a real batch, every rank has run out), agreed across ranks."""
        if self._distributed and self.world_size > 1:
            if not self.recipe.finite:
                return True, False
            real, finished = dist.all_reduce_flags([int(not padding), int(done)], "max_min")
            return bool(real), bool(finished)
        return not padding, done

    def _hand(self, meta: dict) -> None:
        self._lane_states[meta["lane"]] = meta["state"]
        self._io[meta["worker"]] = meta["io"]
        self._next_global += self.world_size

    def _finish(self, pending: dict[int, LaneState]) -> None:
        """The stream has ended: keep the final states of lanes whose trailing padding batches
        were held back, so their skipped records count in `metrics()` and the state."""
        self._lane_states.update(pending)
        if self.recipe.finite:
            warn_left_over(self.recipe, self.metrics()["epochs"], self.rank)
            return
        _, weights = self._mixture.plan.at(self.next_global_batch)
        if not any(w > 0 and src.epochs is None for w, src in zip(weights, self.recipe.sources)):
            drawn = [n for n, w in zip(self.recipe.names, weights) if w > 0]
            raise DataError(
                f"rank {self.rank}'s lanes {self.own_lanes()} have nothing left to draw: "
                f"the sources weighted from here on ({', '.join(drawn)}) are capped and "
                "ran out, and every unlimited source weighs 0 (set_weights or the "
                "schedule); give an unlimited source a positive weight",
                reason="other",
            )
        raise DataError(
            f"the recipe has unlimited sources but rank {self.rank}'s lanes "
            f"{self.own_lanes()} ran out of documents of every source (each source has "
            "fewer documents than the lanes reading it); use fewer lanes or more data",
            reason="other",
        )

    def _generate(self) -> Iterator[dict[str, torch.Tensor]]:
        # A set_weights or load_state_dict call while iterating discards what the workers
        # prefetched and starts them again from the handed-out (or loaded) lane states.
        self._stages, self._wait = StageTotals(), WaitClock()  # counters of this iteration
        self._wait.called()
        scaler = self._tier.start(self.layout, self._wait)
        try:
            while True:
                self._mix()
                if scaler is None:
                    more = yield from self._run()
                else:
                    scaler.restart(self._tier.actors)  # the lanes' restart is not the steady wait
                    more = yield from self._tier.scaled(self._run(), scaler, self._restart)
                if not more:
                    break
        finally:
            self._tier.stop()

    def _restart(self) -> None:
        self._plan_version += 1

    def _open(self, dataset: TorchLaneDataset) -> Any:
        """What yields (batch, meta): the dataset itself, DataLoader workers, or Ray actors."""
        if self._tier.pool is not None:
            return self._tier.stream(dataset)
        if self.num_workers == 0:
            return iter(dataset)
        return worker_batches(dataset, self.layout, self.num_workers)

    def _receive(self, ring: BatchRing | None, data: Any, padding: bool) -> Any:
        """A batch out of the workers' ring (its slot freed at once), or what came as it is."""
        if isinstance(data, InRing):
            assert ring is not None  # (workers send an InRing only into a dataset's ring)
            return ring.take(data, lambda wire: self.layout.from_wire(wire, padding))
        return data

    def _run(self) -> Generator[dict[str, torch.Tensor], None, bool]:
        """Batches until the stream ends (returns False) or the weights change (True)."""
        version = self._plan_version
        self._stages.restart()
        dataset = TorchLaneDataset(
            self.recipe,
            self.tables,
            self._tokenizer_now(),
            dict(self._lane_states),
            self._next_global,
            self.rank,
            self.world_size,
            self._mixture.plan,
        )
        source = self._open(dataset)
        held: list[tuple[dict, dict]] = []
        try:
            while True:
                if self._closing:  # closed from another thread (see `close`)
                    return False
                if self._plan_version != version or self._mix():
                    return True
                try:
                    data, meta = next(source)
                except StopIteration:
                    return False
                if "error" in meta:
                    raise meta["error"]
                self._stages.worker(meta["worker"], meta.get("stages"))
                took = perf_counter()
                receive_pixels(dataset.pixel_slots, data)
                data = self._receive(dataset.ring, data, meta["padding"])
                self._stages.own_transfer += perf_counter() - took
                expected = global_batch(self._next_global, len(held), self.rank, self.world_size)
                if meta["g"] != expected:
                    raise RuntimeError(
                        f"internal error: got global batch {meta['g']}, expected {expected}"
                    )
                pending = {m["lane"]: m["state"] for _, m in held}
                pending[meta["lane"]] = meta["state"]
                real, finished = self._decide(meta["padding"], self._lanes_done(pending))
                if not real:
                    if finished:
                        self._finish(pending)
                        return False
                    held.append((data, meta))  # padding: yield only if real data follows
                    continue
                for held_data, held_meta in held:
                    if self._mix():
                        return True  # the held batches were made with the old weights
                    self._hand(held_meta)
                    yield self._handed(held_data, held_meta)
                    self._wait.called()
                    if self._plan_version != version:
                        return True  # the rest was made with the old weights
                held.clear()
                if self._mix():
                    return True
                self._hand(meta)
                yield self._handed(data, meta)
                self._wait.called()
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                self._stop_verifying()
            # The traceback's DataLoader frames hold its iterator; clear their locals so the
            # workers stop now, not when the caller drops the exception.
            traceback.clear_frames(exc.__traceback__)
            raise
        finally:
            if self.num_workers == 0:  # in-process lanes, or the Ray stream
                source.close()  # closes the lanes' readers and unfinished cache entries
            del source  # shuts DataLoader workers down

    def _handed(self, data: Any, meta: dict) -> dict[str, torch.Tensor]:
        """The user's batch, made now: its time is the transfer stage's, and the caller's
        wait ends."""
        took = perf_counter()
        batch = as_batch(self.layout, data, meta)
        self._stages.own_transfer += perf_counter() - took
        self._wait.handed()
        if self.backend is not None and self.backend.background is not None:
            self.backend.background.begin()  # (after the first batch, off its path)
        return batch

    def _tokenizer_now(self) -> TokenizerInfo:
        """The tokenizer an iteration (its DataLoader workers, Ray actors) starts with: once a
        background fastokens verification has its verdict, the backend it chose."""
        return self.tokenizer if self.backend is None else self.backend.info_now()

    def _stop_verifying(self) -> None:
        if self.backend is not None and self.backend.background is not None:
            self.backend.background.stop()

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self._end_iteration()
        self._closing = False
        gen = self._generate()
        # A weak reference: a dropped loader and iterator free their workers at once,
        # without waiting for the cycle collector.
        self._gen = weakref.ref(gen)
        return gen

    def close(self) -> None:
        """Stop the current iteration and its worker processes, and a fastokens verification
        still running in the background (`tokenizers` encodes from then on). From another
        thread while the iterating one is inside `next()`: that iteration ends after the batch
        it is getting (the workers stop then)."""
        self._stop_verifying()
        self._end_iteration()

    def _end_iteration(self) -> None:
        gen = self._gen() if self._gen is not None else None
        if gen is not None and gen.gi_running:  # inside next() in another thread
            self._closing = True
            return
        self._gen = None
        if gen is not None:
            gen.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def build_loader(
    recipe: Recipe | dict | str,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    num_workers: int = 0,
    workers: RayWorkers | None = None,
) -> Loader:
    """A loader for this rank. Rank and world size default to torch.distributed's, else 0/1.
    `workers=mixer.RayWorkers(...)` runs the lanes in Ray actors (num_workers must be 0)."""
    recipe = load_recipe(recipe)
    distributed = dist.is_distributed() and rank is None and world_size is None
    if rank is None or world_size is None:
        found_rank, found_world = dist.rank_and_world()
        rank = found_rank if rank is None else rank
        world_size = found_world if world_size is None else world_size
    check_workers(recipe.lanes, rank, world_size, num_workers, workers)
    tokenizer = recipe_tokenizer(recipe)
    preload(recipe, tokenizer, tokenizer_info_dir(recipe))  # on a thread, while listing
    lister = lambda: list_sources(recipe)
    tables = dist.list_once(lister) if distributed and world_size > 1 else lister()
    # `auto` with no verdict kept: `tokenizers` encodes the first batches while fastokens is
    # verified on a thread (DataLoader workers switch too). Ray actors start with the verdict.
    choice = recipe_backend(recipe, tables, tokenizer, background=workers is None)
    if choice.background is None and (workers is not None or choice.info.backend != "fastokens"):
        finish_preloads(keep=choice.info.backend == "fastokens")
    # (DataLoader workers: `worker_batches` waits for the load right before they fork, so that
    # building the loader overlaps it)
    loader = Loader(
        recipe,
        tables=tables,
        tokenizer=choice.info,
        rank=rank,
        world_size=world_size,
        num_workers=num_workers,
        distributed=distributed,
        workers=workers,
    )
    loader.backend = choice
    return loader
