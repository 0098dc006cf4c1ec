"""Parquet: one split per row group; only the text column is read."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mixer.core.errors import DataError, missing_text_field
from mixer.core.records import FileEntry, Record, Split

_ROWS = 64  # rows decoded at a time


def row_groups(storage, entry: FileEntry) -> list[int]:
    """Row counts of each row group (reads only the footer)."""
    with storage.open(entry) as f:
        meta = pq.ParquetFile(f).metadata
        return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def read_parquet(
    *,
    storage,
    entry: FileEntry,
    split: Split,
    source: str,
    text_field: str,
    max_bytes: int,
    index: int,
    offset: int,
) -> Iterator[Record]:
    """Records of one row group, from row `index` of that group.

    The group's column is decoded 64 rows at a time: a reader paused in the middle of a
    group (a full shuffle window) holds its pages, not the whole decoded group. A bad value
    (not valid UTF-8, too long, not a string) is its own row's error; the rows beside it are
    read as usual."""
    try:
        yield from _read_group(
            storage=storage,
            entry=entry,
            group=split.start,
            source=source,
            text_field=text_field,
            max_bytes=max_bytes,
            index=index,
        )
    finally:
        # pyarrow's default pool (mimalloc) keeps the pages a closed reader freed: 27 MB of
        # a num_workers 0 process on the benchmark corpus (benchmarks/memory.py); ~10 µs.
        pa.default_memory_pool().release_unused()


def _read_group(
    *,
    storage,
    entry: FileEntry,
    group: int,
    source: str,
    text_field: str,
    max_bytes: int,
    index: int,
) -> Iterator[Record]:
    with storage.open(entry) as f:
        row = 0
        columns: list[str] = []
        try:
            pf = pq.ParquetFile(f)
            columns = list(pf.schema_arrow.names)
            if text_field not in columns:
                raise KeyError(text_field)
            batches = pf.iter_batches(
                batch_size=_ROWS, row_groups=[group], columns=[text_field], use_threads=False
            )
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                first, row = row, row + batch.num_rows
                if row <= index:
                    continue  # before the cursor: skipped without converting
                start = max(index, first)
                column = batch.column(0).slice(start - first)
                for at, value in enumerate(_values(column, max_bytes), start=start):
                    yield _record(value, at, source, text_field, max_bytes, entry, group)
        except KeyError:
            err = DataError(
                missing_text_field(text_field, columns, "columns"),
                source=source,
                file=entry.url,
                location=f"row group {group}",
                reason="bad_text",
            )
            yield Record(index, index, None, err)
        except Exception as exc:  # pyarrow raises several types for corrupt files
            at = max(index, row)
            err = DataError(
                f"cannot read parquet row group: {exc}",
                source=source,
                file=entry.url,
                location=f"row group {group}, row {at}",
                reason="corrupt",
            )
            yield Record(at, at, None, err)


class _TooLong:
    """A value longer than `max_document_bytes`, never converted to a Python string."""


class _BadUtf8:
    """A string or binary value whose bytes are not valid UTF-8."""

    def __init__(self, error: UnicodeDecodeError) -> None:
        self.error = error


_TEXTUAL = (
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
)


def _values(column: pa.Array, max_bytes: int) -> list:
    """The column's values as Python objects, one per row: a string for each valid text;
    `_TooLong` or `_BadUtf8` in place of a value that cannot be one (the others unaffected).

    Binary columns hold text as UTF-8 bytes (as some exporters write it): they are decoded."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if not any(test(column.type) for test in _TEXTUAL):
        return column.to_pylist()  # not text: each row is its own error
    long = [n is not None and n > max_bytes for n in pc.binary_length(column).to_pylist()]
    if not any(long):
        return _texts(column)
    # Too long: left out before conversion (never copied into Python), by converting the
    # runs of rows between them (zero-copy slices: a mask array would import pandas).
    values: list = []
    start = 0
    for row, too_long in enumerate([*long, True]):
        if too_long:
            if row > start:
                values += _texts(column.slice(start, row - start))
            if row < len(long):
                values.append(_TooLong())
            start = row + 1
    return values


def _texts(column: pa.Array) -> list:
    """A text column's values: strings, with `_BadUtf8` for values that are not UTF-8."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        try:
            return column.to_pylist()
        except UnicodeDecodeError:  # some value is not UTF-8: decode row by row
            binary = pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
            return [_decode(v) for v in column.view(binary).to_pylist()]
    return [_decode(v) for v in column.to_pylist()]


def _decode(value: bytes | None) -> str | _BadUtf8 | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _BadUtf8(exc)


def _record(
    value, row: int, source: str, text_field: str, max_bytes: int, entry: FileEntry, group: int
) -> Record:
    where = f"row group {group}, row {row}"
    if isinstance(value, str):
        return Record(row, row, value)
    reason = "bad_text"
    if isinstance(value, _TooLong):
        message, reason = f"record longer than max_document_bytes ({max_bytes})", "too_long"
    elif isinstance(value, _BadUtf8):
        message = (
            f"text field {text_field!r} is not valid UTF-8 ({value.error.reason} at byte "
            f"{value.error.start} of the value)"
        )
    else:
        message = f"text field {text_field!r} is {type(value).__name__}, not a string"
    return Record(
        row,
        row,
        None,
        DataError(message, source=source, file=entry.url, location=where, reason=reason),
    )
