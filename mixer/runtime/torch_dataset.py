"""The lanes as a torch `IterableDataset`: what the loader hands a DataLoader (or iterates
itself at num_workers 0)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from mixer.pipeline.batch import Batch, BatchLayout, Wire
from mixer.runtime.lane_dataset import LaneDataset
from mixer.runtime.ring import BatchRing


class TorchLaneDataset(LaneDataset, IterableDataset):
    """Yields (batch or its wire form, lane metadata): DataLoader worker w of N produces what
    `LaneDataset.produce(w, N, ...)` does; without workers, `produce(0, 1, None)`. With a
    `ring` (mapped before the workers fork), batches cross through its slots."""

    ring: BatchRing | None = None

    def __iter__(self) -> Iterator[tuple[Any, dict[str, Any]]]:
        info = get_worker_info()
        if info is None:
            return self.produce(0, 1, None)
        if self.ring is None:
            return self.produce(info.id, info.num_workers, _wire)
        return self.produce(info.id, info.num_workers,
                            functools.partial(self.ring.send, info.id))


def _wire(layout: BatchLayout, batch: Batch) -> Wire:
    return layout.to_wire(batch)


def sent_as_is(item: Any) -> Any:
    """DataLoader's `collate_fn`: a worker's (wire, meta) as it is (its default walks every
    item's metadata, lane state included, looking for arrays to turn into tensors)."""
    return item
