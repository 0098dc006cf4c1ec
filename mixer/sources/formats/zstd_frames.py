"""Access points of multi-frame zstd files: frames decompress independently.

A file written as several frames that record their content size can be cut at frame
boundaries into splits with known compressed and decompressed ranges. Resuming inside such a
split decompresses from the split's first frame instead of the file's start.

`ZstdStream` decompresses a zstd file with bounded output per read: its input is cut at the
block boundaries the compressed bytes themselves describe, so no read turns a few kilobytes
of a highly repetitive file (a "zstd bomb") into gigabytes at once.
"""

from __future__ import annotations

from typing import IO

import zstandard

from mixer.sources.formats.pieces import PieceReader

_MAGIC = 0xFD2FB528
_SKIPPABLE = range(0x184D2A50, 0x184D2A60)
_MAX_HEADER = 18


def scan_frames(stream: IO[bytes], size: int) -> list[tuple[int, int, int, int]] | None:
    """(compressed start, compressed end, decompressed start, decompressed end) per frame,
    reading only frame and block headers; None when a frame does not record its size."""
    frames = []
    pos = decompressed = 0
    while pos < size:
        stream.seek(pos)
        head = stream.read(_MAX_HEADER)
        magic = int.from_bytes(head[:4], "little")
        if magic in _SKIPPABLE:
            pos += 8 + int.from_bytes(head[4:8], "little")
            continue
        if magic != _MAGIC:
            return None
        params = zstandard.get_frame_parameters(head)
        if params.content_size >= zstandard.CONTENTSIZE_ERROR:
            return None
        block = pos + zstandard.frame_header_size(head)
        while True:
            if block + 3 > size:
                return None  # the frame runs past the file's end: truncated or corrupt
            stream.seek(block)
            header = int.from_bytes(stream.read(3), "little")
            kind, length = (header >> 1) & 3, header >> 3
            if kind == 3:
                return None  # reserved block type: not a valid frame
            block += 3 + (1 if kind == 1 else length)  # an RLE block stores one byte
            if header & 1:
                break
        end = block + (4 if params.has_checksum else 0)
        if end > size:
            return None
        frames.append((pos, end, decompressed, decompressed + params.content_size))
        decompressed += params.content_size
        pos = end
    return frames


def group_frames(
    frames: list[tuple[int, int, int, int]], split_bytes: int
) -> list[tuple[int, int, int, int]]:
    """Consecutive frames joined into ranges of at least `split_bytes` compressed bytes."""
    groups: list[tuple[int, int, int, int]] = []
    for start, end, dstart, dend in frames:
        if groups and groups[-1][1] - groups[-1][0] < split_bytes:
            first = groups.pop()
            groups.append((first[0], end, first[2], dend))
        else:
            groups.append((start, end, dstart, dend))
    return groups


# -- decompressing with bounded output ----------------------------------------------------------

BLOCK_MAX = 128 << 10  # the most one zstd block decompresses to (the format's limit)
_SKIPPABLE_HEADER = 8
_BLOCK_HEADER = 3
_CHECKSUM = 4
_FCS_BYTES = (0, 2, 4, 8)  # by Frame_Content_Size_flag (0: 1 byte in a single segment)
_DID_BYTES = (0, 1, 2, 4)  # by Dictionary_ID_flag


def _frame_header_size(descriptor: int) -> int:
    """Bytes of a zstd frame header (magic included) from its descriptor byte."""
    single = bool(descriptor & 0x20)
    fcs = _FCS_BYTES[descriptor >> 6] or (1 if single else 0)
    return 4 + 1 + (0 if single else 1) + _DID_BYTES[descriptor & 3] + fcs


class _Pieces:
    """Walks the structure of a zstd stream (frame headers, blocks, checksums, skippable
    frames) from the compressed bytes alone, to cut its input where the output it can make
    is bounded: a block makes at most its stored size (raw, RLE) or `BLOCK_MAX` bytes."""

    def __init__(self) -> None:
        self._left = 0  # bytes left in the piece being fed
        self._at_frame = True  # the next piece starts a frame (else a block)
        self._checksum = False  # the current frame ends with a checksum
        self._opaque = False  # not a structure we know: the decompressor will say why

    def plan(self, data: memoryview, cap: int, final: bool) -> int:
        """How many bytes of `data` (input not fed yet) to feed now: whole pieces whose
        output adds up to at most `cap` bytes, or at least one piece. 0: more input is
        needed to read the next header (`final`: there is none; feed what is left)."""
        at = out = 0
        while at < len(data):
            if self._left or self._opaque:
                take = len(data) - at if self._opaque else min(self._left, len(data) - at)
                at += take
                self._left -= 0 if self._opaque else take
                continue
            grown = self._start_piece(data[at:])
            if grown is None:  # its header is not all here yet
                return len(data) if final else at
            if at and out + grown > cap:
                break
            out += grown
        return at

    def _start_piece(self, head: memoryview) -> int | None:
        """Begin the piece at `head`: set its length, return the output it may make."""
        if self._at_frame:
            if len(head) < _SKIPPABLE_HEADER:
                return None
            magic = int.from_bytes(head[:4], "little")
            if magic in _SKIPPABLE:
                self._left = _SKIPPABLE_HEADER + int.from_bytes(head[4:8], "little")
                return 0
            if magic != _MAGIC:
                self._opaque = True
                return 0
            self._left = _frame_header_size(head[4])
            self._checksum = bool(head[4] & 0x04)
            self._at_frame = False
            return 0
        if len(head) < _BLOCK_HEADER:
            return None
        header = int.from_bytes(head[:3], "little")
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        if kind == 3:  # reserved: corrupt
            self._opaque = True
            return 0
        self._left = _BLOCK_HEADER + (1 if kind == 1 else size)
        if last:
            self._left += _CHECKSUM if self._checksum else 0
            self._at_frame = True
        return size if kind < 2 else BLOCK_MAX


class ZstdStream(PieceReader):
    """Decompresses every frame of a zstd file, one read making at most about `max_output`
    bytes (one block more at worst) however well the data compresses, and, unlike zstandard's
    stream_reader, raises on a file that ends inside a frame (a truncated or corrupt shard).

    zstandard's decompressobj turns all the input it is given into output at once, and a few
    kilobytes of a file of one repeated byte are gigabytes. The input is therefore fed in
    pieces cut at block boundaries (`_Pieces`), whose output the block headers bound."""

    def __init__(
        self, raw: IO[bytes], *, read_size: int = 64 << 10, max_output: int = 256 << 10
    ) -> None:
        super().__init__()
        self._raw = raw
        self._read_size = read_size
        self._max_output = max_output
        self._dctx = zstandard.ZstdDecompressor()
        self._obj = self._dctx.decompressobj()
        self._pieces = _Pieces()
        self._in = b""  # compressed bytes read and not fed yet
        self._eof = False  # the raw stream has ended
        self._in_frame = False
        self.consumed = 0  # compressed bytes fed (a compression ratio's divisor)

    def _next_piece(self) -> bytes:
        while True:
            chunk = self._next_input()
            if not chunk:
                if self._in_frame:
                    raise zstandard.ZstdError("file ends inside a zstd frame (truncated)")
                return b""
            out = self._decompress(chunk)
            if out:
                return out

    def _next_input(self) -> bytes:
        """The next input to feed: pieces of at most `max_output` bytes of output."""
        while True:
            n = self._pieces.plan(memoryview(self._in), self._max_output, self._eof)
            if n or self._eof:
                chunk, self._in = self._in[:n], self._in[n:]
                self.consumed += len(chunk)
                return chunk
            more = self._raw.read(self._read_size)
            self._eof = not more
            self._in += more

    def _decompress(self, chunk: bytes) -> bytes:
        parts = []
        while chunk:
            self._in_frame = True
            parts.append(self._obj.decompress(chunk))
            if not self._obj.eof:
                break
            chunk = self._obj.unused_data  # the next frame starts here
            self._obj = self._dctx.decompressobj()
            self._in_frame = False
        return b"".join(parts)
