"""Storage layer: listing and splitting sources, one reader module per format."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mixer.core.records import (
    EncodedAudio,
    EncodedImage,
    EncodedVideo,
    FileEntry,
    Reader,
    Record,
    Split,
)
from mixer.sources.boundary import read_records
from mixer.sources.formats.registry import FORMATS, Format, infer_format
from mixer.sources.listing import SourceTable, list_source
from mixer.sources.storage import IO_STATS, Storage, filesystem

READERS: dict[str, Reader] = {name: fmt.reader for name, fmt in FORMATS.items()}


def read_split(*, entry: FileEntry, text_field: str | None, **kwargs: Any) -> Iterator[Record]:
    """Records of one split through the reader of its format; every failure is a record
    carrying a `DataError` (see `boundary.py`). `text_field` None: the format's default.
    Pre-tokenized formats need `tokenizer=` (a `TokenizerInfo`); the others ignore it."""
    fmt = FORMATS[entry.format]
    return read_records(fmt, entry=entry, text_field=fmt.text_field(text_field), **kwargs)


__all__ = [
    "FORMATS",
    "IO_STATS",
    "READERS",
    "EncodedAudio",
    "EncodedImage",
    "EncodedVideo",
    "FileEntry",
    "Format",
    "Record",
    "SourceTable",
    "Split",
    "Storage",
    "filesystem",
    "infer_format",
    "list_source",
    "read_split",
]
