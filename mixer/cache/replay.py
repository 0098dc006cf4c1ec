"""Replaying a token-cache entry: its records from a cursor, as the split's reader would
yield them, or a shuffle window's documents taken at once (`Replay.take`: no record objects,
a view per document). From a record whose block of the .bin is damaged on, the records come
from the split's source file instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from mixer.cache.blocks import CorruptBlock
from mixer.core.errors import DataError
from mixer.core.records import Record

if TYPE_CHECKING:
    from mixer.cache.entry import CachedSplit


@dataclass
class Taken:
    """What `Replay.take` read for a window."""

    tokens: list[np.ndarray] = field(default_factory=list)  # the documents taken
    size: int = 0  # what they count against the window's byte budget
    read: int = 0  # records read (as `SourceStream.records_read` counts them)
    skipped: list[str] = field(default_factory=list)  # reasons of the error records skipped
    stop: tuple[int, int] | None = None  # (index, offset) of the record the window ends at


class Replay:
    """The records of a cached split from record index `index` (an iterator of `Record`).

    Each record's tokens are a view in the entry's stored dtype (uint16 or int32): packers
    copy them into int64 rows, so nothing converts them before. At a record whose block is
    damaged, `damaged(row, document, error)` is called and the records from there on are
    `read(index, offset)` from the source.
    """

    def __init__(
        self,
        cached: CachedSplit,
        index: int,
        *,
        source: str,
        file: str,
        read: Callable[[int, int], Iterator[Record]],
        damaged: Callable[[int, int, CorruptBlock], None],
    ) -> None:
        self.first = int(np.searchsorted(cached.records[:, 0], index))
        self._indices = cached.records[:, 0]
        self._rows = cached.records[self.first :].tolist()
        self._at = 0
        self._tokens, self._starts = cached.tokens, cached.starts.tolist()
        self._errors = cached.errors
        self._source, self._file = source, file
        self._read, self._damaged = read, damaged
        self._fallback: Iterator[Record] | None = None
        self._peeked = False  # a window stopped at the record at `_at` (and counted it read)

    def fraction(self, index: int) -> float:
        """The part of the split's records before record `index` (metrics' progress)."""
        return float(np.searchsorted(self._indices, index)) / max(len(self._indices), 1)

    def __iter__(self) -> Replay:
        return self

    def __next__(self) -> Record:
        if self._fallback is None and self._at < len(self._rows):
            index, offset, chars, doc = self._rows[self._at]
            if doc < 0:
                self._at += 1
                return Record(index, offset, None, self._error(doc))
            try:
                ids = self._tokens.tokens(self._starts[doc], self._starts[doc + 1])
            except CorruptBlock as exc:
                self._fall_back(doc, exc)
            else:
                self._at += 1
                return Record(index, offset, None, tokens=ids, chars=chars)
        if self._fallback is None:
            raise StopIteration
        return next(self._fallback)

    def take(self, *, stride: int, phase: int, docs: int, size: int, raise_errors: bool) -> Taken:
        """A window's documents from here, read as `WindowReader.read` reads records
        one by one: records whose index is `phase` modulo `stride`, until `docs` documents
        or `size` counted bytes are taken (`stop` is then the record the window ends at: the
        next take starts there). Error records raise with `raise_errors` (any record, as
        every lane striping the split raises), else those of this stripe are skipped. Stops
        early at a damaged block: the records from there on come by iterating."""
        out = Taken()
        rows, starts, tokens_of = self._rows, self._starts, self._tokens.tokens
        taken, taken_size, read = out.tokens, 0, -1 if self._peeked else 0
        self._peeked = False
        at = self._at
        while self._fallback is None and at < len(rows):
            index, offset, chars, doc = rows[at]
            read += 1
            if doc < 0 and raise_errors:
                self._at = at + 1
                raise self._error(doc)
            if index % stride != phase:
                at += 1
                continue
            if len(taken) >= docs or taken_size >= size:
                out.stop, self._peeked = (index, offset), True
                break
            if doc < 0:
                out.skipped.append(self._error(doc).reason)
                at += 1
                continue
            try:
                ids = tokens_of(starts[doc], starts[doc + 1])
            except CorruptBlock as exc:
                self._at = at
                self._fall_back(doc, exc)
                read -= 1  # (the source's record for it is counted when iterated)
                break
            taken.append(ids)
            taken_size += chars
            at += 1
        if self._fallback is None:
            self._at = at
        out.size, out.read = taken_size, read
        return out

    def _fall_back(self, doc: int, exc: CorruptBlock) -> None:
        index, offset = self._rows[self._at][:2]
        self._damaged(self.first + self._at, doc, exc)
        self._fallback = self._read(index, offset)

    def _error(self, doc: int) -> DataError:
        message, same_file, other_file, location, reason = self._errors[-1 - doc]
        return DataError(
            message,
            source=self._source,
            file=self._file if same_file else other_file,
            location=location,
            reason=reason,
        )
