"""What the pre-tokenized formats (`megatron`, `npy`) share: exact range reads, id checks and
the EOS/BOS rule that makes a stored document look like one the `Encoder` made.

A stored document's ids pass through unchanged except: EOS is appended when it does not end
with EOS, and BOS is prepended when the tokenizer's own rule adds one (`TokenizerInfo.bos_id`)
and it does not start with BOS. A document with nothing between those (no ids, or only
EOS/BOS) is empty and skipped, as blank lines of text are. A token counts as
`BYTES_PER_TOKEN` bytes against `shuffle_window_bytes` and `max_document_bytes` (about what
its text would take).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from mixer.core.errors import DataError
from mixer.core.records import FileEntry

if TYPE_CHECKING:
    from mixer.core.token_info import TokenizerInfo

BYTES_PER_TOKEN = 4


def read_range(storage: Any, entry: FileEntry, start: int, size: int) -> bytes:
    """Exactly bytes [start, start + size) of a file; only those are fetched remotely."""
    if size <= 0:
        return b""
    with storage.open(entry, end_hint=start + size) as f:
        f.seek(start)
        data = f.read(size)
    if len(data) != size:
        raise DataError(
            f"file is truncated: wanted bytes [{start}, {start + size}), it has {entry.size}",
            source=storage.source,
            file=entry.url,
            location=f"byte offset {start}",
            reason="corrupt",
        )
    return data


def require_tokenizer(info: TokenizerInfo | None, fmt: str) -> TokenizerInfo:
    if info is None:
        raise ValueError(
            f"format {fmt} needs the tokenizer's EOS id and vocabulary size "
            "(read_split(..., tokenizer=...))"
        )
    return info


def first_bad_id(ids: np.ndarray, vocab_size: int) -> int | None:
    """Position of the first id outside [0, vocab_size), or None."""
    if not len(ids) or (int(ids.max()) < vocab_size and int(ids.min()) >= 0):
        return None
    return int(np.flatnonzero((ids < 0) | (ids >= vocab_size))[0])


def bad_id_error(
    ids: np.ndarray, at: int, info: TokenizerInfo, *, source: str, file: str, where: str
) -> DataError:
    return DataError(
        f"token id {int(ids[at])} is outside the tokenizer's vocabulary "
        f"(size {info.vocab_size}); was the file made with another tokenizer?",
        source=source,
        file=file,
        location=where,
        reason="bad_tokens",
    )


def finish_document(ids: np.ndarray, info: TokenizerInfo) -> np.ndarray | None:
    """The document's final ids (EOS appended, BOS prepended by the rule above), or None for
    an empty document: `ids` itself, in its stored dtype, when they already are final (packers
    copy them into int64 rows), else a new int64 array."""
    eos, bos = info.eos_id, info.bos_id
    start = 1 if bos is not None and len(ids) and int(ids[0]) == bos else 0
    stop = len(ids) - 1 if len(ids) > start and int(ids[-1]) == eos else len(ids)
    if stop <= start:
        return None
    head = 0 if bos is None or start else 1
    tail = 0 if stop < len(ids) else 1
    if not head and not tail:
        return ids
    out = np.empty(len(ids) + head + tail, dtype=np.int64)
    out[head : head + len(ids)] = ids
    if bos is not None and head:
        out[0] = bos
    if tail:
        out[-1] = eos
    return out


def too_long_error(tokens: int, max_bytes: int, *, source: str, file: str, where: str) -> DataError:
    return DataError(
        f"document of {tokens} tokens is longer than max_document_bytes "
        f"({max_bytes}, at {BYTES_PER_TOKEN} bytes per token)",
        source=source,
        file=file,
        location=where,
        reason="too_long",
    )
