"""Batch pixels made in shared memory, so that they cross from a DataLoader worker to the
loader's process without a copy.

A worker's batch leaves through torch's multiprocessing queue, which moves each tensor's
storage into shared memory: a fresh segment and a copy of the pixels (about 1 ms per 1 MB;
an image batch carries tens of MB). Made in a shared segment from the start (`new_pixels`),
the batch's pixels are written once, where the loader's process maps them, and the queue
sends only the segment's descriptor. DataLoader workers turn this on (`make_in_shared_memory`,
called by the workers' init function); the loader's own process, Ray actors and forked
children of a worker make plain arrays. A worker given an allocator (`use_allocator`: the
loader's reused pixel slots, `runtime/pixel_slots.py`) makes them there first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from mixer.pipeline.batch import SHARED_BYTES

_pid = [0]  # the process that asked for shared pixels (not its forked children)
Allocator = Callable[[int], "np.ndarray | None"]  # bytes wanted → writable bytes, or None
_allocator: list[Allocator | None] = [None]


def make_in_shared_memory() -> None:
    """Make this process's batch pixels (of at least `SHARED_BYTES`) in shared memory."""
    _pid[0] = os.getpid()


def use_allocator(allocate: Allocator | None) -> None:
    """In a process that makes shared pixels: where `new_pixels` makes them first."""
    _allocator[0] = allocate


def new_pixels(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialized float32 array of `shape`: in a process that asked for shared pixels,
    in the bytes its allocator gives or else a view of a shared torch tensor (see
    `shared_tensor`); a plain array elsewhere."""
    count = int(np.prod(shape, dtype=np.int64))
    if _pid[0] != os.getpid() or count * 4 < SHARED_BYTES:
        return np.empty(shape, dtype=np.float32)
    allocate = _allocator[0]
    if allocate is not None:
        place = allocate(count * 4)
        if place is not None:
            return place.view(np.float32).reshape(shape)
    import torch  # (only in DataLoader workers, which have it loaded)

    storage = torch.UntypedStorage._new_shared(count * 4)
    stride = [1] * len(shape)  # (contiguous)
    for i in range(len(shape) - 2, -1, -1):
        stride[i] = stride[i + 1] * shape[i + 1]
    return torch.empty(0, dtype=torch.float32).set_(storage, 0, shape, stride).numpy()


def shared_tensor(array: np.ndarray) -> Any:
    """The shared torch tensor `array` views (made by `new_pixels`), or None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    base: Any = array.base
    if (
        not isinstance(base, torch.Tensor)
        or not base.is_shared()
        or base.data_ptr() != array.ctypes.data
        or tuple(base.shape) != array.shape
    ):
        return None
    return base
