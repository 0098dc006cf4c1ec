"""Storage layer: listing and splitting sources, one reader module per format."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mixer.sources.base import FileEntry, Reader, Record, Split
from mixer.sources.boundary import read_records
from mixer.sources.jsonl import read_jsonl, read_jsonl_gz, read_jsonl_zst
from mixer.sources.listing import SourceTable, list_source
from mixer.sources.parquet import read_parquet
from mixer.sources.storage import IO_STATS, Storage, filesystem
from mixer.sources.text import read_text

READERS: dict[str, Reader] = {
    "jsonl": read_jsonl,
    "jsonl.gz": read_jsonl_gz,
    "jsonl.zst": read_jsonl_zst,
    "parquet": read_parquet,
    "text": read_text,
}


def read_split(*, entry: FileEntry, **kwargs: Any) -> Iterator[Record]:
    """Records of one split through the reader of its format; every failure is a record
    carrying a `DataError` (see `boundary.py`)."""
    return read_records(READERS[entry.format], entry=entry, **kwargs)


__all__ = ["IO_STATS", "READERS", "FileEntry", "Record", "SourceTable", "Split", "Storage",
           "filesystem", "list_source", "read_split"]
