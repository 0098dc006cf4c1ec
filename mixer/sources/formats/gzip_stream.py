"""A gzip reader whose position in the compressed file depends only on the output taken.

`gzip.GzipFile` reads its input 8 KB at a time per call and asks zlib for as much output as
the caller asked for, so how far it has read the file after N bytes of output depends on the
sizes of the reads that got there: a reader reopened and skipped to N in 1 MB reads stood
elsewhere in the file than one read in 16 KB pieces, and the `epochs` estimate (which divides
by the compressed position) moved with every suspension (`formats/reopen.py`). `GzipStream`
makes each piece of output (at most `max_output` bytes) from the input left over or from one
more `read_size` of the file, and makes it, with the reads it needs, only once the previous
piece was all taken: the pieces, and the file position after any N bytes, are those of every
other reader of the file.

It reads what `gzip` reads, as `gzip` does: members one after another, zero padding after a
member skipped (not before the first), header fields skipped (a header CRC and reserved flag
bits ignored, as gzip does), each member's CRC-32 and length checked; and it fails where gzip
fails, with gzip's errors: `EOFError` for a file that ends inside a member, `BadGzipFile` for
one that is not gzip or whose check fails, `zlib.error` for corrupt deflate data; a read after
an error raises it again. Memory stays within a few pieces, whatever the file holds (a header
name of a gigabyte is skipped a read at a time).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from typing import IO

from mixer.sources.formats.pieces import PieceReader

_MAGIC = b"\x1f\x8b"
_FEXTRA, _FNAME, _FCOMMENT, _FHCRC = 4, 8, 16, 2
_ENDED = "Compressed file ended before the end-of-stream marker was reached"


class GzipStream(PieceReader):
    """The decompressed bytes of every member of a gzip file (see the module docstring)."""

    def __init__(
        self, raw: IO[bytes], *, read_size: int = 16 << 10, max_output: int = 64 << 10
    ) -> None:
        if read_size < 1 or max_output < 1:
            raise ValueError("read_size and max_output must be positive")
        super().__init__()
        self._raw = raw
        self._read_size = read_size
        self._max_output = max_output
        self._obj: zlib._Decompress | None = None  # the member's inflater; None between
        self._crc = 0
        self._size = 0  # the member's output so far
        self._members = 0  # members begun
        self._tail = b""  # input read and not used yet
        self._eof = False  # the file has ended
        self._error: BaseException | None = None  # raised again by every later read

    def _next_piece(self) -> bytes:
        if self._error is not None:
            raise self._error
        try:
            return self._make_piece()
        except (EOFError, OSError, zlib.error) as exc:
            self._error = exc
            raise

    def _read_more(self) -> bool:
        """Append the next `read_size` of the file to the input; False at its end."""
        more = b"" if self._eof else self._raw.read(self._read_size)
        self._eof = not more
        self._tail += more
        return bool(more)

    def _need(self, count: int) -> None:
        """At least `count` bytes of input, or `EOFError` (inside a member)."""
        while len(self._tail) < count:
            if not self._read_more():
                raise EOFError(_ENDED)

    def _make_piece(self) -> bytes:
        """The next piece of output; b"" at the end of the file's last member."""
        while True:
            if self._obj is None and not self._start_member():
                return b""
            assert self._obj is not None
            if not self._tail and not self._read_more():
                # The file ends inside the member: what zlib still holds (or its verdict on
                # it) first, as gzip does, then the end.
                out = self._obj.decompress(b"", self._max_output)
                if not out and not self._obj.eof:
                    raise EOFError(_ENDED)
            else:
                out = self._obj.decompress(self._tail, self._max_output)
            self._crc = zlib.crc32(out, self._crc)
            self._size += len(out)
            if self._obj.eof:
                self._tail = self._obj.unused_data
                self._end_member()
            else:
                self._tail = self._obj.unconsumed_tail
            if out:
                return out

    def _start_member(self) -> bool:
        """Read the next member's header; False where the file ends (after zero padding)."""
        while True:
            if self._members:  # zero padding after a member (gzip skips it)
                self._tail = self._tail.lstrip(b"\0")
            if len(self._tail) >= len(_MAGIC) or not self._read_more():
                break
        if not self._tail:  # (an empty file has no member and reads empty, as with gzip)
            return False
        if not self._tail.startswith(_MAGIC):
            raise gzip.BadGzipFile(f"Not a gzipped file ({self._tail[:2]!r})")
        self._need(10)
        method, flags = self._tail[2], self._tail[3]
        if method != 8:
            raise gzip.BadGzipFile("Unknown compression method")
        self._tail = self._tail[10:]
        if flags & _FEXTRA:  # (at most 64 KB)
            self._need(2)
            size = 2 + struct.unpack("<H", self._tail[:2])[0]
            self._need(size)
            self._tail = self._tail[size:]
        for flag in (_FNAME, _FCOMMENT):  # zero-terminated, of any length
            if flags & flag:
                self._skip_past_nul()
        if flags & _FHCRC:
            self._need(2)
            self._tail = self._tail[2:]
        self._obj = zlib.decompressobj(-zlib.MAX_WBITS)
        self._crc, self._size = 0, 0
        self._members += 1
        return True

    def _skip_past_nul(self) -> None:
        """Drop the input up to and including the next zero byte, a read at a time."""
        while (end := self._tail.find(b"\0")) < 0:
            self._tail = b""
            if not self._read_more():
                raise EOFError(_ENDED)
        self._tail = self._tail[end + 1 :]

    def _end_member(self) -> None:
        """The member's output is all made: check its CRC-32 and length (gzip's trailer)."""
        self._need(8)
        crc, size = struct.unpack("<II", self._tail[:8])
        self._tail = self._tail[8:]
        if crc != self._crc:
            raise gzip.BadGzipFile(f"CRC check failed {hex(crc)} != {hex(self._crc)}")
        if size != self._size & 0xFFFFFFFF:
            raise gzip.BadGzipFile("Incorrect length of data produced")
        self._obj = None

    def close(self) -> None:
        self._out = self._tail = b""
        self._obj = None
        super().close()
