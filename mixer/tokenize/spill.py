"""Token ids of a cache entry being written, kept on disk rather than in memory.

A split can hold hundreds of millions of tokens and every (lane, source) stream fills its own
entry, so an entry's tokens go to an anonymous temporary file as its documents complete (in
document order) and are copied into the cache when the entry is stored: a writer holds only
the documents that finished ahead of an earlier one (at most a shuffle window's).
"""

from __future__ import annotations

import os
import tempfile
from array import array
from collections.abc import Iterator
from typing import IO

import numpy as np


class TokenSpill:
    """Documents' token ids appended in order, as `dtype`, in a temporary file under `folder`
    (the system's temporary folder when None) that is created on the first append and
    deleted when closed or collected."""

    def __init__(self, dtype: np.dtype, folder: str | None = None) -> None:
        self.dtype = np.dtype(dtype)
        self.folder = folder
        self.lengths = array("q")   # tokens per document
        self.nbytes = 0
        self._file: IO[bytes] | None = None
        self._limit = int(np.iinfo(self.dtype).max)

    def __len__(self) -> int:
        return len(self.lengths)

    def append(self, ids: np.ndarray) -> bool:
        """Add the next document's ids; False (nothing added) when one does not fit `dtype`
        (pre-tokenized ids of another vocabulary). OSError when the file cannot be written."""
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) > self._limit):
            return False
        if self._file is None:
            if self.folder is not None:
                os.makedirs(self.folder, exist_ok=True)
            self._file = tempfile.TemporaryFile(dir=self.folder, prefix=".spill-")
        data = np.ascontiguousarray(ids, dtype=self.dtype)
        self._file.write(memoryview(data).cast("B"))
        self.lengths.append(len(data))
        self.nbytes += data.nbytes
        return True

    def chunks(self, size: int) -> Iterator[bytes]:
        """The tokens written so far, as bytes, `size` at a time (the last may be shorter)."""
        if self._file is None:
            return
        self._file.flush()
        self._file.seek(0)
        left = self.nbytes
        while left > 0:
            chunk = self._file.read(min(size, left))
            if not chunk:
                raise OSError(f"token spill file ended {left} bytes early")
            left -= len(chunk)
            yield chunk

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __del__(self) -> None:
        self.close()
