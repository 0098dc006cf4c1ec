"""Megatron-LM's indexed dataset: token ids in a `.bin` file, their layout in a `.idx` file.

The `.idx` layout (MMIDIDX version 1, little-endian), as Megatron-LM writes it:

    9 bytes   magic b"MMIDIDX\\x00\\x00"
    uint64    version (1)
    uint8     dtype code of the .bin (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
              6 float64, 7 float32, 8 uint16)
    uint64    sequence count S
    uint64    document count D (entries of document_indices, i.e. documents + 1)
    int32[S]  sequence lengths (elements)
    int64[S]  sequence pointers (byte offsets into the .bin)
    int64[D]  document indices: document d is sequences [idx[d], idx[d+1])

mixer writes one sequence per document, so document d is sequence d; other writers may
split a document into several (contiguous) sequences. The token cache and `format: megatron`
both use this module; `format: megatron` reads only the index slice of the split it reads
(`read_index_slice`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, document entries
DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
CODES = {dtype: code for code, dtype in DTYPES.items()}
TOKEN_CODES = (1, 3, 4, 5, 8)  # integer dtypes a token file may use (int8 cannot hold ids)


class IndexFormatError(ValueError):
    """A `.idx` file that is not a valid MMIDIDX version 1 index (message says why)."""


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned-enough dtype Megatron would pick: uint16 below 65,500 ids."""
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


@dataclass(frozen=True)
class Index:
    """A parsed `.idx`: per sequence its length and byte pointer; document boundaries."""

    dtype: np.dtype
    lengths: np.ndarray  # int32[S]
    pointers: np.ndarray  # int64[S]
    documents: np.ndarray  # int64[D]

    @property
    def num_documents(self) -> int:
        return max(len(self.documents) - 1, 0)

    def document_span(self, doc: int) -> tuple[int, int]:
        """(first element, element count) of document `doc` in the .bin, its sequences being
        contiguous (as every writer lays them out)."""
        first, last = int(self.documents[doc]), int(self.documents[doc + 1])
        if last <= first:
            return 0, 0
        start = int(self.pointers[first]) // self.dtype.itemsize
        count = int(self.lengths[first:last].sum())
        return start, count

    def data_bytes(self) -> int:
        """Bytes of .bin the index covers."""
        if not len(self.lengths):
            return 0
        return int(self.pointers[-1]) + int(self.lengths[-1]) * self.dtype.itemsize


def parse_header(data: bytes | memoryview) -> tuple[np.dtype, int, int]:
    """(dtype, sequence count, document-index entries) of an index's first `HEADER.size`
    bytes; `IndexFormatError` says what is wrong."""
    if len(data) < HEADER.size:
        raise IndexFormatError(
            f"index is {len(data)} bytes, shorter than its {HEADER.size}-byte header"
        )
    magic, version, code, sequences, entries = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise IndexFormatError(f"not a Megatron index: magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise IndexFormatError(f"index version {version} is not supported (only {VERSION})")
    if code not in DTYPES:
        raise IndexFormatError(f"unknown dtype code {code}")
    return DTYPES[code], sequences, entries


def _check(
    lengths: np.ndarray, pointers: np.ndarray, documents: np.ndarray, first: int, last: int
) -> None:
    """Document indices from `first` to `last` in order; no negative length or pointer."""
    if len(documents) and (
        documents[0] != first or documents[-1] != last or np.any(np.diff(documents) < 0)
    ):
        raise IndexFormatError("document indices do not run from 0 to the sequence count in order")
    if len(lengths) and (np.any(lengths < 0) or np.any(pointers < 0)):
        raise IndexFormatError("negative sequence length or pointer")


def parse_index(data: bytes | memoryview) -> Index:
    """Parse a whole `.idx` file's bytes; `IndexFormatError` says what is wrong."""
    dtype, sequences, entries = parse_header(data)
    need = HEADER.size + sequences * 12 + entries * 8
    if len(data) < need:
        raise IndexFormatError(f"index is truncated: {len(data)} bytes, its header promises {need}")
    offset = HEADER.size
    lengths = np.frombuffer(data, np.int32, sequences, offset)
    offset += sequences * 4
    pointers = np.frombuffer(data, np.int64, sequences, offset)
    offset += sequences * 8
    documents = np.frombuffer(data, np.int64, entries, offset)
    _check(lengths, pointers, documents, 0, sequences)
    return Index(dtype, lengths, pointers, documents)


def read_index_slice(read: Callable[[int, int], bytes], first: int, last: int) -> Index:
    """Documents [first, last) of an index, reading only their bytes: `read(offset, size)`
    returns that range of the `.idx`. The slice's document `d` is the file's `first + d`."""
    dtype, sequences, entries = parse_header(read(0, HEADER.size))
    if not 0 <= first <= last <= entries - 1:
        raise IndexFormatError(
            f"documents [{first}, {last}) are not in the index ({max(entries - 1, 0)} documents)"
        )
    documents = np.frombuffer(
        read(HEADER.size + sequences * 12 + first * 8, (last - first + 1) * 8), np.int64
    )
    s0, s1 = int(documents[0]), int(documents[-1])
    if not 0 <= s0 <= s1 <= sequences:
        raise IndexFormatError(f"document indices point past the {sequences} sequences")
    lengths = np.frombuffer(read(HEADER.size + s0 * 4, (s1 - s0) * 4), np.int32)
    pointers = np.frombuffer(read(HEADER.size + sequences * 4 + s0 * 8, (s1 - s0) * 8), np.int64)
    _check(lengths, pointers, documents, s0, s1)
    return Index(dtype, lengths, pointers, documents - s0)


def encode_index(dtype: np.dtype, lengths: np.ndarray) -> bytes:
    """The `.idx` bytes of one sequence per document, documents laid out back to back."""
    dtype = np.dtype(dtype)
    lengths = np.asarray(lengths, dtype=np.int32)
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    documents = np.arange(len(lengths) + 1, dtype=np.int64)
    header = HEADER.pack(MAGIC, VERSION, CODES[dtype], len(lengths), len(documents))
    return header + lengths.tobytes() + pointers.tobytes() + documents.tobytes()


class IndexedWriter:
    """Appends documents to an open `.bin`; `index()` is the matching `.idx`."""

    def __init__(self, out: BinaryIO, dtype: np.dtype) -> None:
        self.out = out
        self.dtype = np.dtype(dtype)
        self.lengths: list[int] = []

    def add(self, tokens: np.ndarray) -> None:
        self.out.write(np.asarray(tokens).astype(self.dtype, copy=False).tobytes())
        self.lengths.append(len(tokens))

    def index(self) -> bytes:
        return encode_index(self.dtype, np.array(self.lengths, dtype=np.int32))
