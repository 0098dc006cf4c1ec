"""The packer registry: `packing:` in a recipe names one entry.

Every packer takes any `DocumentSource` and has the same interface: `next_row()` (a `Row`,
or None once the source has run out for its lane), resumable state through `state_dict()` /
`load_state_dict()`, `exhausted`, `progress()` (the epochs its rows hold) and `stream` (its
source).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from mixer.core.document import Budget, DocumentSource
from mixer.core.registry import PACKERS
from mixer.pipeline.best_fit import BestFitPacker
from mixer.pipeline.packer_state import PackerState
from mixer.pipeline.packing import Packer, Row


class RowPacker(Protocol):
    stream: DocumentSource
    exhausted: bool

    def next_row(self, budget: Budget | None = None) -> Row | None | object:
        """A row; None once exhausted; `packing.BLOCKED` when over what is left of `budget`."""
        ...

    def progress(self) -> float:
        """Passes over the lane's slice that the rows handed out hold (metrics' `epochs`)."""
        ...

    def state_dict(self) -> PackerState: ...

    def load_state_dict(self, state: PackerState | None) -> None: ...


# (source, seq_len, pad_id, mask_document_boundaries, window, per-batch image caps) -> packer
PackerFactory = Callable[[DocumentSource, int, int, bool, int, Budget | None], RowPacker]

PACKERS.update(
    {
        "concat": lambda source, seq_len, pad_id, mask, window, caps: Packer(
            source, seq_len=seq_len, mode="concat", pad_id=pad_id, mask_document_boundaries=mask
        ),
        "pad": lambda source, seq_len, pad_id, mask, window, caps: Packer(
            source, seq_len=seq_len, mode="pad", pad_id=pad_id, mask_document_boundaries=mask
        ),
        "best_fit": lambda source, seq_len, pad_id, mask, window, caps: BestFitPacker(
            source,
            seq_len=seq_len,
            pad_id=pad_id,
            mask_document_boundaries=mask,
            window=window,
            caps=caps,
        ),
    }
)


def make_packer(
    name: str,
    source: DocumentSource,
    *,
    seq_len: int,
    pad_id: int,
    mask_document_boundaries: bool,
    window: int,
    caps: Budget | None = None,
) -> RowPacker:
    """The packer registered as `name`, drawing from `source`. `caps`: a batch's image caps
    (a row never holds more; concat and pad end a row early instead)."""
    return PACKERS[name](source, seq_len, pad_id, mask_document_boundaries, window, caps)
