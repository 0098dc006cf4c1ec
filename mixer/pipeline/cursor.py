"""The stream's position (cursor, counts, end) and its state dict, progress and window advance."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mixer.core.document import StreamState
from mixer.core.errors import StateError
from mixer.pipeline.slices import SliceItem
from mixer.sources import Split

if TYPE_CHECKING:
    from mixer.pipeline.window import Window

STATE_KEYS = ("epoch", "window", "slot", "index", "offset", "pos", "skipped", "done")
EMPTY_EPOCH_LIMIT = 64  # consecutive empty epochs after which a lane's source counts as empty


class Cursor:
    """Where a stream is: the window's start cursor and the position inside the window."""

    def __init__(self, name: str, lane: int, epochs: int | None, with_oversize: bool) -> None:
        self.name = name
        self.lane = lane
        self.epochs = epochs
        self.with_oversize = with_oversize  # image recipes count oversize documents
        self.load_state_dict(None)

    def state_dict(self) -> StreamState:
        """Position before the next document (plain ints)."""
        state: StreamState = {
            "epoch": self.epoch,
            "window": self.window_index,
            "slot": self.start[0],
            "index": self.start[1],
            "offset": self.start[2],
            "pos": self.pos,
            "skipped": self.skipped_before,
            "done": int(self.done),
        }
        if self.with_oversize:
            state["oversize"] = self.oversize
        if self.reasons_before:
            state["reasons"] = dict(sorted(self.reasons_before.items()))
        return state

    def load_state_dict(self, state: StreamState | None) -> None:
        state = state or {
            "epoch": 0,
            "window": 0,
            "slot": 0,
            "index": 0,
            "offset": 0,
            "pos": 0,
            "skipped": 0,
            "done": 0,
        }
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise StateError(f"source {self.name!r} lane {self.lane}: stream state lacks {missing}")
        self.epoch = state["epoch"]
        self.window_index = state["window"]
        self.start = (state["slot"], state["index"], state["offset"])
        self.pos = state["pos"]
        self.done = bool(state["done"])
        self.skipped_before = state["skipped"]
        self.reasons_before: dict[str, int] = dict(state.get("reasons", {}))  # type: ignore[arg-type]
        self.oversize = state.get("oversize", 0)  # documents too long for a row, skipped
        self.empty_epochs = 0
        # Whether this epoch has yielded a document yet. Loaded mid-epoch, unknown: taken as
        # yes (the epoch does not count as empty), so a resumed lane never gives up early.
        self.yielded = not (self.window_index == 0 and self.pos == 0)

    @property
    def resumed_window(self) -> tuple[int, int] | None:
        """The (epoch, window) this position is inside of, when not at its start."""
        return (self.epoch, self.window_index) if self.pos else None

    def skip(self, reason: str, n: int = 1) -> None:
        """Count `n` skipped records, in total and under their reason."""
        self.skipped_before += n
        self.reasons_before[reason] = self.reasons_before.get(reason, 0) + n

    def skipped(self, win: Window | None) -> int:
        return self.skipped_before + (win.skipped if win else 0)

    def skipped_reasons(self, win: Window | None) -> dict[str, int]:
        """`skipped`, per reason (`DataError.reason`)."""
        out = dict(self.reasons_before)
        for reason, n in (win.reasons if win else {}).items():
            out[reason] = out.get(reason, 0) + n
        return out

    def advance(self, win: Window, on_empty: Callable[[], None]) -> None:
        """Move past `win` (fully consumed). `on_empty()` is asked when an epoch of an
        unlimited source yielded no document (it raises when the source holds none)."""
        for reason, n in win.reasons.items():  # (they add up to win.skipped)
            self.skip(reason, n)
        if win.end_of_epoch:
            # Empty: the epoch yielded no document -- no records, or (image recipes) every
            # record rejected as oversize or skipped -- not merely no records.
            empty = not self.yielded
            self.yielded = False
            if empty and self.epochs is None:
                on_empty()
            self.empty_epochs = self.empty_epochs + 1 if empty else 0
            self.epoch += 1
            self.window_index = 0
            self.start = (0, 0, 0)
            if (self.epochs is not None and self.epoch >= self.epochs) or (
                self.empty_epochs >= EMPTY_EPOCH_LIMIT
            ):
                self.done = True
        else:
            self.window_index += 1
            self.start = win.end
        self.pos = 0

    def progress(
        self, items: tuple[SliceItem, ...], splits: tuple[Split, ...], win: Window | None
    ) -> float:
        """Completed passes over the lane's slice (an estimate for metrics): epochs done plus
        the part of the current epoch behind the reading position, measured in splits (and
        within a split where its size is known), interpolated over the current window.
        `items`: the slice of the current epoch."""
        if self.done:
            return float(self.epochs if self.epochs is not None else self.epoch)
        if not items:
            return float(self.epoch)
        if win is None:
            return self.epoch + fraction(items, splits, self.start)
        if win.span is None:  # (fixed while `win` is the window: asked for every batch)
            done = fraction(items, splits, self.start, win.inner_start)
            end = 1.0 if win.end_of_epoch else fraction(items, splits, win.end, win.inner_end)
            win.span = (done, end)
        done, end = win.span
        if win.items:
            done += (end - done) * min(self.pos / len(win.items), 1.0)
        return self.epoch + done


def fraction(
    items: tuple[SliceItem, ...],
    splits: tuple[Split, ...],
    cursor: tuple[int, int, int],
    inner: float = -1.0,
) -> float:
    """The part of the slice before `cursor`; `inner`: the part of the cursor's split before
    it, where known otherwise (-1: from the split's record count or range)."""
    slot, index, offset = cursor
    if slot >= len(items):
        return 1.0
    split = splits[items[slot].split]
    if inner < 0:
        inner = 0.0
        if split.records > 0:
            inner = index / split.records
        elif split.dend >= 0 and offset:  # a group of zstd frames: decompressed bytes
            inner = (offset - split.dstart) / max(split.dend - split.dstart, 1)
        elif split.seekable and split.end > split.start and offset:
            inner = (offset - split.start) / (split.end - split.start)
    # A split is done only once the cursor has left it (a whole compressed file may be read
    # to its end while its last records still wait in the window).
    return (slot + min(max(inner, 0.0), 0.999)) / len(items)
