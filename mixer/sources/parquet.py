"""Parquet: one split per row group; only the text column is read."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow.parquet as pq

from mixer.errors import DataError
from mixer.sources.base import FileEntry, Record, Split

_ROWS = 64   # rows decoded at a time


def row_groups(storage, entry: FileEntry) -> list[int]:
    """Row counts of each row group (reads only the footer)."""
    with storage.open(entry) as f:
        meta = pq.ParquetFile(f).metadata
        return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def read_parquet(*, storage, entry: FileEntry, split: Split, source: str, text_field: str,
                 max_bytes: int, index: int, offset: int) -> Iterator[Record]:
    """Records of one row group, from row `index` of that group.

    The group's column is decoded 64 rows at a time: a reader paused in the middle of a
    group (a full shuffle window) holds its pages, not the whole decoded group."""
    group = split.start
    with storage.open(entry) as f:
        row = 0
        try:
            pf = pq.ParquetFile(f)
            if text_field not in pf.schema_arrow.names:
                raise KeyError(text_field)
            batches = pf.iter_batches(batch_size=_ROWS, row_groups=[group],
                                      columns=[text_field], use_threads=False)
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                first, row = row, row + batch.num_rows
                if row <= index:
                    continue   # before the cursor: skipped without converting
                values = batch.column(0).slice(max(index - first, 0)).to_pylist()
                yield from _records(values, max(index, first), source, text_field, max_bytes,
                                    entry, group)
        except KeyError:
            err = DataError(f"missing text field {text_field!r} (columns: "
                            f"{', '.join(pf.schema_arrow.names)})", source=source,
                            file=entry.url, location=f"row group {group}")
            yield Record(index, index, None, err)
        except Exception as exc:  # pyarrow raises several types for corrupt files
            at = max(index, row)
            err = DataError(f"cannot read parquet row group: {exc}", source=source,
                            file=entry.url, location=f"row group {group}, row {at}")
            yield Record(at, at, None, err)


def _records(values: list, start: int, source: str, text_field: str, max_bytes: int,
             entry: FileEntry, group: int) -> Iterator[Record]:
    for row, text in enumerate(values, start=start):
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
