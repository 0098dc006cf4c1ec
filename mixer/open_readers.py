"""Readers kept open between windows, bounded per process.

A stream whose split cannot be re-opened cheaply at its cursor (a whole-file gzip or zstd
split: re-opening decompresses from the split's start) keeps its reader open while its window
is consumed. Each such reader holds its decompressor (~2 MB for zstd), and a process has one
per (lane, source) striping such a split, so 64 lanes held ~100 MB more than 8 on one
whole-file zstd source. This registry keeps at most `OPEN_READERS_MAX` of them per process:
beyond that the least recently used one is closed, and its stream re-opens at its cursor when
it next reads (the same records, at the cost of decompressing the split's start again).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from typing import Protocol

OPEN_READERS_MAX = 16


class HoldsReader(Protocol):
    def close_reader(self) -> None:
        """Close the reader kept open (called with `OpenReaders.lock` held); the next read
        re-opens at the cursor."""


class OpenReaders:
    """The streams holding an open reader in this process, least recently used first."""

    def __init__(self, limit: int = OPEN_READERS_MAX) -> None:
        self.limit = limit
        self._held: OrderedDict[int, weakref.ref] = OrderedDict()
        self._pid = os.getpid()
        # Held while a stream takes its reader back or one is closed, so that a reader is
        # never closed while its stream reads from it (loaders read on any thread).
        self.lock = threading.RLock()

    def hold(self, owner: HoldsReader) -> None:
        """`owner` keeps a reader open; close the least recently used ones beyond the limit."""
        with self.lock:
            self._forget_parent()
            self._held.pop(id(owner), None)
            self._held[id(owner)] = weakref.ref(owner)
            while len(self._held) > self.limit:
                _, ref = self._held.popitem(last=False)
                oldest = ref()
                if oldest is not None:
                    oldest.close_reader()

    def release(self, owner: HoldsReader) -> None:
        """`owner` no longer keeps a reader open (it took it back, or closed it)."""
        with self.lock:
            self._forget_parent()
            ref = self._held.get(id(owner))
            if ref is not None and ref() is owner:
                del self._held[id(owner)]

    def __len__(self) -> int:
        with self.lock:
            self._forget_parent()
            return sum(1 for ref in self._held.values() if ref() is not None)

    def _forget_parent(self) -> None:
        # A forked worker's streams are copies; the parent's entries are not its own.
        if self._pid != os.getpid():
            self._held.clear()
            self._pid = os.getpid()


open_readers = OpenReaders()
