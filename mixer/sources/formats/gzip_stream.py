"""A gzip reader whose position in the compressed file depends only on the output taken.

`gzip.GzipFile` reads its input 8 KB at a time per call and asks zlib for as much output as
the caller asked for, so how far it has read the file after N bytes of output depends on the
sizes of the reads that got there: a reader reopened and skipped to N in 1 MB reads stood
elsewhere in the file than one read in 16 KB pieces, and the `epochs` estimate (which divides
by the compressed position) moved with every suspension (`formats/reopen.py`). `GzipStream`
makes each piece of output from the input left over or from one more `read_size` of the file,
at most `max_output` bytes a piece, and only once the previous piece was all taken: the
pieces, and the file position after any N bytes, are those of every other reader of the
file. Members are read one after another (zero padding between them is skipped, as gzip
does); errors are those of `gzip`: `EOFError` for a file that ends inside a member,
`BadGzipFile` for one that is not gzip, `zlib.error` for corrupt data or a failed check.
"""

from __future__ import annotations

import gzip
import io
import zlib
from typing import IO

_MAGIC = b"\x1f\x8b"
_GZIP = 16 + zlib.MAX_WBITS   # zlib parses the gzip header and checks CRC-32 and size


class GzipStream(io.RawIOBase):
    """The decompressed bytes of every member of a gzip file (see the module docstring)."""

    def __init__(self, raw: IO[bytes], *, read_size: int = 64 << 10,
                 max_output: int = 256 << 10) -> None:
        self._raw = raw
        self._read_size = read_size
        self._max_output = max_output
        self._obj: zlib._Decompress | None = None   # None between members
        self._tail = b""      # input read and not decompressed yet
        self._eof = False     # the file has ended
        self._out = b""
        self._at = 0          # bytes of `_out` already handed out

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        while self._at >= len(self._out):
            self._out, self._at = self._next_piece(), 0
            if not self._out:
                return 0
        size = min(len(buffer), len(self._out) - self._at)
        buffer[:size] = memoryview(self._out)[self._at:self._at + size]
        self._at += size
        return size

    def _read_more(self) -> bool:
        """Append the next `read_size` of the file to the input; False at its end."""
        more = b"" if self._eof else self._raw.read(self._read_size)
        self._eof = not more
        self._tail += more
        return bool(more)

    def _next_piece(self) -> bytes:
        """The next piece of output; b"" at the end of the file's last member."""
        while True:
            if self._obj is None and not self._start_member():
                return b""
            assert self._obj is not None
            if not self._tail and not self._read_more():
                raise EOFError("Compressed file ended before the end-of-stream marker was "
                               "reached")
            out = self._obj.decompress(self._tail, self._max_output)
            if self._obj.eof:
                self._tail, self._obj = self._obj.unused_data, None
            else:
                self._tail = self._obj.unconsumed_tail
            if out:
                return out

    def _start_member(self) -> bool:
        """Begin the next member; False where the file ends (after zero padding)."""
        while True:
            self._tail = self._tail.lstrip(b"\0")
            if len(self._tail) >= len(_MAGIC):
                break
            if not self._read_more():
                if self._tail:   # (gzip's verdict on a lone byte after a member)
                    raise gzip.BadGzipFile(f"Not a gzipped file ({self._tail!r})")
                return False
        if not self._tail.startswith(_MAGIC):
            raise gzip.BadGzipFile(f"Not a gzipped file ({self._tail[:2]!r})")
        self._obj = zlib.decompressobj(_GZIP)
        return True

    def close(self) -> None:
        self._out = self._tail = b""
        self._obj = None
        super().close()
