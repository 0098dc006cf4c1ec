"""Which part of a source each lane reads in each epoch.

Epoch e of a source permutes its splits with a key of (seed, source name, e) and deals them
to lanes greedily by size. A source with fewer splits than lanes is *striped*: the lanes that
share a split read all of it and each keeps every m-th record. Either way the lanes' slices of
one epoch partition the source.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

from mixer.core.records import Split
from mixer.core.rng import derive_key, permutation


@dataclass(frozen=True)
class SliceItem:
    """A split a lane reads, keeping records whose index % stride == phase."""

    split: int
    stride: int = 1
    phase: int = 0


def _size(split: Split) -> int:
    return split.records if split.records >= 0 else max(split.end - split.start, 1)


def stripe(lane: int, lanes: int, splits: int) -> tuple[int, int]:
    """(stride, phase) of `lane` where `splits` < `lanes`: the lane reads the split dealt to
    position lane mod splits, shared by `stride` lanes, and keeps its records whose index
    mod stride is the phase, lane div splits."""
    return len(range(lane % splits, lanes, splits)), lane // splits


@lru_cache(maxsize=64)
def _deal(
    splits: tuple[Split, ...], seed: int, source: str, epoch: int, lanes: int
) -> tuple[tuple[SliceItem, ...], ...]:
    order = permutation(len(splits), derive_key(seed, "splits", source, epoch))
    if len(splits) < lanes:
        return tuple(
            (SliceItem(order[lane % len(splits)], *stripe(lane, lanes, len(splits))),)
            for lane in range(lanes)
        )
    assigned: list[list[SliceItem]] = [[] for _ in range(lanes)]
    heap = [(0, lane) for lane in range(lanes)]
    for index in order:
        load, lane = heapq.heappop(heap)
        assigned[lane].append(SliceItem(index))
        heapq.heappush(heap, (load + _size(splits[index]), lane))
    return tuple(tuple(items) for items in assigned)


def lane_slice(
    splits: tuple[Split, ...], *, seed: int, source: str, epoch: int, lanes: int, lane: int
) -> tuple[SliceItem, ...]:
    """The ordered splits (with stripes) that `lane` reads in `epoch` of `source`."""
    return _deal(splits, seed, source, epoch, lanes)[lane]


def read_amplification(num_splits: int, lanes: int) -> float:
    """How many times each byte of a source is read per epoch (1.0 unless striped)."""
    return lanes / num_splits if num_splits < lanes else 1.0
