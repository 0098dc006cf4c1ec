"""Access points of multi-frame zstd files: frames decompress independently.

A file written as several frames that record their content size can be cut at frame
boundaries into splits with known compressed and decompressed ranges. Resuming inside such a
split decompresses from the split's first frame instead of the file's start.
"""

from __future__ import annotations

from typing import IO

import zstandard

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


def group_frames(frames: list[tuple[int, int, int, int]],
                 split_bytes: int) -> list[tuple[int, int, int, int]]:
    """Consecutive frames joined into ranges of at least `split_bytes` compressed bytes."""
    groups: list[tuple[int, int, int, int]] = []
    for start, end, dstart, dend in frames:
        if groups and groups[-1][1] - groups[-1][0] < split_bytes:
            first = groups.pop()
            groups.append((first[0], end, first[2], dend))
        else:
            groups.append((start, end, dstart, dend))
    return groups
