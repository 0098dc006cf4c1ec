"""Filling a token-cache entry from a stream that reads its split: records in order, tokens as
they are encoded, spilled to disk; stored once the split was read to its end."""

from __future__ import annotations

import logging
from array import array
from typing import Any, Protocol

import numpy as np

from mixer.cache.entry import CachedSplit
from mixer.cache.spill import SpillUnavailable, TokenSpill
from mixer.core.errors import DataError
from mixer.core.records import Record

log = logging.getLogger("mixer.token_cache")


class EntryStore(Protocol):
    """What a writer needs of its cache (`TokenCache`)."""

    def spill(self) -> TokenSpill: ...

    def unwritable(self, exc: OSError) -> None: ...

    def store(
        self, key: str, records: array, tokens: TokenSpill, errors: list[list[Any]]
    ) -> bool: ...


def _error_fields(error: DataError, file: str) -> list[Any]:
    """[message, same_file, file, location, reason] of an error record."""
    return [error.message, error.file == file, error.file, error.location, error.reason]


class SplitWriter:
    """An entry filled as a stream reads its split (every record, in order) and tokenizes
    its documents (in any order); stored when the split was read to its end and every
    document has its tokens, unless it ends in an error or holds images. Tokens go to a
    `TokenSpill` as soon as every earlier document has its own: a writer holds in memory
    only the documents that finished ahead of an earlier one."""

    def __init__(self, cache: EntryStore, key: str, file: str) -> None:
        self.cache = cache
        self.key = key
        self.file = file
        self.rows = array("q")  # (record index, offset, chars, document) per record, flat
        self.errors: list[list[Any]] = []
        self.spill = cache.spill()
        self.ahead: dict[int, np.ndarray] = {}  # documents waiting for an earlier one
        self.documents = 0
        self.keep = True
        self.last_error = False
        self.ended = False
        self.done = False

    @classmethod
    def prefilled(
        cls, cache: EntryStore, cached: CachedSplit, file: str, rows: int, documents: int
    ) -> SplitWriter:
        """A writer holding the first `rows` records of `cached` (whose `documents` documents
        lie in blocks already checked), to be fed the split's remaining records."""
        writer = cls(cache, cached.key, file)
        writer.rows.extend(cached.records[:rows].ravel().tolist())
        writer.errors = cached.errors[: int((cached.records[:rows, 3] < 0).sum())]
        starts = cached.starts
        writer.documents = documents
        for d in range(documents):
            writer._spill(cached.tokens.tokens(int(starts[d]), int(starts[d + 1])))
        return writer

    def record(self, record: Record) -> int | None:
        """Note a record read from the split; the document number to feed tokens for (None
        for an error, or a document that already carries its tokens)."""
        if record.images:
            self._abandon()
            return None
        self.last_error = record.error is not None
        if record.error is not None:
            self.rows.extend((record.index, record.offset, 0, -1 - len(self.errors)))
            self.errors.append(_error_fields(record.error, self.file))
            return None
        doc = self.documents
        self.documents += 1
        self.rows.extend((record.index, record.offset, record.size, doc))
        if record.tokens is not None:
            self.add_tokens(doc, record.tokens)
            return None
        return doc

    def add_tokens(self, doc: int, ids: np.ndarray) -> None:
        if self.keep:
            self.ahead[doc] = ids
            while len(self.spill) in self.ahead and self.keep:
                self._spill(self.ahead.pop(len(self.spill)))
        self._maybe_store()

    def end(self) -> None:
        """The split was read to its end."""
        self.ended = True
        self._maybe_store()

    def _spill(self, ids: np.ndarray) -> None:
        try:
            fits = self.spill.append(ids)
        except SpillUnavailable as exc:  # this entry only: the next may find a file
            log.debug("token cache entry %s not written (%s)", self.key, exc)
            fits = False
        except OSError as exc:
            self.cache.unwritable(exc)
            fits = False
        if not fits:  # pre-tokenized ids of another vocabulary, or a cache we cannot write
            self._abandon()

    def close(self) -> None:
        """Give the entry up (its stream stops before the split's end)."""
        self.done = True
        self._abandon()

    def _abandon(self) -> None:
        self.keep = False
        self.ahead.clear()
        self.spill.close()

    def _maybe_store(self) -> None:
        if self.done or not self.ended or (self.keep and len(self.spill) < self.documents):
            return
        self.done = True
        if not self.keep or self.last_error:
            self.spill.close()
            return  # (an error at the end may be a storage failure: it must not outlive us)
        self.cache.store(self.key, self.rows, self.spill, self.errors)
