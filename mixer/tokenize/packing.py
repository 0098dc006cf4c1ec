"""Packers turn one source's token documents into rows of exactly `seq_len` tokens.

`concat` fills a row with consecutive documents, cutting the last one and continuing it on
the next row. `pad` puts one document (or the next `seq_len` tokens of a long one) per row and
pads the rest. A packer's state is the stream position *before* its pending document plus the
token offset inside it: resuming re-reads that document's window and re-tokenizes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from mixer.errors import StateError
from mixer.stream import SourceStream

IGNORE_INDEX = -100


@dataclass
class Row:
    """One packed row: arrays of length seq_len and how many leading... real tokens it has."""

    input_ids: np.ndarray
    labels: np.ndarray
    position_ids: np.ndarray
    real: int   # tokens that are not padding (they come first)


def build_row(pieces: list[tuple[np.ndarray, bool]], seq_len: int, pad_id: int) -> Row:
    """A row of `seq_len` from (tokens, mask its first label) pieces, padded at the end.

    Positions restart at 0 for every piece; labels equal the tokens except -100 on padding and
    on the first token of each piece flagged for masking.
    """
    input_ids = np.full(seq_len, pad_id, dtype=np.int64)
    position_ids = np.zeros(seq_len, dtype=np.int64)
    labels = np.full(seq_len, IGNORE_INDEX, dtype=np.int64)
    at = 0
    for piece, mask_first in pieces:
        end = at + len(piece)
        input_ids[at:end] = piece
        position_ids[at:end] = np.arange(len(piece))
        labels[at:end] = piece
        if mask_first:
            labels[at] = IGNORE_INDEX
        at = end
    return Row(input_ids, labels, position_ids, at)


class Packer:
    """Rows for one (lane, source)."""

    def __init__(self, stream: SourceStream, *, seq_len: int, mode: Literal["concat", "pad"],
                 pad_id: int, mask_document_boundaries: bool) -> None:
        self.stream = stream
        self.seq_len = seq_len
        self.mode = mode
        self.pad_id = pad_id
        self.mask_boundaries = mask_document_boundaries
        self._pending: tuple[np.ndarray, int, dict] | None = None
        self.exhausted = False

    def state_dict(self) -> dict:
        if self._pending is not None:
            _, offset, before = self._pending
            return {"stream": before, "offset": offset, "exhausted": 0}
        return {"stream": self.stream.state_dict(), "offset": 0, "exhausted": int(self.exhausted)}

    def load_state_dict(self, state: dict | None) -> None:
        self._pending = None
        self.exhausted = False
        if state is None:
            self.stream.load_state_dict(None)
            return
        try:
            self.stream.load_state_dict(state["stream"])
            offset = state["offset"]
            self.exhausted = bool(state["exhausted"])
        except KeyError as exc:
            name = self.stream.table.name
            raise StateError(f"packer state of source {name!r} lacks {exc}") from None
        if offset:
            before = self.stream.state_dict()
            tokens = self.stream.next_document()
            if tokens is None or offset >= len(tokens):
                raise StateError(f"source {self.stream.table.name!r} lane {self.stream.lane}: "
                                 "the pending document no longer matches the state")
            self._pending = (tokens, offset, before)

    def next_row(self) -> Row | None:
        """The next row, or None once the source has no more documents for this lane."""
        if self.exhausted:
            return None
        length = self.seq_len
        pieces: list[np.ndarray] = []
        starts: list[bool] = []
        filled = 0
        while filled < length:
            if self._pending is None:
                before = self.stream.state_dict()
                tokens = self.stream.next_document()
                if tokens is None:
                    break
                self._pending = (tokens, 0, before)
            tokens, offset, before = self._pending
            take = min(length - filled, len(tokens) - offset)
            pieces.append(tokens[offset:offset + take])
            starts.append(offset == 0)
            filled += take
            offset += take
            self._pending = None if offset == len(tokens) else (tokens, offset, before)
            if self.mode == "pad":
                break
        if filled == 0:
            self.exhausted = True
            return None
        return self._row(pieces, starts)

    def _row(self, pieces: list[np.ndarray], starts: list[bool]) -> Row:
        masked = [s and self.mask_boundaries for s in starts]
        return build_row(list(zip(pieces, masked)), self.seq_len, self.pad_id)
