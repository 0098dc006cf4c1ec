"""The settings of one source's document stream, unpacked from the recipe in one place."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mixer.config.recipe import Recipe, SourceConfig


@dataclass(frozen=True)
class StreamSettings:
    """What a `SourceStream` and its stages read from the recipe (and the lane's layout)."""

    lanes: int
    seed: int
    epochs: int | None
    on_error: str
    text_field: str | None
    window_docs: int
    window_bytes: int
    max_document_bytes: int
    storage_options: dict[str, Any] = field(default_factory=dict)
    block_size: int = 8 << 20
    prefetch_tokens: int = 0  # decode images this many tokens ahead
    # A document `batch_tokens` further on is needed `lanes_per_batch` global batches later.
    batch_tokens: int = 1
    lanes_per_batch: int = 1

    @classmethod
    def from_recipe(
        cls, recipe: Recipe, source: SourceConfig, *, block_size: int = 8 << 20
    ) -> StreamSettings:
        """The settings of `source`'s stream in a lane of `recipe`."""
        return cls(
            lanes=recipe.lanes,
            seed=recipe.seed,
            epochs=source.epochs,
            on_error=source.on_error,
            text_field=source.chosen_text_field,
            window_docs=recipe.shuffle_window,
            window_bytes=recipe.window_bytes,
            max_document_bytes=recipe.max_document_bytes,
            storage_options=source.storage_options,
            block_size=block_size,
            prefetch_tokens=2 * recipe.batch_size * recipe.seq_len,
            batch_tokens=recipe.batch_size * recipe.seq_len,
            lanes_per_batch=recipe.lanes,
        )
