"""Which batch layout a recipe's batches have: text, the image layout its `images` names, or
the audio layout its `audio` names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mixer.pipeline.batch import BatchLayout

if TYPE_CHECKING:
    from mixer.config.recipe import Recipe
    from mixer.core.token_info import TokenizerInfo


def layout_for(recipe: Recipe, tokenizer: TokenizerInfo) -> BatchLayout:
    """The layout a recipe's batches have: text, the image layout its `images` block names,
    or the audio layout its `audio` block names."""
    if getattr(recipe, "audio", None) is not None:
        from mixer.audio.layout import audio_layout  # (imports PyAV only when needed)

        return audio_layout(recipe, tokenizer)
    images = getattr(recipe, "images", None)
    if images is None:
        return BatchLayout(
            seq_len=recipe.seq_len,
            pad_id=tokenizer.pad_id,
            flatten=getattr(recipe, "flatten", False),
        )
    if images.layout == "qwen3_vl":
        from mixer.images.qwen3_vl import Qwen3VLLayout  # (imports PIL only when needed)

        return Qwen3VLLayout(recipe, tokenizer)
    from mixer.images.layouts import LAYOUTS

    return LAYOUTS[images.layout](recipe, tokenizer)
