"""Shared-memory slots through which DataLoader workers hand batches to the loader's process.

Through the DataLoader's pipe a 256 KB text batch costs the loader's process about 0.35 ms of
CPU to receive (a tiny item 0.08 ms: `benchmarks/dataloader_floor.py`), more than a warm
token cache takes to make it. So the ring is mapped before the workers fork (anonymous shared
memory, inherited by every forked worker: no names, nothing to unlink): a worker writes its
batch's wire buffer straight into one of its own slots and sends only the slot's number with
the lane metadata; the loader's process reads the batch out of the slot (`from_wire` copies it into
the user's arrays) and frees the slot.

Each slot has a flag: 0 free, 1 filled. A worker writes only into a free slot of its own and
sets its flag after the data; the loader's process clears it after reading. The slot's number
reaches the loader's process through the pipe (system calls on both sides order the data and
the flag before it); the flag's clearing after the read is a plain store, which on a weakly
ordered CPU could in theory become visible before the read ends, but the worker looks at the
flag again only a whole batch later. When a worker's
next slot is still filled, or a batch does not fit, the batch goes through the pipe as
before, so a worker never waits on the ring.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from mixer.pipeline.batch import Batch, BatchLayout, Wire

PAGE = 4096
log = logging.getLogger("mixer.loader")
T = TypeVar("T")


@dataclass
class InRing:
    """A batch waiting in slot `slot` (its `size` bytes are the wire's buffer)."""

    slot: int
    size: int
    wire: Wire  # shapes and tensors; its `data` is in the slot


class BatchRing:
    """`slots` slots of `slot_bytes` for each of `workers` workers, in one shared mapping."""

    def __init__(self, workers: int, slots: int, slot_bytes: int) -> None:
        self.slots = slots
        self.slot_bytes = -(-slot_bytes // PAGE) * PAGE
        count = workers * slots
        flags_bytes = -(-count // PAGE) * PAGE
        self._memory = SharedPages(flags_bytes + count * self.slot_bytes)
        self._flags = np.frombuffer(self._memory.view, dtype=np.uint8, count=count)
        self._data = np.frombuffer(self._memory.view, dtype=np.uint8, offset=flags_bytes)
        self._next = [0] * workers  # (each worker's own copy after the fork)

    @classmethod
    def for_layout(
        cls, layout: BatchLayout, batch_size: int, workers: int, slots: int
    ) -> BatchRing | None:
        """Slots for `layout`'s batches (`layout.wire_bytes`: its arrays in their wire
        dtypes, small pixel arrays included; larger ones cross as shared tensors), or None
        where the system will not map that much (then every batch crosses through the pipe,
        as the ring only saves the loader's process a copy)."""
        slot_bytes = layout.wire_bytes(batch_size)
        try:
            return cls(workers, slots, slot_bytes)
        except (OSError, ValueError, OverflowError) as exc:
            log.warning(
                "no shared-memory ring for the workers' batches (%d workers x %d "
                "slots x %.1f MB: %s); batches cross through the DataLoader's pipe",
                workers,
                slots,
                slot_bytes / 1e6,
                exc,
            )
            return None

    def send(self, worker: int, layout: BatchLayout, batch: Batch) -> InRing | Wire:
        """In a worker: the batch's wire with its buffer written into this worker's next slot
        (`InRing`), or the wire itself (sent through the pipe) when that slot is still
        filled or too small."""
        slot = worker * self.slots + self._next[worker]
        if self._flags[slot]:
            return layout.to_wire(batch)
        start = slot * self.slot_bytes
        wire = layout.to_wire(batch, self._data[start : start + self.slot_bytes])
        if not isinstance(wire.data, memoryview):
            return wire  # larger than a slot
        self._next[worker] = (self._next[worker] + 1) % self.slots
        self._flags[slot] = 1  # after the data: the reader frees it once it has read it
        return InRing(slot, len(wire.data), Wire(b"", wire.shapes, wire.tensors))

    def keep_from_later_forks(self) -> None:
        """Once the workers have forked: processes forked later (another loader's workers,
        a trainer's own) do not inherit the mapping, so closing this loader frees it."""
        self._memory.keep_from_later_forks()

    def take(self, item: InRing, read: Callable[[Wire], T]) -> T:
        """In the loader's process: `read(wire)` of the slot's batch, then the slot is free
        again (`read` must copy what it keeps: the slot's bytes are reused)."""
        start = item.slot * self.slot_bytes
        wire = item.wire
        wire.data = self._data[start : start + item.size].data
        try:
            return read(wire)
        finally:
            wire.data = b""
            self._flags[item.slot] = 0


class SharedPages:
    """`size` bytes of anonymous shared memory (MAP_SHARED | MAP_ANONYMOUS: pages are made on
    first write, shared with forked children), unmapped once nothing views them — in each
    process that has them, and only there.

    Python's `mmap.mmap` unmaps its address when the object goes, in whichever process that
    happens. Once the pages are kept from later forks (MADV_DONTFORK), a process forked later
    still holds the Python object but not the mapping, and may have put its own memory at that
    address (thread stacks, the interpreter's frames): dropping the inherited object there
    unmapped that memory, and the process died of SIGSEGV.
    """

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError(f"shared pages need a positive size, not {size}")
        address = _libc.mmap(
            None,
            size,
            mmap.PROT_READ | mmap.PROT_WRITE,
            mmap.MAP_SHARED | mmap.MAP_ANONYMOUS,
            -1,
            0,
        )
        if address in (None, _MAP_FAILED):
            errno = ctypes.get_errno()
            raise OSError(errno, f"mmap of {size} shared bytes: {os.strerror(errno)}")
        self.address = address
        self.size = size
        self._mapping = _Mapping(address, size, os.getpid())
        _mappings.add(self._mapping)
        pages = (ctypes.c_uint8 * size).from_address(address)
        # Views (numpy arrays over `view`) keep `pages` alive; the last one gone unmaps them.
        unmap = weakref.finalize(pages, self._mapping.unmap)
        unmap.atexit = False  # the system frees them at exit; a thread may still read them
        self.view = memoryview(pages).cast("B")

    def keep_from_later_forks(self) -> None:
        """Processes forked from now on do not inherit the pages (Linux; elsewhere a no-op)."""
        advice = getattr(mmap, "MADV_DONTFORK", None)
        if advice is None:
            return
        # Before the call (which releases the GIL): a child forked by another thread meanwhile
        # then takes the pages for not its own — at worst it leaves its copy mapped.
        self._mapping.forked = False
        if _libc.madvise(self.address, self.size, advice) != 0:
            self._mapping.forked = True


class _Mapping:
    """Where the pages are, and which process has them mapped there (`owner`)."""

    __slots__ = ("address", "size", "owner", "forked", "__weakref__")

    def __init__(self, address: int, size: int, owner: int) -> None:
        self.address, self.size, self.owner, self.forked = address, size, owner, True

    def unmap(self) -> None:
        if os.getpid() == self.owner:
            _libc.munmap(self.address, self.size)


def _after_fork_in_child() -> None:
    for mapping in list(_mappings):
        if mapping.forked:  # inherited: the child's own to unmap
            mapping.owner = os.getpid()


_mappings: weakref.WeakSet[_Mapping] = weakref.WeakSet()
os.register_at_fork(after_in_child=_after_fork_in_child)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value
