"""The states of the packers (`packing:` in a recipe), as `state_dict()` returns them."""

from __future__ import annotations

from typing import TypedDict, final

from mixer.core.document import StreamState


@final
class ConcatPackerState(TypedDict):
    """A `concat` or `pad` packer's state: the stream before the pending document, the
    tokens of it already packed, and whether the source has run out (0 or 1)."""

    stream: StreamState
    offset: int
    exhausted: int


@final
class BestFitPackerState(TypedDict):
    """A `best_fit` packer's state: the stream at the window's start, the rows of the
    window already emitted, and whether the source has run out (0 or 1)."""

    stream: StreamState
    emitted: int
    exhausted: int


PackerState = ConcatPackerState | BestFitPackerState
"""A packer's state; its shape follows the recipe's `packing` (`best_fit` or the others)."""
