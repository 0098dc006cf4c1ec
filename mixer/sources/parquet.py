"""Parquet: one split per row group; only the text column is read."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow.parquet as pq

from mixer.errors import DataError
from mixer.sources.base import FileEntry, Record, Split


def row_groups(storage, entry: FileEntry) -> list[int]:
    """Row counts of each row group (reads only the footer)."""
    with storage.open(entry) as f:
        meta = pq.ParquetFile(f).metadata
        return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def _texts(column, start: int, step: int = 64) -> Iterator[tuple[int, object]]:
    """(row, value) from `start`, converted to Python a few rows at a time: a paused reader
    then holds the row group's Arrow buffer, not a second copy of it as Python strings."""
    for first in range(start, len(column), step):
        yield from enumerate(column.slice(first, step).to_pylist(), start=first)


def read_parquet(*, storage, entry: FileEntry, split: Split, source: str, text_field: str,
                 max_bytes: int, index: int, offset: int) -> Iterator[Record]:
    """Records of one row group, from row `index` of that group."""
    group = split.start
    with storage.open(entry) as f:
        try:
            pf = pq.ParquetFile(f)
            if text_field not in pf.schema_arrow.names:
                raise KeyError(text_field)
            column = pf.read_row_group(group, columns=[text_field]).column(0)
        except KeyError:
            err = DataError(f"missing text field {text_field!r} (columns: "
                            f"{', '.join(pf.schema_arrow.names)})", source=source,
                            file=entry.url, location=f"row group {group}")
            yield Record(index, index, None, err)
            return
        except Exception as exc:  # pyarrow raises several types for corrupt files
            err = DataError(f"cannot read parquet row group: {exc}", source=source,
                            file=entry.url, location=f"row group {group}")
            yield Record(index, index, None, err)
            return
    for row, text in _texts(column, index):
        where = f"row group {group}, row {row}"
        if not isinstance(text, str):
            err = DataError(f"text field {text_field!r} is {type(text).__name__}, not a string",
                            source=source, file=entry.url, location=where)
            yield Record(row, row, None, err)
        elif len(text) > max_bytes and len(text.encode()) > max_bytes:
            err = DataError(f"record longer than max_document_bytes ({max_bytes})",
                            source=source, file=entry.url, location=where)
            yield Record(row, row, None, err)
        else:
            yield Record(row, row, text)
