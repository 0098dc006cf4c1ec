"""Packers turn one source's documents into rows of exactly `seq_len` tokens.

`concat` fills a row with consecutive documents, cutting the last one and continuing it on
the next row; a document with images is never cut: it moves whole to the next row. `pad`
puts one document (or the next `seq_len` tokens of a long one) per row and pads the rest. A
packer's state is the stream position *before* its pending document plus the token offset
inside it: resuming re-reads that document's window and re-tokenizes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np

from mixer.core.document import Budget, Document, DocumentSource, StreamState
from mixer.core.errors import StateError
from mixer.pipeline.packer_state import ConcatPackerState, PackerState

IGNORE_INDEX = -100


class _Blocked:
    def __repr__(self) -> str:
        return "BLOCKED"


BLOCKED = _Blocked()
"""What `next_row(budget)` returns when the next document's images do not fit what is left of
the batch's caps: the document waits for the next batch (it is never dropped)."""


class Piece(NamedTuple):
    """`document.tokens[offset:offset + length]` placed at `at` in a row (a named tuple: a
    row makes one or two, ~1 µs less each than a frozen dataclass)."""

    at: int
    document: Document
    offset: int
    length: int
    mask_first: bool  # its first label is -100 (a document boundary the recipe masks)


class Row:
    """One packed row: its pieces back to back from position 0 (the real tokens), then padding
    up to seq_len. Its arrays are made when first asked for; a batch's rows are written at
    once by `rows_arrays`, without them."""

    __slots__ = ("pieces", "real", "seq_len", "pad_id", "starts", "_arrays")

    def __init__(
        self, pieces: tuple[Piece, ...], real: int, seq_len: int, pad_id: int, starts: int
    ) -> None:
        self.pieces = pieces
        self.real = real  # tokens that are not padding (they come first)
        self.starts = starts  # pieces that begin their document
        self.seq_len = seq_len
        self.pad_id = pad_id
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def input_ids(self) -> np.ndarray:
        return self._made()[0]

    @property
    def labels(self) -> np.ndarray:
        return self._made()[1]

    @property
    def position_ids(self) -> np.ndarray:
        return self._made()[2]

    @property
    def counts(self) -> tuple[int, int, int]:
        """(images, patches, videos) of its documents, as the batch caps count them."""
        images = patches = videos = 0
        for p in self.pieces:
            i, pa, v = p.document.counts
            images, patches, videos = images + i, patches + pa, videos + v
        return images, patches, videos

    @property
    def images(self) -> int:
        return self.counts[0]

    @property
    def patches(self) -> int:
        return self.counts[1]

    def _made(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._arrays is None:
            ids, labels, positions, _ = rows_arrays([self], self.seq_len, self.pad_id)
            self._arrays = (ids[0], labels[0], positions[0])
        return self._arrays


def build_row(
    pieces: list[tuple[Document, int, int, bool]],
    seq_len: int,
    pad_id: int,
    starts: int | None = None,
) -> Row:
    """A row of `seq_len` from (document, offset, length, mask first label) pieces; `starts`:
    how many begin their document (default: those at offset 0)."""
    placed = []
    at = 0
    for document, offset, length, mask_first in pieces:
        placed.append(Piece(at, document, offset, length, mask_first))
        at += length
    return Row(
        tuple(placed),
        at,
        seq_len,
        pad_id,
        sum(1 for p in pieces if p[1] == 0) if starts is None else starts,
    )


_COUNTING = np.arange(0, dtype=np.int64)


def _counting(length: int) -> np.ndarray:
    """0, 1, ..., at least `length` - 1 (shared, read-only: position ids are slices of it)."""
    global _COUNTING
    if len(_COUNTING) < length:
        _COUNTING = np.arange(length, dtype=np.int64)
        _COUNTING.flags.writeable = False
    return _COUNTING


def rows_arrays(
    rows: Sequence[Row | None], seq_len: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """`input_ids`, `labels` and `position_ids` ([len(rows), seq_len] int64) of packed rows
    (None: a row of padding), and the mask of their real tokens (None when every token is
    real). Positions restart at 0 for every piece; labels equal the tokens except -100 on
    padding and on the first token of each piece flagged for masking.

    Made at once for a whole batch: one concatenation of the pieces' token views, one of
    slices of a shared arange for the positions.
    """
    parts, lengths, masked, reals = [], [], [], []
    for index, row in enumerate(rows):
        if row is None:
            reals.append(0)
            continue
        reals.append(row.real)
        for at, document, offset, length, mask_first in row.pieces:
            parts.append(document.tokens[offset : offset + length])
            lengths.append(length)
            if mask_first:
                masked.append(index * seq_len + at)
    shape = (len(rows), seq_len)
    counting = _counting(seq_len)
    if parts:  # (a concatenation casting into an int64 `out` is twice as slow as this)
        tokens = np.concatenate(parts).astype(np.int64, copy=False)
        flat_positions = np.concatenate([counting[:length] for length in lengths])
    else:
        tokens = flat_positions = np.zeros(0, dtype=np.int64)
    if len(tokens) == shape[0] * seq_len:
        real = None
        ids, positions = tokens.reshape(shape), flat_positions.reshape(shape)
        labels = ids.copy()
    else:
        real = counting[:seq_len] < np.array(reals, dtype=np.int64)[:, None]
        ids = np.full(shape, pad_id, dtype=np.int64)
        ids[real] = tokens
        positions = np.zeros(shape, dtype=np.int64)
        positions[real] = flat_positions
        labels = np.where(real, ids, IGNORE_INDEX)
    if masked:
        labels.reshape(-1)[masked] = IGNORE_INDEX
    return ids, labels, positions, real


def _kept(
    document: Document, offset: int, before: StreamState, cut: int
) -> tuple[Document, int, StreamState, int]:
    """A pending document as a packer keeps it: a text document's packed front is cut off
    (copied out) once it is at least half the tokens held; every token copied is one that then
    leaves memory, so a document is copied at most about once over."""
    if document.images or 2 * offset < len(document):
        return (document, offset, before, cut)
    return (Document(document.tokens[offset:].copy(), meta=document.meta), 0, before, cut + offset)


class Packer:
    """Rows for one (lane, source): `concat` or `pad`."""

    def __init__(
        self,
        stream: DocumentSource,
        *,
        seq_len: int,
        mode: Literal["concat", "pad"],
        pad_id: int,
        mask_document_boundaries: bool,
    ) -> None:
        self.stream = stream
        self.seq_len = seq_len
        self.mode = mode
        self.pad_id = pad_id
        self.mask_boundaries = mask_document_boundaries
        # The document the next row starts with: (document, offset in it, the stream's state
        # before it, tokens cut off its front). A long document's packed front is cut off once
        # it is half of what is held (`_kept`): a packer of a source drawn rarely holds only
        # what it has yet to pack.
        self._pending: tuple[Document, int, StreamState, int] | None = None
        self.exhausted = False

    def progress(self) -> float:
        """Passes over the lane's slice behind the stream's position (an estimate for
        metrics; the one pending document read ahead counts)."""
        progress = getattr(self.stream, "progress", None)
        return progress() if progress is not None else 0.0

    def state_dict(self) -> ConcatPackerState:
        if self._pending is not None:
            _, offset, before, cut = self._pending
            return {"stream": before, "offset": cut + offset, "exhausted": 0}
        return {"stream": self.stream.state_dict(), "offset": 0, "exhausted": int(self.exhausted)}

    def load_state_dict(self, state: PackerState | None) -> None:
        self._pending = None
        self.exhausted = False
        if state is None:
            self.stream.load_state_dict(None)
            return
        if "offset" not in state:  # (a best_fit packer's state)
            raise StateError(f"packer state of source {self.stream.name!r} lacks 'offset'")
        try:
            self.stream.load_state_dict(state["stream"])
            offset = state["offset"]
            self.exhausted = bool(state["exhausted"])
        except KeyError as exc:
            raise StateError(f"packer state of source {self.stream.name!r} lacks {exc}") from None
        if offset:
            before = self.stream.state_dict()
            document = self.stream.next_document()
            if document is None or offset >= len(document) or not document.splittable:
                raise StateError(
                    f"source {self.stream.name!r} lane {self.stream.lane}: "
                    "the pending document no longer matches the state"
                )
            self._pending = (document, offset, before, 0)

    def peek(self) -> Document | None:
        """The document the next row starts with (read ahead; the state does not move)."""
        if self._pending is None and not self.exhausted:
            before = self.stream.state_dict()
            document = self.stream.next_document()
            if document is not None:
                self._pending = (document, 0, before, 0)
        return None if self._pending is None else self._pending[0]

    def next_row(self, budget: Budget | None = None) -> Row | None | _Blocked:
        """The next row, None once the source has no more documents for this lane, or BLOCKED
        when its first document's images exceed what is left of `budget`."""
        if self.exhausted:
            return None
        length = self.seq_len
        pieces: list[tuple[Document, int, int, bool]] = []
        filled = images = patches = videos = 0
        continued = False  # the row's first piece goes on with a document begun before
        while filled < length:
            document, pending = self.peek(), self._pending
            if document is None or pending is None:  # (peek: a document iff one is pending)
                break
            _, offset, before, cut = pending
            if document.images:
                i, p, v = document.counts
                if budget is not None and not budget.allows(images + i, patches + p, videos + v):
                    if filled:
                        break  # the row ends here; the document waits for the next batch
                    return BLOCKED
                images, patches, videos = images + i, patches + p, videos + v
            size = len(document)
            take = min(length - filled, size - offset)
            if take < size - offset and not document.splittable:
                if filled:
                    break  # a document with images moves whole to the next row
                raise StateError(
                    f"source {self.stream.name!r}: a document of "
                    f"{len(document)} tokens with images exceeds seq_len {length}"
                )
            if not pieces:
                continued = offset + cut > 0
            pieces.append((document, offset, take, offset + cut == 0 and self.mask_boundaries))
            filled += take
            offset += take
            self._pending = None if offset == size else _kept(document, offset, before, cut)
            if self.mode == "pad":
                break
        if filled == 0:
            self.exhausted = True
            return None
        # (only the first piece can be a document's continuation: one cut at its front)
        return build_row(pieces, self.seq_len, self.pad_id, len(pieces) - (1 if continued else 0))
