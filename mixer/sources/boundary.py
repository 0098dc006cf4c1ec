"""The one boundary between readers and the rest of mixer.

Whatever a reader raises (a file deleted after listing, a codec error, a parser's
`RecursionError`, a bug in a third-party library) leaves this module as a `DataError` naming
the source, the file and the offset reached, carried by an error record that the stream
raises or skips and counts. Texts are checked here too: a string that is not valid Unicode
(a lone surrogate from a JSON `"\\ud800"` escape) never reaches the tokenizer.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pyarrow
import zstandard

from mixer.core.errors import DataError, SkipReason
from mixer.core.records import FileEntry, Record, Split
from mixer.sources.formats.registry import Format
from mixer.sources.storage import redact

if TYPE_CHECKING:
    from mixer.core.token_info import TokenizerInfo


# Characters of text checked per UTF-8 encoding (the copy it makes is dropped at once).
_CHECK_CHARS = 1 << 20


def _invalid_text(text: Any, piece: int = _CHECK_CHARS) -> str | None:
    """Why `text` cannot be tokenized, or None when it can (checked `piece` characters at a
    time)."""
    if not isinstance(text, str):
        return f"text is {type(text).__name__}, not a string"
    if text.isascii():  # O(1) in CPython; most text is, and cannot hold a surrogate
        return None
    # Encoding to UTF-8 is what finds a surrogate fastest (~7x a regex search), a megabyte
    # of characters at a time.
    for start in range(0, len(text), piece):
        try:
            (text[start : start + piece] if len(text) > piece else text).encode()
        except UnicodeEncodeError as exc:
            return (
                f"text is not valid Unicode (surrogates not allowed at character "
                f'{start + exc.start}; e.g. a lone surrogate escape such as "\\ud800" '
                "in JSON)"
            )
    return None


def read_records(
    fmt: Format,
    *,
    storage: Any,
    entry: FileEntry,
    split: Split,
    source: str,
    text_field: str,
    max_bytes: int,
    index: int,
    offset: int,
    tokenizer: TokenizerInfo | None = None,
) -> Generator[Record, None, None]:
    """The reader's records of `split` from a cursor; failures become error records.

    `tokenizer` reaches only the readers of pre-tokenized formats (EOS, BOS, vocabulary).
    After an error the reader cannot continue from (anything it raises), the split ends.
    """
    position = offset
    extra = {"tokenizer": tokenizer} if fmt.pretokenized else {}
    try:
        records = fmt.reader(
            storage=storage,
            entry=entry,
            split=split,
            source=source,
            text_field=text_field,
            max_bytes=max_bytes,
            index=index,
            offset=offset,
            **extra,
        )
        for record in records:
            index, position = record.index + 1, record.offset
            if record.error is None and record.tokens is None:
                why = _invalid_text(record.text)
                if why is not None:
                    err = DataError(
                        why,
                        source=source,
                        file=entry.url,
                        location=fmt.describe_offset(split, record.offset),
                        reason="bad_text",
                    )
                    record = Record(record.index, record.offset, None, err)
            yield record
    except GeneratorExit:  # closed early (or at interpreter exit, when globals are gone)
        raise
    except DataError as exc:  # raised by storage (not found, changed, retries spent)
        if exc.source is None:
            exc = DataError(
                exc.message,
                source=source,
                file=entry.url,
                location=fmt.describe_offset(split, position),
                reason=exc.reason,
            )
        yield Record(index, position, None, exc)
    except Exception as exc:  # anything else a reader or its libraries raise
        message = redact(f"cannot read: {type(exc).__name__}: {exc}", storage.storage_options)
        yield Record(
            index,
            position,
            None,
            DataError(
                message,
                source=source,
                file=entry.url,
                location=fmt.describe_offset(split, position),
                reason=_reason_of(exc),
            ),
        )


def probe_ratio(
    fmt: Format, *, storage: Any, entry: FileEntry, source: str
) -> tuple[float, DataError | None]:
    """`fmt.compression_ratio` of a file through this boundary: the ratio (of the bytes
    before any damage), and a `DataError` naming the file and the stored byte offset where
    it stopped decoding, or why it could not be read (None: it decoded)."""
    try:
        ratio, damaged = fmt.compression_ratio(storage, entry)
    except DataError as exc:  # raised by storage (not found, changed, retries spent)
        if exc.source is not None:
            return 0.0, exc
        return 0.0, DataError(exc.message, source=source, file=entry.url, reason=exc.reason)
    except Exception as exc:
        message = redact(f"cannot read: {type(exc).__name__}: {exc}", storage.storage_options)
        return 0.0, DataError(message, source=source, file=entry.url, reason=_reason_of(exc))
    if damaged is None:
        return ratio, None
    return ratio, DataError(
        f"{fmt.compression} data is damaged (it stops decoding)",
        source=source,
        file=entry.url,
        location=f"stored byte offset {damaged}",
        reason="corrupt",
    )


# What a reader's libraries raise for data that decodes wrongly (the rest: unreadable).
_CODEC_ERRORS: tuple[type[BaseException], ...] = (
    zlib.error,
    zstandard.ZstdError,
    EOFError,
    gzip.BadGzipFile,
    pyarrow.ArrowInvalid,
    UnicodeError,
    struct.error,
)


def _reason_of(exc: BaseException) -> SkipReason:
    """The reason of a failure a reader did not name itself, by its type."""
    return "corrupt" if isinstance(exc, _CODEC_ERRORS) else "unreadable"
