"""An entry's token file (.bin) read lazily by blocks, each checked against its CRC-32.

The token cache stores a CRC-32 per block of the .bin in the entry's commit, so reading a
window of a split reads (and checks) only the blocks its documents lie in, never the whole
file.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

import numpy as np


class CorruptBlock(ValueError):
    """A block of an entry's .bin that does not match its CRC-32 (or cannot be read whole)."""


class TokenFile:
    """An entry's .bin, read by blocks of `block` bytes, each checked against its CRC-32 when
    read; the blocks before the one last asked for are let go (a replay only moves forward).

    Blocks are read with ranged reads, also locally: a memory map would hold a file
    descriptor for as long as any of its documents lives (one per lane and source, at least).
    """

    def __init__(
        self, fs: Any, path: str, dtype: np.dtype, size: int, block: int, crcs: list[int]
    ) -> None:
        if block <= 0 or block % 8 or len(crcs) != -(-size // block):
            raise ValueError("the .bin's blocks do not match its size")
        self.local = is_local(fs)
        if self.local and os.path.getsize(path) != size:
            raise ValueError("the .bin's size does not match its commit")
        self.fs, self.path, self.dtype, self.size = fs, path, dtype, size
        self.block, self.crcs = block, crcs
        self.blocks: dict[int, np.ndarray] = {}
        self.per = block // dtype.itemsize  # elements per block
        self._last = (np.zeros(0, dtype), 0, 0)  # the block last read: tokens, first, end

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Elements [start, stop) of the file (a view where they lie in one block)."""
        held, lo, hi = self._last
        if lo <= start and stop <= hi:  # most documents: inside the block read last
            return held[start - lo : stop - lo]
        if stop <= start:
            return np.zeros(0, self.dtype)
        per = self.per
        first, last = start // per, (stop - 1) // per
        for block in [b for b in self.blocks if b < first]:
            del self.blocks[block]
        parts = [
            self._block(b)[max(start - b * per, 0) : stop - b * per] for b in range(first, last + 1)
        ]
        self._last = (self.blocks[last], last * per, last * per + len(self.blocks[last]))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def check_all(self) -> None:
        """Read and check every block (raises CorruptBlock)."""
        for block in range(len(self.crcs)):
            self._block(block)
            del self.blocks[block]
        self._last = (np.zeros(0, self.dtype), 0, 0)

    def _block(self, block: int) -> np.ndarray:
        held = self.blocks.get(block)
        if held is not None:
            return held
        start = block * self.block
        end = min(start + self.block, self.size)
        try:
            if self.local:
                with open(self.path, "rb", buffering=0) as f:
                    data = os.pread(f.fileno(), end - start, start)
            else:
                data = self.fs.cat_file(self.path, start=start, end=end)
        except OSError as exc:
            raise CorruptBlock(f"block {block} of the .bin cannot be read: {exc}") from None
        if len(data) != end - start:
            raise CorruptBlock(f"block {block} of the .bin is truncated")
        if crc(data) != self.crcs[block]:
            raise CorruptBlock(f"block {block} of the .bin does not match its CRC-32")
        held = self.blocks[block] = np.frombuffer(data, self.dtype)
        return held


def crc(data: Any) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def is_local(fs: Any) -> bool:
    """Whether `fs` is fsspec's local filesystem."""
    return (
        getattr(fs, "protocol", None) in ("file", ("file", "local"))
        or type(fs).__name__ == "LocalFileSystem"
    )
