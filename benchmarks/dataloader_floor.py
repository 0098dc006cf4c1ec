"""What receiving one item from DataLoader workers costs the main process, in CPU.

    python benchmarks/dataloader_floor.py [--items 3000] [--workers 2]

Two workers hand over the same ready item again and again: a tiny one (DataLoader's own
cost per item) and a text batch of `peers.py`'s shape in mixer's wire format (8 × 2048, four
int32 arrays in one 256 KB buffer, plus a lane state), received as mixer receives it
(`from_wire`, `to_torch`). With a warm token cache, a batch costs less to make in-process
than this to receive (docs/benchmarks/dataloader_floor.md).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch  # noqa: F401  (imported before timing: `to_torch` would import it in the loop)
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from mixer.pipeline.batch import Batch, BatchLayout, Wire
from mixer.runtime.ring import BatchRing, InRing

LAYOUT = BatchLayout(seq_len=2048, pad_id=0)
STATE = {
    "v": 2,
    "sources": {
        name: {
            "tokens": 1,
            "mix": 2,
            "deficit": 3,
            "documents": 4,
            "skipped": 0,
            "epochs": 0.1,
            "packer": {"stream": dict.fromkeys("abcdefgh", 1), "offset": 0, "exhausted": 0},
        }
        for name in ("prose", "code", "web")
    },
}
META = {"g": 0, "lane": 0, "padding": False, "state": STATE, "worker": 0, "io": {}}


class _Same(IterableDataset):
    def __init__(self, item: Any, ring: BatchRing | None = None) -> None:
        self.item = item
        self.ring = ring

    def __iter__(self) -> Iterator[Any]:
        worker = get_worker_info().id
        while True:
            data, meta = self.item
            if self.ring is not None:  # as mixer's workers do: the batch written into a slot
                data = self.ring.send(worker, LAYOUT, data)
            yield data, meta


def _as_is(item: Any) -> Any:
    return item


def main_cpu_per_item(item: Any, items: int, workers: int, ring: bool = False) -> float:
    """µs of the main process's CPU per item received (after 50 items of warm-up)."""
    slots = BatchRing.for_layout(LAYOUT, 8, workers, 4) if ring else None
    it = iter(
        DataLoader(
            _Same(item, slots),
            batch_size=None,
            num_workers=workers,
            prefetch_factor=2,
            multiprocessing_context="fork",
            collate_fn=_as_is,
        )
    )
    in_ring = 0

    def receive() -> None:
        nonlocal in_ring
        data, _ = next(it)
        if isinstance(data, InRing):
            in_ring += 1
            LAYOUT.to_torch(slots.take(data, lambda w: LAYOUT.from_wire(w, False)))
        elif isinstance(data, Wire):
            LAYOUT.to_torch(LAYOUT.from_wire(data, False))

    for _ in range(50):
        receive()
    start = time.process_time()
    for _ in range(items):
        receive()
    if ring:
        print(f"  ({in_ring} of {items + 50} items came through the ring)")
    return (time.process_time() - start) / items * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    arrays = {key: rng.integers(0, 32000, (8, 2048)) for key in LAYOUT.keys}
    wire = LAYOUT.to_wire(Batch(arrays, False))
    tiny = main_cpu_per_item((0, META), args.items, args.workers)
    batch = main_cpu_per_item((wire, META), args.items, args.workers)
    ring = main_cpu_per_item((Batch(arrays, False), META), args.items, args.workers, ring=True)
    print(
        f"main process CPU per item, {args.workers} workers: tiny item {tiny:.0f} µs; "
        f"text batch ({len(wire.data) >> 10} KB) through the pipe {batch:.0f} µs, "
        f"through the shared-memory ring {ring:.0f} µs"
    )


if __name__ == "__main__":
    main()
