"""The topology rules, in one place: which global batch a rank's step is and which lane makes
it (`global_batch`, `lane_of`), which lanes a rank or one of its workers serves
(`lanes_served`); sane ranks, world sizes and worker counts, and the lanes rule (workers ×
ranks divide the lanes).

Rank r at step s of an iteration that began at global batch g0 consumes g = g0 + s·W + r,
made by lane g mod P. Worker w of N (DataLoader worker or Ray actor) makes the rank's steps
w, w + N, w + 2N, ...: the lanes rule N·W | P gives each worker P / (N·W) lanes of its own."""

from __future__ import annotations

from mixer.core.errors import TopologyError

MAX_WORLD_SIZE = 1 << 20
MAX_WORKERS = 1024


def global_batch(start: int, step: int, rank: int, world_size: int) -> int:
    """The global batch that rank `rank` consumes at `step` of an iteration begun at `start`."""
    return start + step * world_size + rank


def lane_of(g: int, lanes: int) -> int:
    """The lane that makes global batch `g`."""
    return g % lanes


def lanes_served(
    lanes: int, start: int, rank: int, world_size: int, worker: int = 0, workers: int = 1
) -> list[int]:
    """The lanes (sorted) whose batches worker `worker` of `workers` of rank `rank` makes from
    `start` on (worker 0 of 1: all the rank's lanes), within the lanes rule."""
    steps = range(worker, lanes // world_size, max(workers, 1))
    return sorted({lane_of(global_batch(start, s, rank, world_size), lanes) for s in steps})


def check_ranks(rank: int, world_size: int, num_workers: int) -> None:
    """Refuse a rank, world size or worker count that is not a sane integer, naming it."""
    for name, value, low, high in (
        ("world_size", world_size, 1, MAX_WORLD_SIZE),
        ("num_workers", num_workers, 0, MAX_WORKERS),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise TopologyError(f"{name} must be an integer from {low} to {high:,}, got {value!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise TopologyError(
            f"rank must be an integer from 0 to world_size - 1 = {world_size - 1}, got {rank!r}"
        )


def fits(lanes: int, world_size: int, num_workers: int) -> bool:
    """The lanes rule: workers (0 counts as 1) × ranks divide the lanes."""
    return lanes % (max(num_workers, 1) * world_size) == 0


def valid_workers(lanes: int, world_size: int) -> list[int]:
    """The worker counts that fit `lanes` on `world_size` ranks."""
    return [n for n in range(1, lanes + 1) if fits(lanes, world_size, n)]


def check_workers(
    lanes: int, rank: int, world_size: int, num_workers: int, ray_workers: object | None
) -> None:
    """The loader's checks: sane ranks, and the lanes rule for its DataLoader workers, or
    for its Ray actors (`RayWorkers`: `actors` in place of `num_workers`, which must be 0)."""
    check_ranks(rank, world_size, num_workers)
    if ray_workers is None:
        check_topology(lanes, world_size, num_workers)
        return
    if num_workers:
        raise TopologyError(
            f"num_workers={num_workers} with workers=RayWorkers(...): the "
            "Ray actors are the workers; set num_workers=0"
        )
    check_topology(lanes, world_size, ray_workers.actors, what="actors")  # type: ignore


def check_topology(
    lanes: int, world_size: int, num_workers: int, what: str = "num_workers"
) -> None:
    """Refuse a topology whose workers × ranks do not divide the lanes, listing valid values."""
    workers = max(num_workers, 1)
    if fits(lanes, world_size, num_workers):
        return
    valid_workers_ = valid_workers(lanes, world_size)
    valid_lanes = [workers * world_size * k for k in range(1, 5)]
    raise TopologyError(
        f"lanes={lanes} is not divisible by {what} × world_size = {workers} × "
        f"{world_size}; valid {what} for world_size {world_size}: "
        f"{valid_workers_ or 'none (lanes must be a multiple of world_size)'} (0 counts as 1); "
        f"or set lanes to a multiple of {workers * world_size}, e.g. {valid_lanes}"
    )
