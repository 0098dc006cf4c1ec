"""Whole compressed files read through a per-process limit on open decompressors.

A reader of a whole `.jsonl.zst` or `.jsonl.gz` file stays open between shuffle windows
(re-opening it would decompress the file from its start), and there is one per lane and
source: a zstd decompressor holds its frame's window (2 MB at level 3, up to 128 MB), a
remote file its read block. `Reopenable` lets the process's `OPEN_DECOMPRESSORS` limit
suspend the least recently read ones, as far as the process's `REBUILD_BUDGET` allows: a
suspended stream closes its file and decompressor, and the next read opens them again and
decompresses from the start to where it stopped. The bytes read are the same, and so is the
compressed position (`ZstdStream`'s and `GzipStream`'s input depends only on the output
taken from them), which `metrics()["epochs"]` and the state's copy of it read.
"""

from __future__ import annotations

import io
import logging
import os
import threading
from collections.abc import Callable
from typing import IO

from mixer.core.resources import OpenLimit

log = logging.getLogger(__name__)

# A suspended reader costs one decompression of the file's start again, so the limit is a
# trade between memory and that CPU (benchmarks/memory.py): past 4 open, readers cheap to
# reopen (near their file's start, `RebuildBudget.cheap`) are suspended; past 8, any; both
# within `REBUILD_BUDGET`. 8 is enough for a process reading a few large whole compressed
# sources in each of its lanes (8 lanes on 2 ranks, 2 such sources: 8 open, none reopened;
# at 4, 2 large sources read 10-20 % slower); 4 keeps fewer open where reopening is cheap.
OPEN_DECOMPRESSORS = OpenLimit(8, soft=4)
_DISCARD = 1 << 20


class RebuildBudget:
    """How much decompressing again the suspensions of a process may cost: at most `ratio`
    times what its readers have decompressed. A suspension reserves its reader's position
    (what reading on will decompress again); one past the budget is refused and the reader
    stays open, over the limit (the first refusal in a process is logged). Without it,
    readers deep in large files (a 1 GB shard) would decompress gigabytes again for every
    window, and many small files read in small windows (100 sources: 80 KB windows) would be
    decompressed again from their start for nearly every window. Suspensions that only keep
    the open readers few (past `OpenLimit.soft`: `cheap_only`) may use `soft_share` of it,
    and only for readers at most `cheap` bytes in, so that what is left of it enforces the
    limit itself."""

    def __init__(self, ratio: float, *, soft_share: float = 0.5, cheap: int = 8 << 20) -> None:
        self.ratio = ratio
        self.soft_share = soft_share
        self.cheap = cheap
        self._pid = os.getpid()
        self.read = 0  # decompressed bytes handed out by this process's readers
        self.reserved = 0  # positions of the readers suspended
        self.refused = 0  # suspensions past the limit refused

    def _own(self) -> None:
        if self._pid != os.getpid():  # a forked worker: the parent's counts are not its own
            self._pid, self.read, self.reserved, self.refused = os.getpid(), 0, 0, 0

    def add_read(self, size: int) -> None:
        """`size` more decompressed bytes handed out (under the reader's lock)."""
        self._own()
        self.read += size

    def reserve(self, position: int, cheap_only: bool = False) -> bool:
        """Whether a reader at `position` may be suspended (then its position is counted);
        `cheap_only`: a suspension past the soft limit only."""
        self._own()
        if cheap_only:
            if (
                position > self.cheap
                or self.reserved + position > self.soft_share * self.ratio * self.read
            ):
                return False
        elif self.reserved + position > self.ratio * self.read:
            self.refused += 1
            if self.refused == 1:
                log.warning(
                    "whole-file decompressors: keeping readers open past the limit "
                    "of %d (~2.5 MB each for zstd): reopening them would decompress "
                    "their files' start again more than %gx what is read. A token "
                    "cache, or zstd written in frames and `mixer index`, avoids it",
                    OPEN_DECOMPRESSORS.limit,
                    self.ratio,
                )
            return False
        self.reserved += position
        return True


# (4x: 100 sources of 1-5 MB in 80 KB windows need 3.3x to stay at the limit)
REBUILD_BUDGET = RebuildBudget(4.0)


class Reopenable(io.RawIOBase):
    """The decompressed bytes of a file, from `decompressor(open_file())`, that `limit` may
    suspend between reads, within `budget` (see the module's docstring)."""

    def __init__(
        self,
        open_file: Callable[[], IO[bytes]],
        decompressor: Callable[[IO[bytes]], IO[bytes]],
        limit: OpenLimit = OPEN_DECOMPRESSORS,
        budget: RebuildBudget = REBUILD_BUDGET,
    ) -> None:
        super().__init__()
        self._open_file = open_file
        self._decompressor = decompressor
        self._limit = limit
        self._budget = budget
        self._file: IO[bytes] | None = None
        self._inner: IO[bytes] | None = None
        self._position = 0  # decompressed bytes handed out
        self._file_position = 0  # the file's position when suspended
        self._busy = threading.Lock()
        self.reopened = 0
        self._reopen()  # (a file that cannot be opened fails here, as a plain open would)
        limit.touch(self)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        with self._busy:
            inner = self._inner if self._inner is not None else self._reopen()
            self._limit.touch(self)  # the most recently read
            size = inner.readinto(buffer)
            self._position += size
            self._budget.add_read(size)
            return size

    def _reopen(self) -> IO[bytes]:
        self._file = self._open_file()
        try:
            self._inner = self._decompressor(self._file)
            if self._position:
                self.reopened += 1
                _discard(self._inner, self._position)
        except BaseException:
            self._release()
            raise
        return self._inner

    def file_position(self) -> int:
        """The compressed file's position: stored bytes consumed so far."""
        with self._busy:  # (another thread's read may be suspending it meanwhile)
            return self._file.tell() if self._file is not None else self._file_position

    def suspend(self, cheap_only: bool = False) -> bool:
        if not self._busy.acquire(blocking=False):
            return False
        try:
            if self._file is None:
                return True
            if not self._budget.reserve(self._position, cheap_only):
                return False
            self._file_position = self._file.tell()
            self._release()
        finally:
            self._busy.release()
        return True

    def _release(self) -> None:
        inner, file, self._inner, self._file = self._inner, self._file, None, None
        try:
            if inner is not None:
                inner.close()
        finally:
            if file is not None:
                file.close()

    def close(self) -> None:
        if not self.closed:
            self._limit.forget(self)
            with self._busy:
                self._release()
        super().close()


def _discard(stream: IO[bytes], count: int) -> None:
    """Read and drop `count` bytes (the stream was read that far before)."""
    scratch = memoryview(bytearray(min(count, _DISCARD)))
    while count:
        size = stream.readinto(scratch[: min(count, len(scratch))])
        if not size:
            raise EOFError(
                "the file ended before the position it was read to earlier "
                "(it changed while being read)"
            )
        count -= size
