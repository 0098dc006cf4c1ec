"""Token ids of a cache entry being written, kept on disk rather than in memory.

A split can hold hundreds of millions of tokens and every (lane, source) stream fills its own
entry, so an entry's tokens go to an anonymous temporary file as its documents complete (in
document order) and are copied into the cache when the entry is stored: a writer holds only
the documents that finished ahead of an earlier one (at most a shuffle window's) and a small
buffer. A split whose tokens fit the buffer never opens a file.

The file is written at explicit offsets (`os.pwrite`) by the process that created it only,
and closing it never writes: a forked child that inherits it (and exits normally) cannot
move or add to what the parent wrote, and a full disk fails the write, not the close.
"""

from __future__ import annotations

import errno
import os
import resource
import tempfile
import threading
from array import array
from collections.abc import Iterator

import numpy as np

SPILL_BUFFER = 64 << 10  # bytes of ids a spill holds before it opens its file


class SpillUnavailable(OSError):
    """No file for a spill right now (this process holds its share of descriptors in spill
    files, or it has none left); the entry is given up, the cache stays usable."""


def _max_open_files() -> int:
    """Spill files a process may hold open at once: an eighth of its descriptor limit (the
    readers and sockets need the rest), at least 16."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(16, soft // 8)


class _OpenFiles:
    """Counts the spill files open in this process (reset in a forked child, which closes
    none of its parent's)."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def reset(self) -> None:
        self.count = 0
        self.lock = threading.Lock()


_open_files = _OpenFiles()
os.register_at_fork(after_in_child=_open_files.reset)


class TokenSpill:
    """Documents' token ids appended in order, as `dtype`: in a buffer, then in a temporary
    file under `folder` (the system's temporary folder when None), deleted when closed."""

    def __init__(self, dtype: np.dtype, folder: str | None = None) -> None:
        self.dtype = np.dtype(dtype)
        self.folder = folder
        self.lengths = array("q")  # tokens per document
        self.nbytes = 0  # bytes appended (buffered and written)
        self._buffer = bytearray()
        self._fd: int | None = None
        self._written = 0  # bytes in the file
        self._pid = os.getpid()
        self._closed = False
        self._limit = int(np.iinfo(self.dtype).max)

    def __len__(self) -> int:
        return len(self.lengths)

    def append(self, ids: np.ndarray) -> bool:
        """Add the next document's ids; False (nothing added) when one does not fit `dtype`
        (pre-tokenized ids of another vocabulary). OSError when the file cannot be written,
        `SpillUnavailable` when no file may be opened."""
        self._check_usable()
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) > self._limit):
            return False
        data = np.ascontiguousarray(ids, dtype=self.dtype)
        self._buffer += data.data.cast("B")
        self.lengths.append(len(data))
        self.nbytes += data.nbytes
        if len(self._buffer) >= SPILL_BUFFER:
            self._flush()
        return True

    def chunks(self, size: int) -> Iterator[bytes]:
        """The tokens appended so far, as bytes, `size` at a time (the last may be shorter)."""
        self._check_usable()
        if self._fd is None:  # all in the buffer
            data = bytes(self._buffer)
            for at in range(0, len(data), size):
                yield data[at : at + size]
            return
        self._flush()
        at = 0
        while at < self._written:
            want = min(size, self._written - at)
            chunk = os.pread(self._fd, want, at)
            while len(chunk) < want:  # (a short read: blocks must be whole for their CRCs)
                more = os.pread(self._fd, want - len(chunk), at + len(chunk))
                if not more:
                    raise OSError(f"token spill file ended {self._written - at} bytes early")
                chunk += more
            at += want
            yield chunk

    def close(self) -> None:
        """Drop the tokens and delete the file (never writes, never raises)."""
        self._buffer = bytearray()
        fd, self._fd = getattr(self, "_fd", None), None  # (None: __init__ did not finish)
        self._closed = True
        if fd is not None and os.getpid() == self._pid:
            try:
                os.close(fd)
            except OSError:
                pass
            with _open_files.lock:
                _open_files.count -= 1

    def __del__(self) -> None:
        self.close()

    def _check_usable(self) -> None:
        if self._closed or os.getpid() != self._pid:
            raise SpillUnavailable("token spill closed, or inherited from another process")

    def _flush(self) -> None:
        if self._fd is None:
            self._open()
        fd = self._fd
        assert fd is not None  # (opened just above)
        view = memoryview(self._buffer)
        while view:
            done = os.pwrite(fd, view, self._written)
            self._written += done
            view = view[done:]
        self._buffer = bytearray()

    def _open(self) -> None:
        with _open_files.lock:
            if _open_files.count >= _max_open_files():
                raise SpillUnavailable(f"{_open_files.count} token spill files already open")
            _open_files.count += 1
        try:
            if self.folder is not None:
                os.makedirs(self.folder, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.folder, prefix=".spill-", buffering=0) as tmp:
                self._fd = os.dup(tmp.fileno())
        except OSError as exc:
            with _open_files.lock:
                _open_files.count -= 1
            if exc.errno in (errno.EMFILE, errno.ENFILE):  # out of descriptors, not of disk
                raise SpillUnavailable(str(exc)) from exc
            raise
