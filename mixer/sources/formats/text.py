"""Plain text: one document per file."""

from __future__ import annotations

from collections.abc import Iterator

from mixer.core.errors import DataError
from mixer.core.records import FileEntry, Record, Split


def read_text(*, storage, entry: FileEntry, split: Split, source: str, text_field: str,
              max_bytes: int, index: int, offset: int) -> Iterator[Record]:
    """The whole file as one record."""
    if index > 0:
        return
    if entry.size > max_bytes:
        yield Record(0, 0, None, DataError(f"document longer than max_document_bytes "
                                           f"({max_bytes})", source=source, file=entry.url,
                                           location="byte offset 0"))
        return
    with storage.open(entry) as f:
        data = f.read()
    try:
        yield Record(0, 0, data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        yield Record(0, 0, None, DataError(f"not valid UTF-8: {exc.reason}", source=source,
                                           file=entry.url, location=f"byte offset {exc.start}"))
