"""One shuffle window: its documents read from a cursor, then permuted by the window's key.

The key is (seed, "shuffle", source, lane, epoch, window), so a window is reconstructible
from its start cursor and a stream's state need only hold that cursor and a position in it.
"""

from __future__ import annotations

import itertools
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from mixer.cache.replay import Replay
from mixer.core.errors import DataError, bad_media
from mixer.core.resources import Held
from mixer.core.rng import derive_key, permutation
from mixer.pipeline.settings import StreamSettings
from mixer.pipeline.slice_reader import Cursor3, SliceReader
from mixer.pipeline.slices import SliceItem
from mixer.sources import FORMATS, EncodedAudio, EncodedImage, EncodedVideo, Record
from mixer.tokenize.encoding import TOKENIZE_BYTES


@dataclass
class WindowItem:
    """One document of a window, before and after encoding."""

    text: Any  # str, or np.ndarray for a pre-tokenized (or cached) record
    images: tuple[EncodedImage, ...] = ()  # when building documents
    file: str = ""
    location: str = ""
    origin: tuple[Any, Any] | None = None  # (token-cache writer, its document) to feed
    encoded: Any = None  # np.ndarray (text path) or Document | Rejected (builder path)


@dataclass
class Window:
    """A shuffled window and the bookkeeping of its consumption."""

    items: list[WindowItem]
    end: Cursor3  # cursor (slot, index, offset) after the window
    end_of_epoch: bool
    skipped: int  # records skipped inside the window
    reasons: dict[str, int]  # the same, per reason (`DataError.reason`)
    # The part of the split read at the window's start and end cursors, where the cursor's
    # offset does not tell (whole compressed files, cache replays); -1: unknown.
    inner_start: float = -1.0
    inner_end: float = -1.0
    span: tuple[float, float] | None = None  # the slice's part before its start and end
    # chunks queued: start, stop, tokens, share of the process's `TEXT_AHEAD` (None if needed)
    ahead: list[tuple[int, int, Future, Held | None]] = field(default_factory=list)
    packing: Held | None = None  # the chunk being packed: its share of `ENCODED_HELD`
    chunk_bytes: int = TOKENIZE_BYTES  # text budget of the next chunk cut (doubles per chunk)
    encoded_end: int = 0  # end of the chunks encoded so far (where the next one starts)
    prefetch_end: int = 0  # documents before this one have their images decoding
    prefetch_tokens: int = 0  # tokens of the documents after `pos` and before that


@dataclass
class _Fill:
    """A window being read: its documents so far and the cursor reached."""

    slot: int
    index: int
    offset: int
    docs: list[WindowItem] = field(default_factory=list)
    size: int = 0
    skipped: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    inner_start: float = -1.0
    inner_end: float = -1.0


class WindowReader:
    """Reads the window at a cursor: striped, within the doc and byte budgets, shuffled."""

    def __init__(self, reader: SliceReader, settings: StreamSettings, building: bool) -> None:
        self.reader = reader
        self.settings = settings
        self.building = building  # documents are built (image recipes): keep their images
        self.name = reader.table.name

    def read(self, epoch: int, window: int, start: Cursor3) -> Window:
        """The window `window` of `epoch`, whose first record is at `start`."""
        items = self.reader.items(epoch)
        fill = _Fill(*start)
        while fill.slot < len(items) and not self._full(fill):
            item = items[fill.slot]
            records, lookahead = self.reader.records(
                epoch, window, (fill.slot, fill.index, fill.offset)
            )
            pending = [lookahead] if lookahead is not None else []
            measure = (fill.slot, fill.index, fill.offset) == start and fill.index > 0
            if measure and isinstance(records, Replay):
                measure, fill.inner_start = False, records.fraction(fill.index)
            if isinstance(records, Replay) and not pending:  # a cache hit: no record objects
                if self._take(fill, epoch, item, records):
                    break
            if self._read_records(fill, epoch, item, records, pending, measure):
                break
            self.reader.end_split(epoch, fill.slot)
            fill.slot, fill.index, fill.offset = fill.slot + 1, 0, 0
        return self._shuffled(fill, epoch, window, fill.slot >= len(items))

    def _full(self, fill: _Fill) -> bool:
        return len(fill.docs) >= self.settings.window_docs or (
            fill.size >= self.settings.window_bytes
        )

    def _take(self, fill: _Fill, epoch: int, item: SliceItem, records: Replay) -> bool:
        """Take a cache replay's documents; whether the window filled up in it."""
        taken = records.take(
            stride=item.stride,
            phase=item.phase,
            docs=self.settings.window_docs - len(fill.docs),
            size=self.settings.window_bytes - fill.size,
            raise_errors=self.settings.on_error == "raise",
        )
        self.reader.records_read += taken.read
        fill.docs += [WindowItem(tokens) for tokens in taken.tokens]
        fill.size += taken.size
        fill.skipped += len(taken.skipped)
        fill.reasons.update(taken.skipped)
        if taken.stop is None:
            return False
        fill.index, fill.offset = taken.stop
        fill.inner_end = records.fraction(fill.index)
        self.reader.pause(epoch, (fill.slot, fill.index, fill.offset), records, None)
        return True

    def _read_records(
        self,
        fill: _Fill,
        epoch: int,
        item: SliceItem,
        records: Any,
        pending: list[Record],
        measure: bool,
    ) -> bool:
        """Read records of the slot into the window; whether the window filled up in it."""
        raise_errors = self.settings.on_error == "raise"
        for record in itertools.chain(pending, records):  # (does not close `records`)
            if not pending or record is not pending[0]:
                self.reader.records_read += 1
            if record.error is not None and raise_errors:
                raise record.error  # in every lane striping the split, not just one
            if measure:  # the first record read at a cursor inside a split
                measure = False
                fill.inner_start = self.reader.inner(epoch, fill.slot, record, records)
            if record.index % item.stride != item.phase:
                continue  # (a skipped record is counted by the lane that owns it)
            if self._full(fill):
                fill.index, fill.offset = record.index, record.offset
                fill.inner_end = self.reader.inner(epoch, fill.slot, record, records)
                if self.reader.keeps_reader_open(item, records):
                    self.reader.pause(epoch, (fill.slot, fill.index, fill.offset), records, record)
                else:
                    records.close()
                return True
            if record.error is None and record.images and not self.building:
                record = self._images_without_layout(record, item)
                if raise_errors and record.error is not None:
                    raise record.error
            self._add(fill, epoch, item, record)
        return False

    def _add(self, fill: _Fill, epoch: int, item: SliceItem, record: Record) -> None:
        """Add a record of the stripe to the window (or count it skipped)."""
        writer = self.reader.writer(epoch, fill.slot)
        doc = writer.record(record) if writer is not None else None
        if record.error is not None:
            fill.skipped += 1
            fill.reasons[record.error.reason] += 1
            return
        entry = WindowItem(
            record.text if record.tokens is None else record.tokens,
            origin=(writer, doc) if doc is not None else None,
        )
        fill.size += record.size
        if self.building:
            split = self.reader.split_of(item)
            file = self.reader.table.files[split.file]
            entry.images = record.images
            entry.file = file.url
            entry.location = record.location or FORMATS[file.format].describe_offset(
                split, record.offset
            )
            fill.size += sum(len(image.data) for image in record.images)
        fill.docs.append(entry)

    def _shuffled(self, fill: _Fill, epoch: int, window: int, end_of_epoch: bool) -> Window:
        order = permutation(
            len(fill.docs),
            shuffle_key(self.settings.seed, self.name, self.reader.lane, epoch, window),
        )
        return Window(
            [fill.docs[i] for i in order],
            (fill.slot, fill.index, fill.offset),
            end_of_epoch,
            fill.skipped,
            fill.reasons,
            inner_start=fill.inner_start,
            inner_end=fill.inner_end,
        )

    def _images_without_layout(self, record: Record, item: SliceItem) -> Record:
        """A record with images (videos, audio) in a text-only recipe: an error, never a silent
        text-only document."""
        image = record.images[0]
        videos = sum(isinstance(m, EncodedVideo) for m in record.images)
        clips = sum(isinstance(m, EncodedAudio) for m in record.images)
        images = len(record.images) - videos - clips
        counts = " and ".join(
            f"{n} {what}(s)"
            for n, what in ((images, "image"), (videos, "video"), (clips, "audio clip"))
            if n or (what == "image" and not videos and not clips)
        )
        what, block = (
            ("audio", "`audio:`") if clips else ("video" if videos else "image", "`images:`")
        )
        error = DataError(
            f"the sample has {counts} but the recipe has no "
            f"{block} block (add one to train on them, or use text-only "
            "samples)",
            source=self.name,
            file=self.reader.table.files[self.reader.split_of(item).file].url,
            location=f"member {image.member} at byte offset {image.offset}",
            reason=bad_media(what),
        )
        return Record(record.index, record.offset, None, error)


def shuffle_key(seed: int, source: str, lane: int, epoch: int, window: int) -> Any:
    """The key of the permutation of a window's documents."""
    return derive_key(seed, "shuffle", source, lane, epoch, window)
