"""Whether a source holds any readable document at all (asked when a lane's epoch came up empty)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from mixer.core.document import DocumentBuilder, Rejected
from mixer.core.errors import DataError
from mixer.pipeline.slice_reader import SliceReader
from mixer.sources import FORMATS, Record, Split
from mixer.tokenize.encoding import TOKENIZE_DOCS


class Emptiness:
    """Raises, once asked, when the source yields no document at all (the answer is kept)."""

    def __init__(
        self, reader: SliceReader, documents: DocumentBuilder | None, on_error: str
    ) -> None:
        self.reader = reader
        self.documents = documents
        self.on_error = on_error
        self.has_documents: bool | None = None  # asked once a lane's epoch came up empty

    def check(self) -> None:
        """Raise a DataError when the source holds no readable document."""
        if self.has_documents is None:
            self.has_documents = source_has_documents(self.reader, self.documents, self.on_error)
        if self.has_documents is False:
            table = self.reader.table
            files = ", ".join(f.url for f in table.files[:3])
            more = f" and {len(table.files) - 3} more" if len(table.files) > 3 else ""
            oversize = (
                ", documents too long for seq_len at any image resolution"
                if self.documents is not None
                else ""
            )
            raise DataError(
                f"the source yields no document at all (its {len(table.files)} "
                f"file(s) hold only blank lines, empty content{oversize} or skipped "
                "records), so an unlimited source cannot supply its weight",
                source=table.name,
                file=files + more,
                reason="other",
            )


def source_has_documents(
    reader: SliceReader, documents: DocumentBuilder | None, on_error: str
) -> bool:
    """Whether any split of the reader's source holds a readable document (read in split
    order up to the first one). Raises the first bad record's error unless the source skips
    bad input. Only asked when a lane's whole slice of an epoch yielded no document.

    With a document builder (image recipes) a record counts once it becomes a document whose
    images decode: records that are all oversize, or all skipped, make no document."""
    for split in reader.table.splits:
        records = reader.read_split(split, 0, 0)
        for chunk in _batched(records, TOKENIZE_DOCS):
            good = []
            for record in chunk:
                if record.error is None:
                    if record.images and documents is None:
                        continue  # images without an images block: an error, no document
                    good.append(record)
                elif on_error == "raise":
                    raise record.error
            if good and documents is None:
                return True
            if good and _builds_a_document(reader, documents, on_error, good, split):
                return True
    return False


def _batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def _builds_a_document(
    reader: SliceReader,
    documents: DocumentBuilder | None,
    on_error: str,
    records: list[Record],
    split: Split,
) -> bool:
    assert documents is not None
    entry = reader.table.files[split.file]
    where = FORMATS[entry.format].describe_offset
    built = documents.build(
        [r.text_to_encode() for r in records],
        [r.images for r in records],
        [entry.url] * len(records),
        [r.location or where(split, r.offset) for r in records],
    )
    for item in built:
        if isinstance(item, Rejected):
            if not item.oversize and on_error == "raise":
                raise item.error
            continue
        try:
            for placement in item.images:
                placement.image.check()
        except DataError:
            if on_error == "raise":
                raise
            continue
        finally:
            for placement in item.images:
                placement.image.release()
        return True
    return False
