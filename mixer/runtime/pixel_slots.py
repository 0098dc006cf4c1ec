"""Reused shared-memory slots for the pixels of image (and audio) batches made by DataLoader
workers.

A batch's pixels are tens of MB. Made in a fresh shared segment for every batch, they cost
the loader's process, per batch, the page faults of a new mapping and, when the caller drops
the batch, the unmapping and freeing of the segment's pages (about 15 ms for 75 MB, 30 ms
for 128 MB) — inside the caller's `next()` or its step. So the slots are mapped once, before
the workers fork (anonymous shared memory, like the batch ring): a worker makes a batch's
pixels straight in a free slot of its own (`images.shared_pixels.use_allocator`), sends the
slot's number, and the loader's process hands the caller a tensor over the slot; the slot is
free again once nothing views that tensor any more. Pages stay mapped in both processes from
one batch to the next: no faults, nothing to free.

Each slot has a flag: 0 free, 1 taken. A worker takes only a free slot of its own; the
loader's process clears the flag when the caller's last view of the pixels is gone. A batch
whose pixels do not fit a slot, or a worker whose slots are all taken (a caller that keeps
batches), makes them in a fresh segment as before, so a worker never waits on the slots.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mixer.pipeline.batch import Wire
from mixer.runtime.ring import PAGE, SharedPages, log

if TYPE_CHECKING:
    import torch

SLOT_BYTES = 256 << 20  # address space a slot reserves; pages are made only where written
SLOTS = 4  # per worker: the items it has ahead (PREFETCH), the one it makes, the caller's


@dataclass
class InSlot:
    """Pixels waiting in slot `slot`: `shape` float32 values from its start."""

    slot: int
    shape: tuple[int, ...]


class PixelSlots:
    """`slots` slots of `slot_bytes` for each of `workers` workers, in one shared mapping."""

    def __init__(self, workers: int, slots: int = SLOTS, slot_bytes: int = SLOT_BYTES) -> None:
        self.slots = slots
        self.slot_bytes = -(-slot_bytes // PAGE) * PAGE
        count = workers * slots
        flags_bytes = -(-count // PAGE) * PAGE
        self._memory = SharedPages(flags_bytes + count * self.slot_bytes)
        self._flags = np.frombuffer(self._memory.view, dtype=np.uint8, count=count)
        self._data = np.frombuffer(self._memory.view, dtype=np.uint8, offset=flags_bytes)
        self._start = self._data.ctypes.data
        self._unsent: list[int] = []  # (a worker's own, after the fork)

    @classmethod
    def for_workers(cls, workers: int) -> PixelSlots | None:
        """Slots for `workers` workers, or None where the system will not map them (then the
        pixels cross in a fresh segment a batch)."""
        try:
            return cls(workers)
        except (OSError, ValueError, OverflowError) as exc:
            log.warning(
                "no shared-memory slots for the workers' pixels (%d workers x %d slots: "
                "%s); each batch's pixels cross in a segment of their own",
                workers,
                SLOTS,
                exc,
            )
            return None

    def keep_from_later_forks(self) -> None:
        self._memory.keep_from_later_forks()

    # -- in a worker --------------------------------------------------------------------------
    def allocate(self, worker: int, nbytes: int) -> np.ndarray | None:
        """Writable bytes in a free slot of worker `worker`, taken now; None when none is free
        or `nbytes` does not fit."""
        if nbytes > self.slot_bytes:
            return None
        first = worker * self.slots
        for slot in range(first, first + self.slots):
            if not self._flags[slot]:
                self._flags[slot] = 1
                self._unsent.append(slot)
                start = slot * self.slot_bytes
                return self._data[start : start + nbytes]
        return None

    def send(self, wire: Wire) -> Wire:
        """The wire with its tensors made in a slot replaced by their `InSlot`; slots taken
        for pixels that this batch does not carry (dropped, or copied) are free again."""
        for key, tensor in list(wire.tensors.items()):
            slot = self._slot_of(tensor)
            if slot is not None:
                wire.tensors[key] = InSlot(slot, tuple(tensor.shape))  # type: ignore[assignment]
        sent = {t.slot for t in wire.tensors.values() if isinstance(t, InSlot)}
        for slot in self._unsent:
            if slot not in sent:
                self._flags[slot] = 0
        self._unsent = []
        return wire

    def _slot_of(self, tensor: torch.Tensor) -> int | None:
        offset = tensor.data_ptr() - self._start
        if offset < 0 or offset >= len(self._data) or offset % self.slot_bytes:
            return None
        return offset // self.slot_bytes

    # -- in the loader's process -----------------------------------------------------------
    def receive(self, wire: Wire) -> None:
        """The wire's `InSlot`s as tensors over their slots (each slot free again once its
        tensor and every view of it are gone)."""
        for key, item in list(wire.tensors.items()):
            if isinstance(item, InSlot):
                wire.tensors[key] = self._tensor(item)

    def _tensor(self, item: InSlot) -> Any:
        import torch

        owner = _SlotPixels(self._data, self._start + item.slot * self.slot_bytes, item.shape)
        weakref.finalize(owner, _free, self._flags, item.slot)
        return torch.from_numpy(np.asarray(owner))


class _SlotPixels:
    """The float32 pixels at `address` as an array's buffer: every view made of that array
    (numpy's or torch's) keeps this object, so it lives exactly as long as anything views the
    pixels; it keeps the slots' mapping too."""

    def __init__(self, data: np.ndarray, address: int, shape: tuple[int, ...]) -> None:
        self.data = data
        self.__array_interface__ = {
            "data": (address, False),
            "shape": shape,
            "typestr": "<f4",
            "version": 3,
        }


def _free(flags: np.ndarray, slot: int) -> None:
    flags[slot] = 0


def receive_pixels(slots: PixelSlots | None, data: Any) -> None:
    """In the loader's process: the pixels of `data` (a wire, or a ring's item holding one)
    as tensors over their slots."""
    wire = data if isinstance(data, Wire) else getattr(data, "wire", None)
    if slots is not None and isinstance(wire, Wire) and wire.tensors:
        slots.receive(wire)
