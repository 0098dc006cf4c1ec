"""The document stream of one (lane, source): its slice per epoch, window-shuffled, tokenized.

The shuffle is reconstructible: a window of up to `shuffle_window` documents (and
`shuffle_window_bytes` of text) is read from a cursor and permuted with a key of
(seed, "shuffle", source, lane, epoch, window). The state is the cursor at the window start
plus the position inside the window, so resuming re-reads at most one window.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mixer.cache.replay import Replay
from mixer.cache.store import TokenCache
from mixer.core.document import Document, DocumentBuilder, Rejected
from mixer.core.errors import DataError, StateError
from mixer.core.rng import derive_key, permutation
from mixer.pipeline.slices import SliceItem, lane_slice
from mixer.sources import FORMATS, EncodedImage, Record, SourceTable, Storage, read_split
from mixer.tokenize.tokenizer import (
    TEXT_CHUNKS_AHEAD,
    TOKENIZE_BYTES,
    TOKENIZE_BYTES_AHEAD,
    TOKENIZE_DOCS,
    encoding_pool,
    encoding_thread,
)

log = logging.getLogger("mixer.stream")

STATE_KEYS = ("epoch", "window", "slot", "index", "offset", "pos", "skipped", "done")
_EMPTY_EPOCH_LIMIT = 64  # consecutive empty epochs after which a lane's source counts as empty


@dataclass
class _Window:
    texts: list[Any]            # str, or np.ndarray for a pre-tokenized record
    tokens: list[Any]           # np.ndarray (text path) or Document | Rejected (builder path)
    end: tuple[int, int, int]   # cursor (slot, index, offset) after the window
    end_of_epoch: bool
    skipped: int                # records skipped inside the window
    reasons: dict[str, int]     # the same, per reason (mixer.core.errors.classify)
    ahead: list[tuple[int, int, Future]] = field(default_factory=list)  # chunks queued: start, stop
    images: list[tuple[EncodedImage, ...]] | None = None   # per document, when building
    files: list[str] | None = None
    locations: list[str] | None = None
    prefetch_end: int = 0       # documents before this one have their images decoding
    prefetch_tokens: int = 0    # tokens of the documents after `pos` and before that
    origins: list[Any] | None = None   # per document: (token-cache writer, document) or None
    chunk_bytes: int = TOKENIZE_BYTES  # text budget of the next chunk cut (doubles per chunk)
    # The part of the split read at the window's start and end cursors, where the cursor's
    # offset does not tell (whole compressed files, cache replays); -1: unknown.
    inner_start: float = -1.0
    inner_end: float = -1.0


def source_has_documents(stream: SourceStream) -> bool:
    """Whether any split of the stream's source holds a readable document (read in split
    order up to the first one). Raises the first bad record's error unless the source skips
    bad input. Only asked when a lane's whole slice of an epoch yielded no document.

    With a document builder (image recipes) a record counts once it becomes a document whose
    images decode: records that are all oversize, or all skipped, make no document."""
    for split in stream.table.splits:
        entry = stream.table.files[split.file]
        records = read_split(storage=stream.storage, entry=entry, split=split,
                             source=stream.table.name, text_field=stream.text_field,
                             max_bytes=stream.max_document_bytes, index=0, offset=0,
                             tokenizer=stream.tokenizer)
        for chunk in _batched(records, TOKENIZE_DOCS):
            good = []
            for record in chunk:
                if record.error is None:
                    if record.images and stream.documents is None:
                        continue   # images without an images block: an error, no document
                    good.append(record)
                elif stream.on_error == "raise":
                    raise record.error
            if good and stream.documents is None:
                return True
            if good and _builds_a_document(stream, good, entry.url, split):
                return True
    return False


def _batched(items, size: int):
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def _builds_a_document(stream: SourceStream, records: list, url: str, split) -> bool:
    assert stream.documents is not None
    where = FORMATS[stream.table.files[split.file].format].describe_offset
    built = stream.documents.build([r.text for r in records], [r.images for r in records],
                                   [url] * len(records),
                                   [r.location or where(split, r.offset) for r in records])
    for item in built:
        if isinstance(item, Rejected):
            if not item.oversize and stream.on_error == "raise":
                raise item.error
            continue
        try:
            for placement in item.images:
                placement.image.check()
        except DataError:
            if stream.on_error == "raise":
                raise
            continue
        finally:
            for placement in item.images:
                placement.image.release()
        return True
    return False


class SourceStream:
    """Shuffled, tokenized documents of one source in one lane."""

    def __init__(self, *, table: SourceTable, lane: int, lanes: int, seed: int,
                 epochs: int | None, on_error: str, text_field: str,
                 storage_options: dict[str, Any], window_docs: int, window_bytes: int,
                 max_document_bytes: int, encode: Callable[[list[str]], list[np.ndarray]],
                 block_size: int = 8 << 20, documents: DocumentBuilder | None = None,
                 prefetch_tokens: int = 0, clock: Callable[[], int] | None = None,
                 batch_tokens: int = 1, lanes_per_batch: int = 1,
                 token_cache: TokenCache | None = None) -> None:
        self.table = table
        self.name = table.name
        self.lane = lane
        self.lanes = lanes
        self.seed = seed
        self.epochs = epochs
        self.on_error = on_error
        self.text_field = text_field
        self.storage = Storage(table.name, storage_options, block_size=block_size)
        self.window_docs = window_docs
        self.window_bytes = window_bytes
        self.max_document_bytes = max_document_bytes
        self.encode = encode
        self.tokenizer = getattr(encode, "info", None)   # pre-tokenized readers' EOS/vocab
        self.documents = documents
        self.token_cache = token_cache if documents is None else None   # text recipes only
        self.prefetch_tokens = prefetch_tokens   # decode images this many tokens ahead
        # When is a document needed? `clock()` is the global batch the lane makes next; a
        # document `batch_tokens` further on is needed `lanes_per_batch` global batches later.
        self.clock = clock or (lambda: 0)
        self.batch_tokens = max(batch_tokens, 1)
        self.lanes_per_batch = lanes_per_batch
        self._splits = tuple(table.splits)
        self._slice_epoch = -1
        self._slice: tuple[SliceItem, ...] = ()
        self.records_read = 0   # work counter (tests assert resume cost with it)
        self._writers: dict[tuple[int, int], Any] = {}   # token-cache entries being filled
        self._live: Any = None   # the reader paused at a full window, with its cursor
        self._has_documents: bool | None = None   # asked once a lane's epoch came up empty
        self.load_state_dict(None)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        """Position before the next document (plain ints)."""
        state = {"epoch": self.epoch, "window": self.window_index, "slot": self.start[0],
                 "index": self.start[1], "offset": self.start[2], "pos": self.pos,
                 "skipped": self.skipped_before, "done": int(self.done)}
        if self.documents is not None:
            state["oversize"] = self.oversize
        if self.reasons_before:
            state["reasons"] = dict(sorted(self.reasons_before.items()))
        return state

    def load_state_dict(self, state: dict[str, int] | None) -> None:
        state = state or {"epoch": 0, "window": 0, "slot": 0, "index": 0, "offset": 0,
                          "pos": 0, "skipped": 0, "done": 0}
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise StateError(f"source {self.table.name!r} lane {self.lane}: stream state lacks "
                             f"{missing}")
        self.epoch = state["epoch"]
        self.window_index = state["window"]
        self.start = (state["slot"], state["index"], state["offset"])
        self.pos = state["pos"]
        self.done = bool(state["done"])
        self._win: _Window | None = None
        self.skipped_before = state["skipped"]
        self.reasons_before: dict[str, int] = dict(state.get("reasons", {}))
        self.oversize = state.get("oversize", 0)   # documents too long for a row, skipped
        self._empty_epochs = 0
        # Whether this epoch has yielded a document yet. Loaded mid-epoch, unknown: taken as
        # yes (the epoch does not count as empty), so a resumed lane never gives up early.
        self._yielded = not (self.window_index == 0 and self.pos == 0)
        self.close()   # a resumed stream fills no entry it did not read from the start
        self._missed: set[tuple[int, int]] = set()   # (epoch, slot)s whose lookup missed
        self._resumed_window = (self.epoch, self.window_index) if self.pos else None

    @property
    def skipped(self) -> int:
        return self.skipped_before + (self._win.skipped if self._win else 0)

    @property
    def skipped_reasons(self) -> dict[str, int]:
        """`skipped`, per reason (mixer.core.errors.classify)."""
        out = dict(self.reasons_before)
        for reason, n in (self._win.reasons if self._win else {}).items():
            out[reason] = out.get(reason, 0) + n
        return out

    def _skip(self, reason: str, n: int = 1) -> None:
        """Count `n` skipped records, in total and under their reason."""
        self.skipped_before += n
        self.reasons_before[reason] = self.reasons_before.get(reason, 0) + n

    def progress(self) -> float:
        """Completed passes over the lane's slice (an estimate for metrics): epochs done plus
        the part of the current epoch behind the reading position, measured in splits (and
        within a split where its size is known), interpolated over the current window."""
        if self.done:
            return float(self.epochs if self.epochs is not None else self.epoch)
        items = self._lane_slice()
        if not items:
            return float(self.epoch)
        win = self._win
        done = self._fraction(items, self.start, win.inner_start if win else -1.0)
        if win is not None and win.texts:
            end = 1.0 if win.end_of_epoch else self._fraction(items, win.end, win.inner_end)
            done += (end - done) * min(self.pos / len(win.texts), 1.0)
        return self.epoch + done

    def _fraction(self, items: tuple[SliceItem, ...], cursor: tuple[int, int, int],
                  inner: float = -1.0) -> float:
        """The part of the slice before `cursor`; `inner`: the part of the cursor's split
        before it, where known otherwise (-1: from the split's record count or range)."""
        slot, index, offset = cursor
        if slot >= len(items):
            return 1.0
        split = self._splits[items[slot].split]
        if inner < 0:
            inner = 0.0
            if split.records > 0:
                inner = index / split.records
            elif split.dend >= 0 and offset:   # a group of zstd frames: decompressed bytes
                inner = (offset - split.dstart) / max(split.dend - split.dstart, 1)
            elif split.seekable and split.end > split.start and offset:
                inner = (offset - split.start) / (split.end - split.start)
        # A split is done only once the cursor has left it (a whole compressed file may be
        # read to its end while its last records still wait in the window).
        return (slot + min(max(inner, 0.0), 0.999)) / len(items)

    def _inner(self, slot: int, record: Record | None, records: Any) -> float:
        """The part of the slice's split `slot` before `record`, measured where the cursor's
        offset cannot measure it: stored bytes consumed, or a cache entry's records."""
        if record is None:
            return -1.0
        if isinstance(records, Replay):
            return records.fraction(record.index)
        if record.consumed < 0:
            return -1.0
        size = self.table.files[self._splits[self._lane_slice()[slot].split].file].size
        return record.consumed / max(size, 1)

    # -- reading -----------------------------------------------------------------------------
    def _lane_slice(self) -> tuple[SliceItem, ...]:
        if self._slice_epoch != self.epoch:
            self._slice = lane_slice(self._splits, seed=self.seed, source=self.table.name,
                                     epoch=self.epoch, lanes=self.lanes, lane=self.lane)
            self._slice_epoch = self.epoch
        return self._slice

    def _records(self, slot: int, index: int, offset: int):
        """Records of the slice from a cursor, reusing the open reader when it is already there."""
        live = self._live
        self._live = None
        if live is not None and live[0] == (self.epoch, slot, index, offset):
            return live[1], live[2]
        if live is not None:
            self._close_reader(live[1])
        items = self._lane_slice()
        split = self._splits[items[slot].split]
        entry = self.table.files[split.file]

        def read(index: int, offset: int):
            return read_split(storage=self.storage, entry=entry, split=split,
                              source=self.table.name, text_field=self.text_field,
                              max_bytes=self.max_document_bytes, index=index, offset=offset,
                              tokenizer=self.tokenizer)
        if self.token_cache is None or FORMATS[entry.format].pretokenized:
            return read(index, offset), None   # (pre-tokenized formats are what a cache holds)
        # The entry holds every record of the split, so only a lane reading all of it (a
        # stripe of 1) writes one, from the tokens it makes anyway; `mixer cache` fills the
        # splits that lanes share.
        text_field = self.text_field or FORMATS[entry.format].default_text_field
        for key in [k for k in self._writers if k[0] != self.epoch]:
            self._writers.pop(key).close()
        self._missed = {k for k in self._missed if k[0] == self.epoch}
        if (self.epoch, slot) in self._writers or (self.epoch, slot) in self._missed:
            # The reader re-opens at the cursor in a split that missed: read on (one lookup
            # per split, not per window; and a replay of an entry another process stored
            # meanwhile would not feed the entry this stream writes).
            return read(index, offset), None
        adopt = None
        # A resumed window skips the documents before its position: they are not tokenized
        # again, so no entry can be completed from it.
        if items[slot].stride == 1 and (self.epoch, self.window_index) != self._resumed_window:
            adopt = lambda writer, at=(self.epoch, slot): self._writers.update({at: writer})
        records = self.token_cache.records(
            read, entry=entry, split=split, source=self.table.name, text_field=text_field,
            max_bytes=self.max_document_bytes, index=index, offset=offset, adopt=adopt)
        if not isinstance(records, Replay):
            self._missed.add((self.epoch, slot))
        return records, None

    def close(self) -> None:
        """Give up the cache entries being written and close the open reader (the stream can
        go on from its cursor; a new one can resume from its state)."""
        for writer in self._writers.values():
            writer.close()
        self._writers = {}
        live, self._live = self._live, None
        if live is not None:
            self._close_reader(live[1])

    def _close_reader(self, records: Any) -> None:
        """Close a paused reader; a failure is logged, not raised (cleanup must not hide an
        error or stop the other streams from closing)."""
        try:
            if hasattr(records, "close"):
                records.close()
        except Exception as exc:
            log.debug("closing a reader of source %r failed: %s", self.table.name, exc)

    def _keeps_reader_open(self, item: SliceItem, records: Any) -> bool:
        """Whether a reader paused at a full window stays open for the next window.

        Re-opening at the cursor is cheap for seekable splits (a seek, or decoding part of a
        parquet row group), so those readers close: an open one holds buffers (7 MB for a
        parquet reader in a row group), and there is one per lane and source. A whole-file
        compressed split would decompress from its start again, and a token-cache replay
        would load its entry again: those stay open. (A cache entry being written lives in
        `_writers`, not in the reader: the reader of a cache miss closes as without a cache.)"""
        return not self._splits[item.split].seekable or isinstance(records, Replay)

    def _read_window(self) -> _Window:
        items = self._lane_slice()
        texts: list[str] = []
        building = self.documents is not None
        images: list[tuple[EncodedImage, ...]] = []
        files: list[str] = []
        locations: list[str] = []
        origins: list[Any] = []   # (cache writer, document) per text, or None
        size = skipped = 0
        reasons: Counter[str] = Counter()
        slot, index, offset = self.start
        inner_start = inner_end = -1.0
        while slot < len(items) and len(texts) < self.window_docs and size < self.window_bytes:
            item = items[slot]
            records, lookahead = self._records(slot, index, offset)
            pending = [lookahead] if lookahead is not None else []
            measure_start = (slot, index, offset) == self.start and index > 0
            if measure_start and isinstance(records, Replay):
                measure_start, inner_start = False, records.fraction(index)
            if isinstance(records, Replay) and not pending:   # a cache hit: no record objects
                taken = records.take(stride=item.stride, phase=item.phase,
                                     docs=self.window_docs - len(texts),
                                     size=self.window_bytes - size,
                                     raise_errors=self.on_error == "raise")
                self.records_read += taken.read
                texts += taken.tokens
                origins += [None] * len(taken.tokens)
                size += taken.size
                skipped += len(taken.skipped)
                reasons.update(taken.skipped)
                if taken.stop is not None:
                    index, offset = taken.stop
                    inner_end = records.fraction(index)
                    self._live = ((self.epoch, slot, index, offset), records, None)
                    break
            full = False
            for record in itertools.chain(pending, records):  # (does not close `records`)
                if lookahead is None or record is not lookahead:
                    self.records_read += 1
                if record.error is not None and self.on_error == "raise":
                    raise record.error   # in every lane striping the split, not just one
                if measure_start:   # the first record read at a cursor inside a split
                    measure_start = False
                    inner_start = self._inner(slot, record, records)
                if record.index % item.stride != item.phase:
                    continue   # (a skipped record is counted by the lane that owns it)
                if len(texts) >= self.window_docs or size >= self.window_bytes:
                    index, offset = record.index, record.offset
                    inner_end = self._inner(slot, record, records)
                    if self._keeps_reader_open(item, records):
                        self._live = ((self.epoch, slot, index, offset), records, record)
                    else:
                        records.close()
                    full = True
                    break
                if record.error is None and record.images and not building:
                    record = self._images_without_layout(record, item)
                    if self.on_error == "raise":
                        raise record.error
                writer = self._writers.get((self.epoch, slot))
                doc = writer.record(record) if writer is not None else None
                if record.error is not None:
                    skipped += 1
                    reasons[record.error.reason] += 1
                    continue
                texts.append(record.text if record.tokens is None else record.tokens)
                size += record.size
                origins.append((writer, doc) if doc is not None else None)
                if building:
                    split = self._splits[item.split]
                    entry = self.table.files[split.file]
                    images.append(record.images)
                    files.append(entry.url)
                    locations.append(record.location or FORMATS[entry.format].describe_offset(
                        split, record.offset))
                    size += sum(len(image.data) for image in record.images)
            if full:
                break
            writer = self._writers.pop((self.epoch, slot), None)
            if writer is not None:
                writer.end()
            slot, index, offset = slot + 1, 0, 0
        end_of_epoch = slot >= len(items)
        order = permutation(len(texts), derive_key(self.seed, "shuffle", self.table.name,
                                                   self.lane, self.epoch, self.window_index))
        shuffled = [texts[i] for i in order]
        window = _Window(shuffled, [None] * len(shuffled), (slot, index, offset), end_of_epoch,
                         skipped, reasons, inner_start=inner_start, inner_end=inner_end)
        if any(o is not None for o in origins):
            window.origins = [origins[i] for i in order]
        if building:
            window.images = [images[i] for i in order]
            window.files = [files[i] for i in order]
            window.locations = [locations[i] for i in order]
        return window

    def _images_without_layout(self, record: Record, item: SliceItem) -> Record:
        """A record with images in a text-only recipe: an error, never a silent text-only
        document."""
        image = record.images[0]
        error = DataError(f"the sample has {len(record.images)} image(s) but the recipe has no "
                          "`images:` block (add one to train on them, or use text-only "
                          "samples)", source=self.table.name,
                          file=self.table.files[self._splits[item.split].file].url,
                          location=f"member {image.member} at byte offset {image.offset}")
        return Record(record.index, record.offset, None, error)

    def _advance_window(self) -> None:
        """Move the cursor past the current (fully consumed) window."""
        win = self._win
        assert win is not None
        for reason, n in win.reasons.items():   # (they add up to win.skipped)
            self._skip(reason, n)
        if win.end_of_epoch:
            # Empty: the epoch yielded no document -- no records, or (image recipes) every
            # record rejected as oversize or skipped -- not merely no records.
            empty = not self._yielded
            self._yielded = False
            if empty and self.epochs is None and self._has_documents is None:
                self._has_documents = source_has_documents(self)
            if empty and self._has_documents is False:
                files = ", ".join(f.url for f in self.table.files[:3])
                more = f" and {len(self.table.files) - 3} more" if len(self.table.files) > 3 else ""
                oversize = (", documents too long for seq_len at any image resolution"
                            if self.documents is not None else "")
                raise DataError(
                    f"the source yields no document at all (its {len(self.table.files)} "
                    f"file(s) hold only blank lines, empty content{oversize} or skipped "
                    "records), so an unlimited source cannot supply its weight",
                    source=self.table.name, file=files + more)
            self._empty_epochs = self._empty_epochs + 1 if empty else 0
            self.epoch += 1
            self.window_index = 0
            self.start = (0, 0, 0)
            if (self.epochs is not None and self.epoch >= self.epochs) or (
                    self._empty_epochs >= _EMPTY_EPOCH_LIMIT):
                self.done = True
        else:
            self.window_index += 1
            self.start = win.end
        self.pos = 0
        self._win = None

    def _encode(self, win: _Window, start: int, stop: int) -> list[Any]:
        """Tokens (or built documents) of window items [start, stop); pre-tokenized items
        pass through as they are."""
        todo = [i for i in range(start, stop) if isinstance(win.texts[i], str)]
        out: list[Any] = [None if isinstance(item, str) else
                          item if self.documents is None else Document(item)
                          for item in win.texts[start:stop]]
        if not todo:
            return out
        if self.documents is None:
            encoded = self.encode([win.texts[i] for i in todo])
        else:
            assert win.images is not None and win.files is not None
            assert win.locations is not None
            encoded = self.documents.build(
                [win.texts[i] for i in todo], [win.images[i] for i in todo],
                [win.files[i] for i in todo], [win.locations[i] for i in todo])
        for i, item in zip(todo, encoded):
            out[i - start] = item
        return out

    def _chunk_stop(self, win: _Window, start: int) -> int:
        """End of the tokenizer chunk at `start`: up to `TOKENIZE_DOCS` documents and, for
        text, until the window's next chunk budget of it (image documents keep whole
        64-document chunks). The budget starts at `TOKENIZE_BYTES`, so a window's first rows
        wait for one small call, and doubles with each chunk cut up to
        `TOKENIZE_BYTES_AHEAD`, where the tokenizer spends least per token."""
        stop = min(start + TOKENIZE_DOCS, len(win.texts))
        if self.documents is not None:
            return stop
        budget = win.chunk_bytes
        win.chunk_bytes = min(2 * budget, TOKENIZE_BYTES_AHEAD)
        size = 0
        for i in range(start, stop):
            size += len(win.texts[i])
            if size >= budget:
                return i + 1
        return stop

    def _tokenize_from(self, win: _Window, start: int) -> None:
        """Tokens for the chunk at `start`; keep the following chunks encoding meanwhile
        (`TEXT_CHUNKS_AHEAD` of text, one of built documents)."""
        if not (win.ahead and win.ahead[0][0] == start):
            for _, _, queued in win.ahead:
                queued.cancel()
            win.ahead = []   # a jump (a resume inside the window): start over from here
            win.chunk_bytes = TOKENIZE_BYTES
            self._submit_ahead(win, start, 1)
        if win.ahead:
            _, stop, future = win.ahead.pop(0)
            # Not started yet (the threads are busy with other chunks): encode it here rather
            # than wait behind them.
            encoded = (self._encode(win, start, stop)
                       if self.documents is None and future.cancel() else future.result())
        else:   # pre-tokenized items only: nothing was submitted, they pass through
            encoded = self._encode(win, start, self._chunk_stop(win, start))
        stop = start + len(encoded)
        win.tokens[start:stop] = encoded
        if win.origins is not None:
            for i in range(start, stop):
                origin = win.origins[i]
                if origin is not None:
                    origin[0].add_tokens(origin[1], encoded[i - start])
        for i in range(start, stop):
            win.texts[i] = ""  # free the text once tokenized
            if win.images is not None:
                win.images[i] = ()
        self._submit_ahead(win, stop, 1 if self.documents is not None else TEXT_CHUNKS_AHEAD)

    def _submit_ahead(self, win: _Window, start: int, chunks: int) -> None:
        """Queue chunks after those already queued, from `start`, until `chunks` are."""
        pool = encoding_thread() if self.documents is not None else encoding_pool()
        at = win.ahead[-1][1] if win.ahead else start
        while len(win.ahead) < chunks and at < len(win.texts):
            stop = self._chunk_stop(win, at)
            if not any(isinstance(win.texts[i], str) for i in range(at, stop)):
                break   # pre-tokenized items: nothing to encode
            win.ahead.append((at, stop, pool.submit(self._encode, win, at, stop)))
            at = stop

    def _prefetch(self, win: _Window) -> None:
        """Start decoding the images of the documents after `pos`, up to `prefetch_tokens`
        tokens ahead, so a large image is ready before its batch is assembled."""
        item = win.tokens[self.pos]
        if win.prefetch_end <= self.pos:
            win.prefetch_end, win.prefetch_tokens = self.pos + 1, 0
        elif isinstance(item, Document):
            win.prefetch_tokens -= len(item)
        ahead: list[Any] = []
        first = win.ahead[0] if win.ahead else None
        if first is not None and first[2].done() and not first[2].exception():
            ahead = first[2].result()   # the next chunk, built in the background
        while win.prefetch_end < len(win.tokens) and win.prefetch_tokens < self.prefetch_tokens:
            document = win.tokens[win.prefetch_end]
            if document is None and ahead and first is not None:
                at = win.prefetch_end - first[0]
                document = ahead[at] if 0 <= at < len(ahead) else None
            if document is None:
                break
            if isinstance(document, Document):
                if document.images:
                    need = self.clock() + (
                        win.prefetch_tokens // self.batch_tokens) * self.lanes_per_batch
                    started = [placement.image.prefetch(need) for placement in document.images]
                    if not all(started):
                        break   # the process's pixel budget is spent: try again next time
                win.prefetch_tokens += len(document)
            win.prefetch_end += 1

    def _built(self, win: _Window) -> Document | None:
        """The built document at `pos` with its images checked to decode (their pixels kept
        within the process's pixel budget; decoding of the next ones started within it too),
        or None when it was rejected (counted, or raised)."""
        self._prefetch(win)
        item = win.tokens[self.pos]
        if isinstance(item, Rejected):
            if item.oversize:
                self.oversize += 1
            elif self.on_error == "raise":
                raise item.error
            else:
                self._skip(item.error.reason)
            return None
        try:
            for placement in item.images:
                placement.image.prefetch(self.clock(), needed=True)
            for placement in item.images:
                placement.image.check()   # decoded now: a corrupt image is this record's error
        except DataError as exc:
            if self.on_error == "raise":
                raise
            self._skip(exc.reason)
            del exc
            return None
        return item

    def next_document(self) -> Document | None:
        """The next document (EOS appended), or None when the stream has ended."""
        while not self.done:
            if self._win is None:
                self._win = self._read_window()
            win = self._win
            if self.pos < len(win.texts):
                item = win.tokens[self.pos]
                if item is None and self.documents is None and not win.ahead and not isinstance(
                        win.texts[self.pos], str):
                    item = win.texts[self.pos]   # pre-tokenized (or cached): passes through
                    win.texts[self.pos] = ""
                elif item is None:
                    self._tokenize_from(win, self.pos)
                    item = win.tokens[self.pos]
                if self.documents is None:
                    document = Document(item)
                else:
                    document = self._built(win)
                win.tokens[self.pos] = None
                self.pos += 1
                if document is not None:
                    self._yielded = True
                    return document
                continue
            self._advance_window()
        return None
