"""Megatron-LM indexed datasets (`format: megatron`): a `.bin` of token ids and its `.idx`.

The source's glob lists the `.bin` files; each one's `.idx` (same stem) is listed with it and
checked for changes like the `.bin`. Splits are document ranges of about `split_bytes` token
bytes (`Split.start`/`end` are document numbers, `records` the non-empty documents), and a
record's offset is its document number in the file. Reading a split fetches only its slice
of the `.idx` and its byte range of the `.bin`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

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
from mixer.sources.indexed import CODES, TOKEN_CODES, Index, parse_index, read_index_slice

if TYPE_CHECKING:
    from mixer.core.token_info import TokenizerInfo
    from mixer.sources.formats.registry import SplitRequest


def index_url(url: str) -> str:
    """The `.idx` beside a `.bin`."""
    if not url.lower().endswith(".bin"):
        raise ValueError(
            "format megatron lists the .bin files of .bin/.idx pairs; this file "
            "does not end in .bin"
        )
    return url[:-4] + ".idx"


def _index_of(entry: FileEntry) -> FileEntry:
    if entry.index is None:
        raise ValueError("the .idx of this .bin was not listed")
    return entry.index


def _document_tokens(index: Index) -> np.ndarray:
    """Tokens of each document (sum of its sequences' lengths)."""
    ends = np.zeros(len(index.lengths) + 1, dtype=np.int64)
    np.cumsum(index.lengths, out=ends[1:])
    return ends[index.documents[1:]] - ends[index.documents[:-1]]


def _check_sizes(index: Index, entry: FileEntry) -> None:
    if CODES[index.dtype] not in TOKEN_CODES:
        raise ValueError(f"the index's dtype {index.dtype} cannot hold token ids")
    if index.data_bytes() > entry.size:
        raise ValueError(
            f"the .bin has {entry.size} bytes, its index describes {index.data_bytes()}"
        )


def megatron_splits(req: SplitRequest) -> list[Split]:
    """Document ranges of about `split_bytes` token bytes (whole documents)."""
    idx_entry = _index_of(req.entry)
    index = parse_index(read_range(req.storage, idx_entry, 0, idx_entry.size))
    _check_sizes(index, req.entry)
    tokens = _document_tokens(index)
    ends = np.cumsum(tokens * index.dtype.itemsize)
    splits, start, before = [], 0, 0
    while start < len(tokens):
        stop = int(np.searchsorted(ends, before + req.split_bytes, side="left")) + 1
        stop = min(max(stop, start + 1), len(tokens))
        records = int(np.count_nonzero(tokens[start:stop]))
        if records:
            splits.append(Split(req.index, start, stop, records))
        start, before = stop, int(ends[stop - 1])
    return splits


def read_megatron(
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
    """Records of documents [split.start, split.end), from document `offset` on resume."""
    info = require_tokenizer(tokenizer, "megatron")
    first = offset if index > 0 else split.start
    if first >= split.end:
        return
    idx = read_index_slice(
        functools.partial(read_range, storage, _index_of(entry)), first, split.end
    )
    _check_sizes(idx, entry)
    itemsize = idx.dtype.itemsize
    # Python ints: per-document numpy scalar access would cost more than the reading.
    documents, lengths = idx.documents.tolist(), idx.lengths.tolist()
    pointers = idx.pointers.tolist()
    with storage.open(entry, end_hint=idx.data_bytes()) as f:
        for doc in range(first, split.end):
            s0, s1 = documents[doc - first], documents[doc - first + 1]
            count = sum(lengths[s0:s1])
            where = f"document {doc}"
            if count == 0:
                continue
            if count * BYTES_PER_TOKEN > max_bytes:
                yield Record(
                    index,
                    doc,
                    None,
                    too_long_error(count, max_bytes, source=source, file=entry.url, where=where),
                )
                index += 1
                continue
            parts = []
            for seq in range(s0, s1):
                f.seek(pointers[seq])
                parts.append(np.frombuffer(f.read(lengths[seq] * itemsize), idx.dtype))
            raw = parts[0] if len(parts) == 1 else np.concatenate(parts)
            if len(raw) != count:
                raise DataError(
                    f"the .bin ends inside document {doc}",
                    source=source,
                    file=entry.url,
                    location=where,
                    reason="corrupt",
                )
            bad = first_bad_id(raw, info.vocab_size)
            if bad is not None:
                start = pointers[s0] // itemsize
                yield Record(
                    index,
                    doc,
                    None,
                    bad_id_error(
                        raw,
                        bad,
                        info,
                        source=source,
                        file=entry.url,
                        where=f"{where}, token offset {start + bad} of the .bin",
                    ),
                )
                index += 1
                continue
            tokens = finish_document(raw, info)
            if tokens is None:
                continue  # only EOS/BOS: empty, skipped like a blank line
            yield Record(index, doc, None, tokens=tokens, chars=BYTES_PER_TOKEN * len(tokens))
            index += 1
