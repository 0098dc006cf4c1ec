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

An actor that dies, or delivers nothing for `stall_timeout` seconds while the driver waits on
it (a stopped process, a wedged read), is replaced, and its lanes restart from the latest lane
states the driver received (those of the batches handed out, or held back as padding), at the
step it was asked for: the stream is unchanged. An actor that is not running within
`placement_timeout` of its start (no node offers what it asks for) raises a `MixerError`
naming what it asked for and what the nodes offer. Actors are owned by the driver (not
detached), so Ray ends them when the driver's process dies; `close()` and an exit hook end
them sooner. Joining the cluster, and what signals do to a local one, is
`runtime/ray_cluster.py`.

How many actors run is the loader's (`resize_workers`, autoscaling): the pool starts or
ends actors to that count whenever the loader (re)starts the lanes on it.

`ray` is imported here only inside functions: `import mixer` never imports it.
"""

from __future__ import annotations

import atexit
import copy
import logging
import os
import time
import weakref
from collections import deque
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from mixer.core.errors import MixerError, TopologyError
from mixer.pipeline.batch import Batch, BatchLayout
from mixer.pipeline.lanes import LaneState
from mixer.runtime.lane_dataset import LaneDataset
from mixer.runtime.ray_cluster import connect
from mixer.runtime.topology import lanes_served
from mixer.tokenize.encoding import use_worker_encoding_threads

log = logging.getLogger("mixer.loader")


@dataclass(frozen=True)
class RayWorkers:
    """Where the loader's lanes run: `actors` Ray actors of `cpus_per_actor` CPUs each
    (placed on nodes offering `resources`, e.g. `{"data_node": 1}`), each at most `in_flight`
    batches ahead; an actor's lanes survive `max_restarts` replacements of it.

    `max_actors` above `actors` lets the loader grow the actors while the consumer waits
    (and shrink them back to `actors` while they idle). An actor that delivers nothing for
    `stall_timeout` seconds while the driver waits on it is replaced as if it had died; one
    not running `placement_timeout` seconds after its start raises a `MixerError`.

    `address=None` joins the cluster `ray.init` already joined, else the one `RAY_ADDRESS`
    names, else starts a local one on 127.0.0.1."""

    actors: int
    cpus_per_actor: float = 1.0
    address: str | None = None
    resources: dict | None = None
    in_flight: int = 2
    max_restarts: int = 3
    max_actors: int | None = None
    stall_timeout: float = 300.0
    placement_timeout: float = 120.0

    def __post_init__(self) -> None:
        for name, low in (("actors", 1), ("in_flight", 1), ("max_restarts", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise TopologyError(
                    f"RayWorkers: {name} must be an integer >= {low}, got {value!r}"
                )
        most = self.max_actors
        if most is not None and (
            isinstance(most, bool) or not isinstance(most, int) or most < self.actors
        ):
            raise TopologyError(
                f"RayWorkers: max_actors must be None or an integer >= actors = "
                f"{self.actors}, got {most!r}"
            )
        for name in ("cpus_per_actor", "stall_timeout", "placement_timeout"):
            value = getattr(self, name)
            low_ok = value >= 0 if name == "cpus_per_actor" else value > 0
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low_ok:
                bound = ">= 0" if name == "cpus_per_actor" else "> 0"
                raise TopologyError(f"RayWorkers: {name} must be a number {bound}, got {value!r}")
        if self.resources is not None and not isinstance(self.resources, dict):
            raise TopologyError(
                "RayWorkers: resources must be a dict of resource name → "
                f"amount, got {self.resources!r}"
            )

    def asks(self) -> dict[str, float]:
        """What each actor asks a node for."""
        return {"CPU": self.cpus_per_actor, **(self.resources or {})}


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

    def next(self, count: int) -> tuple[float, list[tuple[Any, dict]]]:
        """The seconds spent making them, and the next `count` batches, fewer after an error
        item: one object in the store per call, since each object costs about a millisecond
        of each process (measured)."""
        assert self._batches is not None
        began = time.perf_counter()
        group: list[tuple[Any, dict]] = []
        for item in self._batches:
            group.append(item)
            if len(group) == count or "error" in item[1]:
                return time.perf_counter() - began, group
        # after an error item, already raised
        return time.perf_counter() - began, group + [(None, {"end": True})]

    def stop(self) -> None:
        if self._batches is not None:
            cast(Generator, self._batches).close()  # closes the lanes' readers
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
    """The actors of one iteration of a loader, reused when it restarts the lanes on them
    (set_weights, load_state_dict, a resize)."""

    def __init__(self, spec: RayWorkers, layout: BatchLayout) -> None:
        self.ray = connect(spec.address)
        self.spec = spec
        self.layout = layout
        self._remote = self.ray.remote(LaneActor)
        self.actors: list[Any] = []
        self.restarts: list[int] = []
        self.busy_s = 0.0  # seconds the actors spent making the batches received
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

    def _started(self, actors: list[Any]) -> list[Any]:
        """`actors` once each runs (its first call answered), or a `MixerError` naming what
        they ask for and what the nodes offer when one is not within placement_timeout."""
        calls = [actor.pid.remote() for actor in actors]
        timeout = self.spec.placement_timeout
        done, _ = self.ray.wait(calls, num_returns=len(calls), timeout=timeout)
        if len(done) == len(calls):
            self.ray.get(done)  # an actor that failed to start raises its error here
            return actors
        for actor in actors:
            self._kill(actor)
        raise MixerError(
            f"{len(calls) - len(done)} of {len(calls)} Ray actor(s) were not running "
            f"{timeout:g} s after their start (placement_timeout): each asks for "
            f"{_resources(self.spec.asks())}; the cluster's live nodes offer "
            f"{_offers(self.ray.nodes())}; add a node offering that, or ask for less "
            "(RayWorkers cpus_per_actor, resources, actors)"
        )

    def _fit(self, count: int) -> None:
        """Start or end actors so that `count` run."""
        while len(self.actors) > count:
            self._kill(self.actors.pop())
            self.restarts.pop()
        if len(self.actors) < count:
            self.actors += self._started([self._spawn() for _ in range(count - len(self.actors))])
            self.restarts += [0] * (count - len(self.restarts))

    def _kill(self, actor: Any) -> None:
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:  # already gone, or Ray shut down first
            pass

    def close(self) -> None:
        """End the actors (their lanes' readers with them)."""
        actors, self.actors = self.actors, []
        for actor in actors:
            self._kill(actor)

    def stream(self, dataset: LaneDataset, count: int) -> Iterator[tuple[Any, dict]]:
        """(batch, meta) for the dataset's steps in order, as `count` DataLoader workers
        would yield them."""
        self._fit(count)
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
                    began = time.monotonic()
                    try:
                        busy, items = self.ray.get(
                            pending[w].popleft(), timeout=self.spec.stall_timeout
                        )
                    except self.ray.exceptions.RayActorError as exc:
                        pending[w].clear()
                        self._replace(w, exc, dataset, step, states)
                        continue
                    except self.ray.exceptions.GetTimeoutError as exc:
                        pending[w].clear()
                        self._replace(w, exc, dataset, step, states, time.monotonic() - began)
                        continue
                    self.busy_s += busy
                    ready[w].extend(items)
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
        states: dict[int, LaneState | None],
        stalled_s: float | None = None,
    ) -> None:
        """Actor `w` died (or stalled `stalled_s` seconds) before making `step`: a new one
        resumes its lanes there."""
        lanes = self.lanes_of(w, dataset)
        self._kill(self.actors[w])
        self.restarts[w] += 1
        if self.restarts[w] > self.spec.max_restarts:
            limit = f"max_restarts={self.spec.max_restarts}"
            if stalled_s is None:
                message = f"died {self.restarts[w]} times ({limit}); its last error: {exc}"
            else:
                message = (
                    f"was lost {self.restarts[w]} times ({limit}); the last time it delivered "
                    f"nothing for {stalled_s:.1f} s (stall_timeout={self.spec.stall_timeout:g})"
                )
            raise MixerError(f"the Ray actor serving lane(s) {lanes} {message}") from exc
        if stalled_s is None:
            log.warning(
                "the Ray actor serving lane(s) %s died (%s); replacing it (%d of %d)",
                lanes,
                type(exc).__name__,
                self.restarts[w],
                self.spec.max_restarts,
            )
        else:
            log.warning(
                "the Ray actor serving lane(s) %s delivered nothing for %.1f s while the "
                "loader waited on it (stall_timeout=%g s); killing and replacing it (%d of %d)",
                lanes,
                stalled_s,
                self.spec.stall_timeout,
                self.restarts[w],
                self.spec.max_restarts,
            )
        restart = copy.copy(dataset)
        restart.lane_states = dict(states)
        # produce(w, ...) starts at start + w·W: shifted so that its first step is `step`.
        restart.start = dataset.start + (step - w) * dataset.world_size
        (self.actors[w],) = self._started([self._spawn()])
        self.actors[w].start.remote(self.ray.put(restart), w, len(self.actors))


def _resources(amounts: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k!r}: {v:g}" for k, v in sorted(amounts.items())) + "}"


def _offers(nodes: list[dict]) -> str:
    """Each live node's address and resources (its memory and per-node labels left out)."""
    skip = ("memory", "object_store_memory")
    shown = [
        f"{node.get('NodeManagerAddress', '?')} "
        + _resources(
            {
                k: v
                for k, v in node.get("Resources", {}).items()
                if k not in skip and not k.startswith("node:") and not k.startswith("accelerator")
            }
        )
        for node in nodes
        if node.get("Alive")
    ]
    return "; ".join(shown) or "nothing (no live node)"
