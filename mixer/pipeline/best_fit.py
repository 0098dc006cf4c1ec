"""Best-fit-decreasing packing over a reconstructible window of documents.

The packer draws `window` documents, cuts each into pieces of at most `seq_len` tokens (a
document with images stays whole), and places the pieces, longest first, into the fullest row
that still has room (a new row when none has). Far fewer documents are cut than with `concat`.
The plan is a pure function of the window's documents, so the state is the stream position at
the window's start plus the number of rows already emitted: resuming re-reads one window and
recomputes the plan.
"""

from __future__ import annotations

import bisect

from mixer.core.document import Budget, Document, DocumentSource, StreamState
from mixer.core.errors import StateError
from mixer.pipeline.packer_state import BestFitPackerState, PackerState
from mixer.pipeline.packing import BLOCKED, Row, _Blocked, build_row


def plan_rows(
    lengths: list[int],
    seq_len: int,
    images: list[tuple[int, int, int]] | None = None,
    caps: Budget | None = None,
) -> list[list[int]]:
    """Best-fit decreasing: piece indices per row, rows in the order they were opened.

    With `images` ((images, patches, videos) per piece) and `caps`, a row also never holds
    more images, patches or videos than a whole batch may: the fullest row with room that
    stays within them is chosen.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    held: list[list[int]] = []  # (images, patches, videos) per row
    free: list[tuple[int, int]] = []  # sorted (room left, row index)
    for piece in order:
        size = lengths[piece]
        extra = images[piece] if images is not None else (0, 0, 0)
        at = bisect.bisect_left(free, (size, -1))
        if caps is not None and any(extra):
            while at < len(free) and not caps.allows(
                *(h + e for h, e in zip(held[free[at][1]], extra))
            ):
                at += 1
        if at < len(free):
            room, row = free.pop(at)
            rows[row].append(piece)
            if room - size:
                bisect.insort(free, (room - size, row))
        else:
            row = len(rows)
            rows.append([piece])
            held.append([0, 0, 0])
            if seq_len - size:
                bisect.insort(free, (seq_len - size, row))
        held[row] = [h + e for h, e in zip(held[row], extra)]
    return rows


class BestFitPacker:
    """Rows for one (lane, source), packed best-fit over windows of documents."""

    def __init__(
        self,
        stream: DocumentSource,
        *,
        seq_len: int,
        pad_id: int,
        mask_document_boundaries: bool,
        window: int,
        caps: Budget | None = None,
    ) -> None:
        self.stream = stream
        self.caps = caps
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.mask_boundaries = mask_document_boundaries
        self.window = window
        self.exhausted = False
        self._start: StreamState = stream.state_dict()
        self._emitted = 0
        self._rows: list[Row] | None = None
        # The stream's progress before and after reading the planned window, and the
        # documents that start in the window's first k rows (k = 0..rows).
        self._span: tuple[float, float, list[int]] | None = None

    def state_dict(self) -> BestFitPackerState:
        if self.exhausted:  # the stream at its end (done), not the last window's start: a
            # resumed lane's progress and final state are those of an uninterrupted run
            return {"stream": self.stream.state_dict(), "emitted": 0, "exhausted": 1}
        return {"stream": self._start, "emitted": self._emitted, "exhausted": 0}

    def progress(self) -> float:
        """Passes over the lane's slice that the rows handed out hold: documents read into
        the packing window count as their rows are emitted (an estimate for metrics)."""
        progress = getattr(self.stream, "progress", None)
        if progress is None:
            return 0.0
        if self.exhausted or self._rows is None or self._span is None:
            return progress()
        before, after, starts = self._span
        if not starts[-1]:
            return after
        return before + (after - before) * starts[self._emitted] / starts[-1]

    def load_state_dict(self, state: PackerState | None) -> None:
        self._rows = None
        self._span = None
        if state is None:
            self.stream.load_state_dict(None)
            self._start, self._emitted, self.exhausted = self.stream.state_dict(), 0, False
            return
        if "emitted" not in state:  # (a concat or pad packer's state)
            name = self.stream.name
            raise StateError(f"best_fit packer state of source {name!r} lacks 'emitted'")
        try:
            self.stream.load_state_dict(state["stream"])
            self._start, self._emitted = state["stream"], state["emitted"]
            self.exhausted = bool(state["exhausted"])
        except KeyError as exc:
            name = self.stream.name
            raise StateError(f"best_fit packer state of source {name!r} lacks {exc}") from None

    def _plan(self) -> list[Row]:
        progress = getattr(self.stream, "progress", None)
        before = progress(saved=False) if progress is not None else 0.0
        pieces: list[tuple[Document, int, int, bool]] = []  # (document, offset, length, start)
        for _ in range(self.window):
            document = self.stream.next_document()
            if document is None:
                break
            if not document.splittable:
                pieces.append((document, 0, len(document), True))
                continue
            for at in range(0, len(document), self.seq_len):
                pieces.append((document, at, min(self.seq_len, len(document) - at), at == 0))
        images = [p[0].counts for p in pieces]
        plan = plan_rows([p[2] for p in pieces], self.seq_len, images, self.caps)
        starts = [0]
        for row in plan:
            starts.append(starts[-1] + sum(pieces[i][3] for i in row))
        self._span = (before, progress() if progress is not None else 0.0, starts)
        return [self._row([pieces[i] for i in row]) for row in plan]

    def _row(self, pieces: list[tuple[Document, int, int, bool]]) -> Row:
        # A piece placed after another one follows a different document: mask its first token
        # like a document start.
        masked = [
            (doc, offset, length, self.mask_boundaries and (starts or i > 0))
            for i, (doc, offset, length, starts) in enumerate(pieces)
        ]
        return build_row(masked, self.seq_len, self.pad_id)

    def next_row(self, budget: Budget | None = None) -> Row | None | _Blocked:
        """The next row, None once the source has no more documents for this lane, or BLOCKED
        when the row's images exceed what is left of `budget` (it waits for the next batch)."""
        while not self.exhausted:
            if self._rows is None:
                self._rows = self._plan()  # replays the window up to `emitted` on resume
            if self._emitted < len(self._rows):
                row = self._rows[self._emitted]
                if budget is not None and row.pieces and not budget.allows(*row.counts):
                    return BLOCKED
                self._emitted += 1
                return row
            if self.stream.done:
                self.exhausted = True
                return None
            self._start, self._emitted, self._rows = self.stream.state_dict(), 0, None
        return None
