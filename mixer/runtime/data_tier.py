"""The data tier of a loader: the Ray actors its lanes run on (how many, resized by hand or by
the autoscaler) and the pool of the running iteration, or the DataLoader workers' count."""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator
from typing import Any, TypeVar

from mixer.core.errors import MixerError, TopologyError
from mixer.pipeline.batch import BatchLayout
from mixer.runtime.autoscale import Autoscaler, Change
from mixer.runtime.profile import WaitClock
from mixer.runtime.ray_workers import ActorPool, RayWorkers
from mixer.runtime.topology import check_topology, valid_workers
from mixer.runtime.torch_dataset import TorchLaneDataset

log = logging.getLogger("mixer.loader")
T = TypeVar("T")


class DataTier:
    """Which processes make a loader's batches, and how many of them run."""

    def __init__(
        self, spec: RayWorkers | None, lanes: int, world_size: int, num_workers: int
    ) -> None:
        self.spec = spec
        self.lanes, self.world_size, self.num_workers = lanes, world_size, num_workers
        self.actors = spec.actors if spec is not None else 0  # Ray actors to run
        self.resizes = 0
        self.pool: ActorPool | None = None  # while iterating on Ray actors

    def check_resize(self, actors: object) -> int:
        """`actors` as `Loader.resize_workers` accepts it, or the error saying why not."""
        if self.spec is None:
            raise MixerError(
                "resize_workers needs a loader built with workers=mixer.RayWorkers(...): "
                f"DataLoader workers (num_workers={self.num_workers}) are fixed for an "
                "iteration; to change their count, build a loader with another num_workers "
                "and load this one's state_dict() into it"
            )
        if isinstance(actors, bool) or not isinstance(actors, int) or actors < 1:
            raise TopologyError(
                f"resize_workers: actors must be an integer >= 1, got {actors!r}; valid "
                f"actors for world_size {self.world_size}: "
                f"{valid_workers(self.lanes, self.world_size)}"
            )
        check_topology(self.lanes, self.world_size, actors, what="actors")
        return actors

    def resize(self, actors: int, why: str) -> bool:
        """Run `actors` actors from now on; True when an iteration is running on the old
        count (its lanes must restart on the new one)."""
        if actors == self.actors:
            return False
        log.info("Ray actors %d → %d (%s)", self.actors, actors, why)
        self.actors = actors
        self.resizes += 1
        return self.pool is not None

    def start(self, layout: BatchLayout, wait: WaitClock) -> Autoscaler | None:
        """At an iteration's start: the actor pool (Ray actors live as long as the
        iteration), and the autoscaler when `max_actors` allows one."""
        spec = self.spec
        if spec is None:
            return None
        self.pool = ActorPool(spec, layout)
        if spec.max_actors is None or spec.max_actors <= spec.actors:
            return None
        counts = valid_workers(self.lanes, self.world_size)
        allowed = [c for c in counts if spec.actors <= c <= spec.max_actors]
        return Autoscaler(allowed, spec.in_flight, wait)

    def stop(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def stream(self, dataset: TorchLaneDataset) -> Iterator[tuple[Any, dict]]:
        """The running pool's (batch, meta) of `dataset`'s lanes on the current count."""
        assert self.pool is not None
        return self.pool.stream(dataset, self.actors)

    def scaled(
        self,
        batches: Generator[T, None, bool],
        scaler: Autoscaler,
        restart: Callable[[], None],
    ) -> Generator[T, None, bool]:
        """`batches`, with the actors resized by `scaler` between batches (from the waits the
        profile's clock measured; `restart` when the count changed); returns what `batches`
        returns."""
        try:
            while True:
                try:
                    batch = next(batches)
                except StopIteration as end:
                    return end.value
                assert self.pool is not None
                change = scaler.decide(self.actors, self.pool.busy_s)
                if change is not None and self.resize(change.to, _why(change)):
                    restart()
                yield batch
        finally:
            batches.close()

    def metrics(self) -> dict[str, Any]:
        """`metrics()["workers"]`: the kind, the count running and the resizes."""
        if self.spec is not None:
            return {"kind": "ray", "count": self.actors, "resizes": self.resizes}
        if self.num_workers:
            return {"kind": "dataloader", "count": self.num_workers, "resizes": 0}
        return {"kind": "none", "count": 0, "resizes": 0}


def _why(change: Change) -> str:
    return (
        f"the consumer waited {change.wait_share:.1%} of the last {change.window_s:.1f} s, "
        f"the actors idled {change.idle_share:.0%}"
    )
