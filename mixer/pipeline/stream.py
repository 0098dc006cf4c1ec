"""The document stream of one (lane, source): its slice per epoch, window-shuffled, tokenized.

A composition of stages: `SliceReader` (records at a cursor), `WindowReader` (a shuffled
window), `EncodeAhead` (tokens), `ImagePrefetch` (images), `Cursor` (position and state) and
`Emptiness` (an unlimited source without documents). Resuming re-reads at most one window.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mixer.cache.store import TokenCache
from mixer.core.document import Document, DocumentBuilder, StreamState
from mixer.core.stages import DECODE, timed
from mixer.pipeline.cursor import STATE_KEYS, Cursor
from mixer.pipeline.emptiness import Emptiness, source_has_documents
from mixer.pipeline.encode_ahead import EncodeAhead
from mixer.pipeline.prefetch import ImagePrefetch
from mixer.pipeline.settings import StreamSettings
from mixer.pipeline.slice_reader import SliceReader
from mixer.pipeline.window import Window, WindowReader
from mixer.sources import SourceTable, Storage

__all__ = ["STATE_KEYS", "SourceStream", "StreamSettings", "source_has_documents"]


class SourceStream:
    """Shuffled, tokenized documents of one source in one lane (`settings`: what the recipe
    says of the stream, unpacked by `StreamSettings.from_recipe`)."""

    def __init__(
        self,
        *,
        table: SourceTable,
        lane: int,
        encode: Callable[[list[str]], list[np.ndarray]],
        settings: StreamSettings,
        documents: DocumentBuilder | None = None,
        token_cache: TokenCache | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.table = table
        self.name = table.name
        self.lane = lane
        self.settings = settings
        self.encode = encode
        self.tokenizer = getattr(encode, "info", None)  # pre-tokenized readers' EOS/vocab
        self.documents = documents
        self.token_cache = token_cache if documents is None else None  # text recipes only
        self.reader = SliceReader(table, lane, settings, self.tokenizer, self.token_cache)
        self.windows = WindowReader(self.reader, settings, documents is not None)
        self.encoder = EncodeAhead(encode, documents)
        self.images = ImagePrefetch(settings, clock)
        self.emptiness = Emptiness(self.reader, documents, settings.on_error)
        self.cursor = Cursor(table.name, lane, settings.epochs, documents is not None)
        self._win: Window | None = None
        # Metrics a state saved inside a window holds for it, until that window is read again
        # (a resumed stream reads it when its next document is asked for): (progress,
        # skipped, skipped per reason).
        self._saved: tuple[float, int, dict[str, int]] | None = None

    # -- what other code reads ---------------------------------------------------------------
    @property
    def epochs(self) -> int | None:
        return self.settings.epochs

    @property
    def on_error(self) -> str:
        return self.settings.on_error

    @property
    def storage(self) -> Storage:
        return self.reader.storage

    @property
    def records_read(self) -> int:
        """Records read so far (a work counter: tests assert resume cost with it)."""
        return self.reader.records_read

    @property
    def done(self) -> bool:
        return self.cursor.done

    @property
    def oversize(self) -> int:
        """Documents too long for a row (image recipes), skipped."""
        return self.cursor.oversize

    @property
    def skipped(self) -> int:
        if self._saved is not None:  # (only while the window is not read again)
            return self._saved[1]
        return self.cursor.skipped(self._win)

    @property
    def skipped_reasons(self) -> dict[str, int]:
        """`skipped`, per reason (`DataError.reason`)."""
        if self._saved is not None:
            return dict(self._saved[2])
        return self.cursor.skipped_reasons(self._win)

    def progress(self, saved: bool = True) -> float:
        """Completed passes over the lane's slice behind the reading position (an estimate
        for metrics); `saved=False`: from the cursor, never the figure a loaded state holds."""
        if saved and self._saved is not None:
            return self._saved[0]
        items = () if self.cursor.done else self.reader.items(self.cursor.epoch)
        return self.cursor.progress(items, self.reader.splits, self._win)

    def resume_metrics(self, progress: float, skipped: int, reasons: dict[str, int]) -> None:
        """The metrics a loaded state holds (see `state_dict`'s caller): reported while the
        window it was saved inside is not read again, which counted that window's skips and
        interpolated its progress."""
        if self._win is None:  # (best_fit saves a window's start: also at a boundary)
            self._saved = (progress, skipped, dict(reasons))

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> StreamState:
        """Position before the next document (plain ints)."""
        return self.cursor.state_dict()

    def load_state_dict(self, state: StreamState | None) -> None:
        self.cursor.load_state_dict(state)
        self._win = None
        self._saved = None
        self.reader.reset(self.cursor.resumed_window)

    def close(self) -> None:
        """Give up the cache entries being written and close the open reader (the stream can
        go on from its cursor; a new one can resume from its state)."""
        self.reader.close()

    # -- documents ---------------------------------------------------------------------------
    def next_document(self) -> Document | None:
        """The next document (EOS appended), or None when the stream has ended."""
        cursor = self.cursor
        while not cursor.done:
            if self._win is None:
                with timed(DECODE):  # (its reads count as `read`)
                    self._win = self.windows.read(cursor.epoch, cursor.window_index, cursor.start)
                self._saved = None
            win = self._win
            if cursor.pos >= len(win.items):
                cursor.advance(win, self.emptiness.check)
                self._win = self._saved = None
                continue
            entry = win.items[cursor.pos]
            if (
                entry.encoded is None
                and self.documents is None
                and not win.ahead
                and (not isinstance(entry.text, str))
            ):
                entry.encoded, entry.text = entry.text, ""  # pre-tokenized (or cached)
            elif entry.encoded is None:
                self.encoder.tokenize_from(win, cursor.pos)
            if self.documents is None:
                assert entry.encoded is not None  # (token ids: read, cached or encoded above)
                document: Document | None = Document(entry.encoded)
            else:
                document = self.images.built(win, cursor)
            entry.encoded = None
            cursor.pos += 1
            if cursor.pos >= win.encoded_end:
                win.packing = None  # the chunk is packed: its share of the budget given back
            if document is not None:
                cursor.yielded = True
                return document
        return None
