"""Decompressed output handed out a piece at a time: the base of mixer's gzip and zstd readers."""

from __future__ import annotations

import io


class PieceReader(io.RawIOBase):
    """A raw stream that makes its output a piece at a time (`_next_piece`: b"" at the end)
    and makes the next piece only once the one before has all been read, so what it has read
    of its input after N bytes of output does not depend on the sizes of the reads that got
    there (a reader reopened and skipped to N stands where an uninterrupted one stood)."""

    def __init__(self) -> None:
        super().__init__()
        self._out = b""
        self._at = 0  # bytes of `_out` already handed out (no copy of the rest per read)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if not len(buffer):
            return 0
        while self._at >= len(self._out):
            self._out, self._at = self._next_piece(), 0
            if not self._out:
                return 0
        size = min(len(buffer), len(self._out) - self._at)
        buffer[:size] = memoryview(self._out)[self._at : self._at + size]
        self._at += size
        return size

    def _next_piece(self) -> bytes:
        """The next piece of output; b"" at the end."""
        raise NotImplementedError
