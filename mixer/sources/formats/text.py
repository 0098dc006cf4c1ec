"""Plain text: one document per file.

A file larger than `max_document_bytes` is refused from its listed size, unread. A smaller one
is read whole (the format has no records to stream): its bytes and its text coexist only while
it is decoded.
"""

from __future__ import annotations

from collections.abc import Iterator

from mixer.core.errors import DataError
from mixer.core.records import FileEntry, Record, Split


def read_text(
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
    """The whole file as one record."""
    if index > 0:
        return
    if entry.size > max_bytes:
        yield Record(
            0,
            0,
            None,
            DataError(
                f"document longer than max_document_bytes ({max_bytes})",
                source=source,
                file=entry.url,
                location="byte offset 0",
                reason="too_long",
            ),
        )
        return
    with storage.open(entry) as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        yield Record(
            0,
            0,
            None,
            DataError(
                f"not valid UTF-8: {exc.reason}",
                source=source,
                file=entry.url,
                location=f"byte offset {exc.start}",
                reason="bad_text",
            ),
        )
        return
    # The format needs the document in memory: its text, not the bytes besides (this frame
    # lives on while the record is used).
    del data
    yield Record(0, 0, text)
