"""The lanes as a torch `IterableDataset`: what the loader hands a DataLoader (or iterates
itself at num_workers 0), and the DataLoader's items back in global order.

A DataLoader worker sends text batches several at a time (`batches_per_item`): receiving an item
costs the loader's process ~130 µs of torch's machinery whatever its size, about what making a
text batch of 8 × 2048 costs, so one batch per item would leave workers no gain over num_workers
0 where batches are cheap (a warm token cache). A worker's items grow 1, 2, 4, ... up to that
count, so the first batch comes as soon as it is made."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from mixer.config.recipe import Recipe
from mixer.images.shared_pixels import use_allocator
from mixer.pipeline.batch import Batch, BatchLayout, Wire
from mixer.runtime import worker_processes
from mixer.runtime.lane_dataset import LaneDataset, Send
from mixer.runtime.pixel_slots import PixelSlots
from mixer.runtime.ring import BatchRing, InRing
from mixer.tokenize.backends import finish_preloads

PREFETCH = 2  # items each DataLoader worker makes ahead
ITEM_BYTES = 1 << 20  # text batches of a DataLoader item, by their wire bytes (at most)
MAX_ITEM_BATCHES = 8

Pair = tuple[Any, dict[str, Any]]  # (batch or its wire form, lane metadata)


def batches_per_item(recipe: Recipe, layout: BatchLayout) -> int:
    """How many batches a worker sends as one DataLoader item: text batches up to
    `ITEM_BYTES` together; image batches one by one (their decoding is ordered and bounded
    per batch: the pixel budget, the soonest-needed image first)."""
    if has_pixels(recipe):
        return 1
    return max(1, min(MAX_ITEM_BATCHES, ITEM_BYTES // layout.wire_bytes(recipe.batch_size)))


def has_pixels(recipe: Recipe) -> bool:
    """Whether the recipe's batches carry pixels (or audio features)."""
    return getattr(recipe, "images", None) is not None or getattr(recipe, "audio", None) is not None


class TorchLaneDataset(LaneDataset, IterableDataset):
    """Yields lists of (batch or its wire form, lane metadata): DataLoader worker w of N sends
    what `LaneDataset.produce(w, N, ...)` makes, `group` batches an item at most; without
    workers, `produce(0, 1, None)` pair by pair. With a `ring` (mapped before the workers
    fork), batches cross through its slots."""

    ring: BatchRing | None = None
    pixel_slots: PixelSlots | None = None
    group: int = 1

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is None:
            return self.produce(0, 1, None)
        send: Send = _wire if self.ring is None else functools.partial(self.ring.send, info.id)
        if self.pixel_slots is not None:
            use_allocator(functools.partial(self.pixel_slots.allocate, info.id))
            send = functools.partial(_with_pixel_slots, self.pixel_slots, send)
        return _grouped(self.produce(info.id, info.num_workers, send), self.group)


def worker_batches(dataset: TorchLaneDataset, layout: BatchLayout, num_workers: int) -> InOrder:
    """Start `num_workers` DataLoader workers (forked) on `dataset`; their batches in order."""
    finish_preloads()  # (a fork while a thread is inside fastokens could copy its locks held)
    dataset.group = batches_per_item(dataset.recipe, layout)
    dataset.ring = BatchRing.for_layout(
        layout, dataset.recipe.batch_size, num_workers, (PREFETCH + 2) * dataset.group
    )
    if has_pixels(dataset.recipe):
        dataset.pixel_slots = PixelSlots.for_workers(num_workers)
    with worker_processes.inherit_no_garbage():
        items = iter(
            DataLoader(
                dataset,
                batch_size=None,
                num_workers=num_workers,
                prefetch_factor=PREFETCH,
                multiprocessing_context="fork",
                worker_init_fn=worker_processes.init_fn(),
                collate_fn=sent_as_is,
            )
        )
    assert isinstance(items, _MultiProcessingDataLoaderIter)  # (num_workers > 0)
    worker_processes.adopt(items._workers)  # stopped at exit even if never closed
    for shared in (dataset.ring, dataset.pixel_slots):
        if shared is not None:
            shared.keep_from_later_forks()
    return InOrder(items, num_workers)


def _grouped(pairs: Iterator[Pair], most: int) -> Iterator[list[Pair]]:
    """Items of 1, 2, 4, ... up to `most` pairs. An exception out of `pairs` (not a data
    error: those come as pairs) is raised in the next item's place, after the pairs made
    before it went as one: the loader's process gets what num_workers 0 gets before it."""
    size = 1
    while True:
        group: list[Pair] = []
        try:
            for _ in range(size):
                group.append(next(pairs))
        except StopIteration:
            if group:
                yield group
            return
        except BaseException:
            if group:
                yield group
            raise
        yield group
        size = min(2 * size, most)


class InOrder:
    """The DataLoader's items as (batch, metadata) pairs in global order: worker w makes the
    steps w, w + N, w + 2N, ... and sends several as one item, so the loader's process takes
    each worker's batches in turn from what it has received."""

    def __init__(self, items: Iterator[list[Pair]], workers: int) -> None:
        self.items = items
        self.received: list[deque[Pair]] = [deque() for _ in range(workers)]
        self.turn = 0

    def __iter__(self) -> InOrder:
        return self

    def __next__(self) -> Pair:
        waiting = self.received[self.turn]
        while not waiting:
            group = next(self.items)
            self.received[group[0][1]["worker"]].extend(group)
        self.turn = (self.turn + 1) % len(self.received)
        return waiting.popleft()


def _wire(layout: BatchLayout, batch: Batch) -> Wire:
    return layout.to_wire(batch)


def _with_pixel_slots(
    slots: PixelSlots, send: Send, layout: BatchLayout, batch: Batch
) -> InRing | Wire:
    """`send`'s item, its pixels made in a slot sent as the slot's number."""
    item = send(layout, batch)
    slots.send(item.wire if isinstance(item, InRing) else item)
    return item


def sent_as_is(item: Any) -> Any:
    """DataLoader's `collate_fn`: a worker's items as they are (its default walks every
    item's metadata, lane state included, looking for arrays to turn into tensors)."""
    return item
