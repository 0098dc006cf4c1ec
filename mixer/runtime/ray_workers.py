"""Data workers on a Ray cluster: the loader's lanes run in Ray actors instead of DataLoader
workers, and the stream does not change.

Actor w of A runs `LaneDataset.produce(w, A, ...)`, exactly what DataLoader worker w of A
runs, so it makes global steps w, w + A, w + 2A, ... of this rank. It gets a plain, torch-free
`LaneDataset` and never imports torch (seconds of each actor's start). The driver asks each
actor for groups of `in_flight // 2` batches (at least one) and keeps at most `in_flight`
batches requested per actor beyond those it holds (Ray runs an actor's calls in the order
they were sent), taking the results in step order: one object per group, since every object
costs each process involved about a millisecond whatever its size. A batch's arrays come back
through the object store as numpy arrays (no pickled lists); the driver turns them into its
own arrays as it hands them out, and the group's object is released with its last batch.

An actor that dies is replaced, and its lanes restart from the latest lane states the driver
received (those of the batches handed out, or held back as padding), at the step it was
asked for: the stream is unchanged. Actors are owned by the driver (not detached), so Ray
ends them when the driver's process dies; `close()` and an exit hook end them sooner.

`ray` is imported here only inside functions: `import mixer` never imports it.
"""

from __future__ import annotations

import atexit
import copy
import logging
import os
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from mixer.core.errors import MixerError, TopologyError
from mixer.pipeline.batch import Batch, BatchLayout
from mixer.runtime.lane_dataset import LaneDataset
from mixer.runtime.topology import lanes_served
from mixer.tokenize.encoding import use_worker_encoding_threads

log = logging.getLogger("mixer.loader")


@dataclass(frozen=True)
class RayWorkers:
    """Where the loader's lanes run: `actors` Ray actors of `cpus_per_actor` CPUs each
    (placed on nodes offering `resources`, e.g. `{"data_node": 1}`), each at most `in_flight`
    batches ahead; an actor's lanes survive `max_restarts` replacements of it.

    `address=None` joins the cluster `ray.init` already joined, else the one `RAY_ADDRESS`
    names, else starts a local one on 127.0.0.1."""

    actors: int
    cpus_per_actor: float = 1.0
    address: str | None = None
    resources: dict | None = None
    in_flight: int = 2
    max_restarts: int = 3

    def __post_init__(self) -> None:
        for name, low in (("actors", 1), ("in_flight", 1), ("max_restarts", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise TopologyError(
                    f"RayWorkers: {name} must be an integer >= {low}, got {value!r}"
                )
        cpus = self.cpus_per_actor
        if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not cpus >= 0:
            raise TopologyError(f"RayWorkers: cpus_per_actor must be a number >= 0, got {cpus!r}")
        if self.resources is not None and not isinstance(self.resources, dict):
            raise TopologyError(
                "RayWorkers: resources must be a dict of resource name → "
                f"amount, got {self.resources!r}"
            )


def connect(spec: RayWorkers) -> Any:
    """The `ray` module, joined to a cluster (see `RayWorkers`)."""
    import sys

    local = spec.address is None and not os.environ.get("RAY_ADDRESS")
    if local and "ray" not in sys.modules:
        # A cluster of this machine alone stays on the loopback address: Ray otherwise binds
        # the machine's outward address (it reads this before `import ray`).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if not ray.is_initialized():
        if spec.address is not None:
            ray.init(address=spec.address)
        elif os.environ.get("RAY_ADDRESS"):
            ray.init()
        else:
            ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1")
    return ray


# -- the actor's side ------------------------------------------------------------------------
def to_store(layout: BatchLayout, batch: Batch) -> dict[str, np.ndarray]:
    """A batch's arrays in their compact wire dtypes: numpy arrays travel through Ray's
    object store as buffers, not pickled element by element."""
    return {
        spec.key: np.ascontiguousarray(batch.arrays[spec.key], dtype=spec.wire)
        for spec in layout.specs
    }


def from_store(layout: BatchLayout, arrays: dict[str, np.ndarray], padding: bool) -> Batch:
    """The driver's own copy (in the user's dtypes) of arrays read from the object store."""
    return Batch({spec.key: arrays[spec.key].astype(spec.dtype) for spec in layout.specs}, padding)


class LaneActor:
    """One actor: the batches of worker `worker` of `workers`, a group of them per call."""

    def __init__(self, tokenizer_threads: int) -> None:
        use_worker_encoding_threads(1, tokenizer_threads)
        self._batches: Iterator | None = None

    def pid(self) -> int:
        return os.getpid()

    def start(self, dataset: LaneDataset, worker: int, workers: int) -> None:
        self.stop()
        self._batches = dataset.produce(worker, workers, to_store)

    def next(self, count: int) -> list[tuple[Any, dict]]:
        """The next `count` batches, fewer after an error item: one object in the store per
        call, since each object costs about a millisecond of each process (measured)."""
        assert self._batches is not None
        group: list[tuple[Any, dict]] = []
        for item in self._batches:
            group.append(item)
            if len(group) == count or "error" in item[1]:
                return group
        return group + [(None, {"end": True})]  # after an error item, already raised

    def stop(self) -> None:
        if self._batches is not None:
            self._batches.close()  # closes the lanes' readers
            self._batches = None


# -- the driver's side -----------------------------------------------------------------------
def plain(dataset: LaneDataset) -> LaneDataset:
    """`dataset` as a `LaneDataset`: a subclass's instance pickles with its class, and the
    loader's (a torch `IterableDataset`) would make each actor import torch."""
    work = LaneDataset.__new__(LaneDataset)
    work.__dict__.update(vars(dataset))
    return work


_pools: weakref.WeakSet[ActorPool] = weakref.WeakSet()
_hook: list[bool] = []


def _close_all() -> None:
    for pool in list(_pools):
        pool.close()


class ActorPool:
    """The actors of one iteration of a loader, reused when it restarts (set_weights)."""

    def __init__(self, spec: RayWorkers, layout: BatchLayout) -> None:
        self.ray = connect(spec)
        self.spec = spec
        self.layout = layout
        self._remote = self.ray.remote(LaneActor)
        self.actors = [self._spawn() for _ in range(spec.actors)]
        self.restarts = [0] * spec.actors
        if not _hook:
            atexit.register(_close_all)
            _hook.append(True)
        _pools.add(self)

    def _spawn(self) -> Any:
        options: dict[str, Any] = {"num_cpus": self.spec.cpus_per_actor, "max_restarts": 0}
        if self.spec.resources:
            options["resources"] = dict(self.spec.resources)
        threads = max(1, round(self.spec.cpus_per_actor))
        return self._remote.options(**options).remote(threads)

    def close(self) -> None:
        """End the actors (their lanes' readers with them)."""
        actors, self.actors = self.actors, []
        for actor in actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # already gone, or Ray shut down first
                pass

    def stream(self, dataset: LaneDataset) -> Iterator[tuple[Any, dict]]:
        """(batch, meta) for the dataset's steps in order, as a DataLoader would yield them."""
        count = len(self.actors)
        group = max(1, self.spec.in_flight // 2)  # batches per call
        calls = max(1, self.spec.in_flight // group)  # calls outstanding per actor
        pending: list[deque] = [deque() for _ in range(count)]  # their references
        ready: list[deque] = [deque() for _ in range(count)]  # batches received
        dataset = plain(dataset)
        states = dict(dataset.lane_states)  # each lane's latest state passed on
        shared = self.ray.put(dataset)
        for w, actor in enumerate(self.actors):
            actor.start.remote(shared, w, count)
        step = 0
        try:
            while True:
                w = step % count
                if not ready[w]:
                    while len(pending[w]) < calls:
                        pending[w].append(self.actors[w].next.remote(group))
                    try:
                        ready[w].extend(self.ray.get(pending[w].popleft()))
                    except self.ray.exceptions.RayActorError as exc:
                        pending[w].clear()
                        self._replace(w, exc, dataset, step, states)
                        continue
                    pending[w].append(self.actors[w].next.remote(group))
                data, meta = ready[w].popleft()
                if "lane" in meta:
                    states[meta["lane"]] = meta["state"]
                    data = from_store(self.layout, data, meta["padding"])
                yield data, meta  # the object store's copy is released with the group
                step += 1
        finally:
            for queue in pending + ready:
                queue.clear()

    def lanes_of(self, w: int, dataset: LaneDataset) -> list[int]:
        return lanes_served(
            dataset.recipe.lanes,
            dataset.start,
            dataset.rank,
            dataset.world_size,
            w,
            len(self.actors),
        )

    def _replace(
        self,
        w: int,
        exc: Exception,
        dataset: LaneDataset,
        step: int,
        states: dict[int, dict | None],
    ) -> None:
        """Actor `w` died before making `step`: a new one resumes its lanes there."""
        lanes = self.lanes_of(w, dataset)
        try:
            self.ray.kill(self.actors[w], no_restart=True)
        except Exception:
            pass
        self.restarts[w] += 1
        if self.restarts[w] > self.spec.max_restarts:
            raise MixerError(
                f"the Ray actor serving lane(s) {lanes} died {self.restarts[w]} times "
                f"(max_restarts={self.spec.max_restarts}); its last error: {exc}"
            ) from exc
        log.warning(
            "the Ray actor serving lane(s) %s died (%s); replacing it (%d of %d)",
            lanes,
            type(exc).__name__,
            self.restarts[w],
            self.spec.max_restarts,
        )
        restart = copy.copy(dataset)
        restart.lane_states = dict(states)
        # produce(w, ...) starts at start + w·W: shifted so that its first step is `step`.
        restart.start = dataset.start + (step - w) * dataset.world_size
        self.actors[w] = self._spawn()
        self.actors[w].start.remote(self.ray.put(restart), w, len(self.actors))
