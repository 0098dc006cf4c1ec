"""The loader's profile of one iteration: busy seconds per stage over all its processes, the
consumer's waits inside `next()`, and the bottleneck named from the two (`loader.metrics()`'s
`"stages"`, `"wait"` and `"bottleneck"`).

Each process that makes batches (the loader's own at num_workers 0, each DataLoader worker,
each Ray actor) attaches its stage seconds since its iteration began to every batch's
metadata; the loader keeps the latest of each worker, plus the transfer seconds of its own
process (taking a batch out of the ring, making the user's tensors). Waits are kept as counts
in logarithmic buckets (2 % wide), so percentiles cost nothing per batch and add up over
ranks.
"""

from __future__ import annotations

import math
from time import perf_counter
from typing import Any

from mixer.core.stages import STAGES, TRANSFER

KEEPS_UP = 0.05  # the consumer waits at most this share of its time: the loader keeps up
_BUCKET = math.log(1.02)
_FLOOR = 1e-6  # waits below a microsecond share the first bucket


class WaitClock:
    """The consumer's side: the time between its call of `next()` and the batch."""

    def __init__(self) -> None:
        self.first_s = 0.0
        self.batches = 0  # after the first
        self.wait_s = 0.0
        self.buckets: dict[int, int] = {}
        self._called: float | None = None
        self._first_at: float | None = None
        self._latest_at = 0.0

    def called(self) -> None:
        """The consumer asked for the next batch (the iteration began, or it came back)."""
        self._called = perf_counter()

    def handed(self) -> None:
        """The batch asked for is handed over now."""
        now = perf_counter()
        waited = now - (self._called if self._called is not None else now)
        self._called = None
        if self._first_at is None:
            self._first_at = now
            self.first_s = waited
        else:
            self.batches += 1
            self.wait_s += waited
            bucket = 0 if waited <= _FLOOR else int(math.log(waited / _FLOOR) / _BUCKET) + 1
            self.buckets[bucket] = self.buckets.get(bucket, 0) + 1
        self._latest_at = now

    @property
    def handed_count(self) -> int:
        """Batches handed over so far, the first included."""
        return self.batches + (self._first_at is not None)

    @property
    def latest_at(self) -> float:
        """When the latest batch was handed over (`perf_counter` seconds)."""
        return self._latest_at

    @property
    def wall_s(self) -> float:
        """Seconds between the first and the latest batch."""
        return 0.0 if self._first_at is None else self._latest_at - self._first_at

    def raw(self) -> dict[str, Any]:
        """What `wait_figures` needs, summable over ranks."""
        return {
            "batches": self.batches,
            "wait_s": self.wait_s,
            "wall_s": self.wall_s,
            "first_s": self.first_s,
            "buckets": dict(self.buckets),
        }


def wait_figures(raw: dict[str, Any]) -> dict[str, Any]:
    """`metrics()["wait"]` from `WaitClock.raw()` (one rank's, or their sum)."""
    wall = raw["wall_s"]
    return {
        "batches": raw["batches"],
        "wait_s": raw["wait_s"],
        "share": raw["wait_s"] / wall if wall > 0 else 0.0,
        "p50_ms": _percentile(raw["buckets"], 0.50) * 1e3,
        "p99_ms": _percentile(raw["buckets"], 0.99) * 1e3,
        "first_s": raw["first_s"],
    }


def _percentile(buckets: dict[int, int], q: float) -> float:
    total = sum(buckets.values())
    if not total:
        return 0.0
    rank = max(1, math.ceil(q * total))
    seen = 0
    for bucket in sorted(buckets):
        seen += buckets[bucket]
        if seen >= rank:
            # the bucket's middle (its range is [FLOOR·r^(b-1), FLOOR·r^b))
            return 0.0 if bucket == 0 else _FLOOR * math.exp((bucket - 0.5) * _BUCKET)
    return 0.0


class StageTotals:
    """Busy seconds per stage of an iteration, over the processes that work for it."""

    def __init__(self) -> None:
        self._latest: dict[int, list[float]] = {}  # per worker, since its start
        self._done = [0.0] * len(STAGES)  # workers that started again (a restart)
        self.own_transfer = 0.0  # the loader's process handing batches to the caller

    def worker(self, worker: int, stages: list[float] | None) -> None:
        """A batch's metadata came with its worker's seconds so far."""
        if stages is None:
            return
        before = self._latest.get(worker)
        if before is not None and sum(stages) < sum(before):  # it started again
            self._done = [d + b for d, b in zip(self._done, before)]
        self._latest[worker] = stages

    def restart(self) -> None:
        """The workers start again (new weights, a loaded state): keep what they did."""
        for before in self._latest.values():
            self._done = [d + b for d, b in zip(self._done, before)]
        self._latest.clear()

    def busy(self) -> list[float]:
        total = list(self._done)
        for stages in self._latest.values():
            total = [t + s for t, s in zip(total, stages)]
        total[TRANSFER] += self.own_transfer
        return total


def stage_figures(busy: list[float]) -> dict[str, dict[str, float]]:
    """`metrics()["stages"]`: each stage's busy seconds and share of their sum."""
    total = sum(busy)
    return {
        name: {"busy_s": seconds, "share": seconds / total if total > 0 else 0.0}
        for name, seconds in zip(STAGES, busy)
    }


def bottleneck(stages: dict[str, dict[str, float]], wait: dict[str, Any]) -> str:
    """`"trainer"` while the consumer waits at most `KEEPS_UP` of its time, else the stage
    with the most busy seconds."""
    if wait["share"] <= KEEPS_UP or not any(s["busy_s"] > 0 for s in stages.values()):
        return "trainer"
    return max(STAGES, key=lambda name: stages[name]["busy_s"])


def profile_raw(stages: StageTotals, wait: WaitClock) -> dict[str, Any]:
    """One rank's profile as plain data that adds up over ranks (`sum_profiles`)."""
    return {"busy": stages.busy(), "wait": wait.raw()}


def sum_profiles(raws: list[dict[str, Any]]) -> dict[str, Any]:
    """The ranks' profiles together: seconds, counts and wait buckets add up; the first
    batch's wait is the slowest rank's."""
    busy = [sum(r["busy"][i] for r in raws) for i in range(len(STAGES))]
    buckets: dict[int, int] = {}
    for r in raws:
        for bucket, n in r["wait"]["buckets"].items():
            buckets[int(bucket)] = buckets.get(int(bucket), 0) + n
    wait = {
        "batches": sum(r["wait"]["batches"] for r in raws),
        "wait_s": sum(r["wait"]["wait_s"] for r in raws),
        "wall_s": sum(r["wait"]["wall_s"] for r in raws),
        "first_s": max(r["wait"]["first_s"] for r in raws),
        "buckets": buckets,
    }
    return {"busy": busy, "wait": wait}


def profile_metrics(raw: dict[str, Any]) -> dict[str, Any]:
    """The `"stages"`, `"wait"` and `"bottleneck"` keys of `metrics()`."""
    stages = stage_figures(raw["busy"])
    wait = wait_figures(raw["wait"])
    return {"stages": stages, "wait": wait, "bottleneck": bottleneck(stages, wait)}
