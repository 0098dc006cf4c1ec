"""The lane's slice of a source per epoch, read from a cursor: readers, paused readers, cache."""

from __future__ import annotations

import logging
from typing import Any

from mixer.cache.replay import Replay
from mixer.cache.store import TokenCache
from mixer.pipeline.settings import StreamSettings
from mixer.pipeline.slices import SliceItem, lane_slice
from mixer.sources import FORMATS, Record, SourceTable, Split, Storage, read_split

log = logging.getLogger("mixer.stream")

Cursor3 = tuple[int, int, int]  # (slot, index, offset) in the lane's slice of an epoch


class SliceReader:
    """Records of the lane's slice from a cursor; holds the open readers and cache writers."""

    def __init__(
        self,
        table: SourceTable,
        lane: int,
        settings: StreamSettings,
        tokenizer: Any,
        token_cache: TokenCache | None,
    ) -> None:
        self.table = table
        self.lane = lane
        self.settings = settings
        self.tokenizer = tokenizer  # pre-tokenized readers' EOS/vocab
        self.token_cache = token_cache
        self.storage = Storage(table.name, settings.storage_options, block_size=settings.block_size)
        self.splits = tuple(table.splits)
        self._slice_epoch = -1
        self._slice: tuple[SliceItem, ...] = ()
        self.records_read = 0  # work counter (tests assert resume cost with it)
        self._writers: dict[tuple[int, int], Any] = {}  # token-cache entries being filled
        self._live: Any = None  # the reader paused at a full window, with its cursor
        self._missed: set[tuple[int, int]] = set()  # (epoch, slot)s whose lookup missed
        self.resumed_window: tuple[int, int] | None = None

    def reset(self, resumed_window: tuple[int, int] | None) -> None:
        """Forget open readers and lookups (a state was loaded); `resumed_window`: the
        (epoch, window) resumed inside, if any."""
        self.close()  # a resumed stream fills no entry it did not read from the start
        self._missed = set()
        self.resumed_window = resumed_window

    def items(self, epoch: int) -> tuple[SliceItem, ...]:
        """The lane's slice of `epoch`."""
        if self._slice_epoch != epoch:
            self._slice = lane_slice(
                self.splits,
                seed=self.settings.seed,
                source=self.table.name,
                epoch=epoch,
                lanes=self.settings.lanes,
                lane=self.lane,
            )
            self._slice_epoch = epoch
        return self._slice

    def split_of(self, item: SliceItem) -> Split:
        return self.splits[item.split]

    def read_split(self, split: Split, index: int, offset: int) -> Any:
        """A split's records from (index, offset), straight from its file."""
        return read_split(
            storage=self.storage,
            entry=self.table.files[split.file],
            split=split,
            source=self.table.name,
            text_field=self.settings.text_field,
            max_bytes=self.settings.max_document_bytes,
            index=index,
            offset=offset,
            tokenizer=self.tokenizer,
        )

    def records(self, epoch: int, window: int, cursor: Cursor3) -> tuple[Any, Record | None]:
        """Records of the slice from a cursor, reusing the open reader when it is already
        there; with it, the record that reader stopped at (already counted), if any."""
        slot, index, offset = cursor
        live = self._live
        self._live = None
        if live is not None and live[0] == (epoch, slot, index, offset):
            return live[1], live[2]
        if live is not None:
            self.close_reader(live[1])
        items = self.items(epoch)
        split = self.splits[items[slot].split]
        entry = self.table.files[split.file]

        def read(index: int, offset: int) -> Any:
            return self.read_split(split, index, offset)

        if self.token_cache is None or FORMATS[entry.format].pretokenized:
            return read(index, offset), None  # (pre-tokenized formats are what a cache holds)
        return self._cached(epoch, window, slot, read, (index, offset)), None

    def _cached(self, epoch: int, window: int, slot: int, read: Any, at: tuple[int, int]) -> Any:
        """The split's records through the token cache: a replay, or a read (filling the
        entry where this lane may)."""
        assert self.token_cache is not None
        item = self.items(epoch)[slot]
        split = self.splits[item.split]
        entry = self.table.files[split.file]
        # The entry holds every record of the split, so only a lane reading all of it (a
        # stripe of 1) writes one, from the tokens it makes anyway; `mixer cache` fills the
        # splits that lanes share.
        text_field = FORMATS[entry.format].text_field(self.settings.text_field)
        for key in [k for k in self._writers if k[0] != epoch]:
            self._writers.pop(key).close()
        self._missed = {k for k in self._missed if k[0] == epoch}
        if (epoch, slot) in self._writers or (epoch, slot) in self._missed:
            # The reader re-opens at the cursor in a split that missed: read on (one lookup
            # per split, not per window; and a replay of an entry another process stored
            # meanwhile would not feed the entry this stream writes).
            return read(*at)
        adopt = None
        # A resumed window skips the documents before its position: they are not tokenized
        # again, so no entry can be completed from it.
        if item.stride == 1 and (epoch, window) != self.resumed_window:
            adopt = lambda writer, key=(epoch, slot): self._writers.update({key: writer})
        records = self.token_cache.records(
            read,
            entry=entry,
            split=split,
            source=self.table.name,
            text_field=text_field,
            max_bytes=self.settings.max_document_bytes,
            index=at[0],
            offset=at[1],
            adopt=adopt,
        )
        if not isinstance(records, Replay):
            self._missed.add((epoch, slot))
        return records

    def writer(self, epoch: int, slot: int) -> Any:
        """The token-cache entry this lane fills for the slice's split `slot`, if any."""
        return self._writers.get((epoch, slot))

    def end_split(self, epoch: int, slot: int) -> None:
        """The split `slot` was read to its end: complete its cache entry, if one is filled."""
        writer = self._writers.pop((epoch, slot), None)
        if writer is not None:
            writer.end()

    def pause(self, epoch: int, cursor: Cursor3, records: Any, record: Record | None) -> None:
        """Keep `records` open at `cursor` (stopped at `record`) for the next window."""
        self._live = ((epoch, *cursor), records, record)

    def keeps_reader_open(self, item: SliceItem, records: Any) -> bool:
        """Whether a reader paused at a full window stays open for the next window.

        Re-opening at the cursor is cheap for seekable splits (a seek, or decoding part of a
        parquet row group), so those readers close: an open one holds buffers (7 MB for a
        parquet reader in a row group), and there is one per lane and source. A whole-file
        compressed split would decompress from its start again, and a token-cache replay
        would load its entry again: those stay open. (A cache entry being written lives in
        `_writers`, not in the reader: the reader of a cache miss closes as without a cache.)"""
        return not self.splits[item.split].seekable or isinstance(records, Replay)

    def inner(self, epoch: int, slot: int, record: Record | None, records: Any) -> float:
        """The part of the slice's split `slot` before `record`, measured where the cursor's
        offset cannot measure it: stored bytes consumed, or a cache entry's records."""
        if record is None:
            return -1.0
        if isinstance(records, Replay):
            return records.fraction(record.index)
        if record.consumed < 0:
            return -1.0
        size = self.table.files[self.splits[self.items(epoch)[slot].split].file].size
        return record.consumed / max(size, 1)

    def close(self) -> None:
        """Give up the cache entries being written and close the open reader."""
        for writer in self._writers.values():
            writer.close()
        self._writers = {}
        live, self._live = self._live, None
        if live is not None:
            self.close_reader(live[1])

    def close_reader(self, records: Any) -> None:
        """Close a paused reader; a failure is logged, not raised (cleanup must not hide an
        error or stop the other streams from closing)."""
        try:
            if hasattr(records, "close"):
                records.close()
        except Exception as exc:
            log.debug("closing a reader of source %r failed: %s", self.table.name, exc)
