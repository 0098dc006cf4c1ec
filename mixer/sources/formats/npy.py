"""Flat token arrays (`format: npy`), as OLMo stores them: documents separated by EOS.

A file is either a real `.npy` (NumPy header; its dtype, uint16 or uint32, decides) or
OLMo's headerless raw memmap, whose dtype the source's `token_dtype` names. Splits are
token ranges of about `split_bytes` bytes (`Split.start`/`end` are byte offsets in the file,
on token boundaries); a document belongs to the split in which it starts, and the last one
reads on to the document's EOS, so every document is read once over all splits. A record's
offset is the byte offset of its first token.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

import numpy as np
from numpy.lib import format as npformat

from mixer.core.errors import DataError
from mixer.core.records import FileEntry, Record, Split
from mixer.sources.formats.tokens import (
    BYTES_PER_TOKEN,
    bad_id_error,
    finish_document,
    first_bad_id,
    read_range,
    require_tokenizer,
    too_long_error,
)

if TYPE_CHECKING:
    from mixer.core.token_info import TokenizerInfo
    from mixer.sources.formats.registry import SplitRequest

TOKEN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
_MAGIC = b"\x93NUMPY"
_CHUNK_TOKENS = 1 << 20
_TAIL_TOKENS = 1 << 14  # past a split's end only the rest of one document is needed


@dataclass(frozen=True)
class Layout:
    """Where a file's tokens lie: from byte `offset`, `count` ids of `dtype`."""

    offset: int
    dtype: np.dtype
    count: int

    @property
    def end(self) -> int:
        return self.offset + self.count * self.dtype.itemsize

    def token(self, byte: int) -> int:
        return (byte - self.offset) // self.dtype.itemsize


def _header(storage, entry: FileEntry, head: bytes) -> tuple[int, np.dtype, int]:
    """(data offset, dtype, element count) from a NumPy header."""
    major = head[6]
    if major not in (1, 2):
        raise ValueError(f"NumPy format version {major}.{head[7]} is not supported (1 or 2)")
    fixed = 10 if major == 1 else 12
    length = struct.unpack_from("<H" if major == 1 else "<I", head, 8)[0]
    f = io.BytesIO(read_range(storage, entry, 0, fixed + length))
    npformat.read_magic(f)
    reader = npformat.read_array_header_1_0 if major == 1 else npformat.read_array_header_2_0
    shape, fortran, dtype = reader(f, max_header_size=fixed + length)
    if fortran and len(shape) > 1:
        raise ValueError("a Fortran-ordered array is not a flat token array")
    return fixed + length, dtype, int(np.prod(shape, dtype=np.int64))


def layout(storage, entry: FileEntry) -> Layout:
    """The file's token layout; `ValueError` says why it is not a token array."""
    head = read_range(storage, entry, 0, min(entry.size, 12))
    if head.startswith(_MAGIC) and len(head) == 12:
        offset, dtype, count = _header(storage, entry, head)
        name = next((n for n, d in TOKEN_DTYPES.items() if d == dtype), None)
        if name is None:
            raise ValueError(
                f"the array's dtype is {dtype.str}; token arrays are uint16 or "
                "uint32 (little-endian)"
            )
        if entry.dtype and entry.dtype != name:
            raise ValueError(
                f"the file's header says {name} but the source's token_dtype is {entry.dtype}"
            )
        if offset + count * dtype.itemsize > entry.size:
            raise ValueError(f"file is truncated: its header promises {count} tokens")
        return Layout(offset, dtype, count)
    if not entry.dtype:
        raise ValueError(
            "a headerless .npy (a raw token array, as OLMo writes them): set the "
            "source's token_dtype (uint16 or uint32)"
        )
    dtype = TOKEN_DTYPES[entry.dtype]
    if entry.size % dtype.itemsize:
        raise ValueError(
            f"file size {entry.size} is not a multiple of {dtype.itemsize} bytes "
            f"({entry.dtype} tokens)"
        )
    return Layout(0, dtype, entry.size // dtype.itemsize)


def npy_splits(req: SplitRequest) -> list[Split]:
    """Token ranges of about `split_bytes` bytes."""
    lay = layout(req.storage, req.entry)
    size = lay.dtype.itemsize
    step = max(req.split_bytes // size, 1)
    return [
        Split(req.index, lay.offset + t * size, lay.offset + min(t + step, lay.count) * size)
        for t in range(0, lay.count, step)
    ]


def _documents(
    f: IO[bytes], lay: Layout, start: int, soft_end: int, eos: int, max_tokens: int
) -> Iterator[tuple[int, np.ndarray | None, int]]:
    """(byte offset, ids or None when longer than `max_tokens`, token count) of each document
    from byte `start`: up to and including its EOS, or to the end of the array."""
    size = lay.dtype.itemsize
    f.seek(start)
    at, doc_start, pending, count = start, start, [], 0
    while at < lay.end:
        want = min(_CHUNK_TOKENS * size, soft_end - at) if at < soft_end else _TAIL_TOKENS * size
        data = f.read(min(want, lay.end - at))
        if not data:
            raise DataError(
                f"file ends at byte {at}, before the {lay.count} tokens it holds", reason="corrupt"
            )
        chunk = np.frombuffer(data, lay.dtype)
        at += len(data)
        cut = 0
        for stop in np.flatnonzero(chunk == eos) + 1:
            count += int(stop) - cut
            ids = (
                None
                if count > max_tokens
                else (
                    chunk[cut:stop] if not pending else np.concatenate([*pending, chunk[cut:stop]])
                )
            )
            yield doc_start, ids, count
            doc_start += count * size
            pending, count, cut = [], 0, int(stop)
        count += len(chunk) - cut
        pending = [] if count > max_tokens else [*pending, chunk[cut:]]
    if count:
        yield doc_start, (None if count > max_tokens else np.concatenate(pending)), count


def read_npy(
    *,
    storage,
    entry: FileEntry,
    split: Split,
    source: str,
    text_field: str,
    max_bytes: int,
    index: int,
    offset: int,
    tokenizer: TokenizerInfo | None = None,
) -> Iterator[Record]:
    """Records of the documents that start in [split.start, split.end)."""
    info = require_tokenizer(tokenizer, "npy")
    lay = layout(storage, entry)
    size = lay.dtype.itemsize
    resume = index > 0 or offset > split.start
    start = offset if resume else split.start
    # A document that starts before the split (no EOS just before it) is the previous one's.
    skip_first = (
        not resume
        and start > lay.offset
        and int(np.frombuffer(read_range(storage, entry, start - size, size), lay.dtype)[0])
        != info.eos_id
    )
    with storage.open(entry, end_hint=split.end) as f:
        docs = _documents(
            f, lay, start, split.end, info.eos_id, max(max_bytes // BYTES_PER_TOKEN, 1)
        )
        for at, ids, count in docs:
            if skip_first:
                skip_first = False
                continue
            if at >= split.end:
                return
            where = f"token offset {lay.token(at)} (byte offset {at})"
            if ids is None:
                error = too_long_error(count, max_bytes, source=source, file=entry.url, where=where)
                yield Record(index, at, None, error)
                index += 1
                continue
            bad = first_bad_id(ids, info.vocab_size)
            if bad is not None:
                yield Record(
                    index,
                    at,
                    None,
                    bad_id_error(
                        ids,
                        bad,
                        info,
                        source=source,
                        file=entry.url,
                        where=f"token offset {lay.token(at) + bad} (byte offset {at + bad * size})",
                    ),
                )
                index += 1
                continue
            # (A copy: a view would keep the whole read chunk alive while the document waits.)
            tokens = finish_document(ids.copy() if ids.base is not None else ids, info)
            if tokens is None:
                continue  # two EOS in a row: an empty document, skipped like a blank line
            yield Record(index, at, None, tokens=tokens, chars=BYTES_PER_TOKEN * len(tokens))
            index += 1
