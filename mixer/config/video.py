"""The recipe's `images.video` block: how video members become frames, pixels and tokens.

Keys and defaults are those of transformers' `Qwen2VLVideoProcessor`; patch, merge and
temporal sizes, mean and std are the `images` block's.
"""

from __future__ import annotations

import importlib.util

from pydantic import Field, model_validator

from mixer.config.fields import Float, Int, _Frozen

MAX_FRAME_PIXELS = 1 << 30


class VideoSettings(_Frozen):
    """The `images.video` block (docs/recipes.md)."""

    fps: Float = Field(default=2.0, gt=0, le=1000, description="Frames sampled per second.")
    min_frames: Int = Field(default=4, ge=1, le=1 << 20, description="Fewest frames sampled.")
    max_frames: Int = Field(default=768, ge=1, le=1 << 20, description="Most frames sampled.")
    min_pixels: Int = Field(
        default=128 * 28 * 28,
        ge=1,
        le=MAX_FRAME_PIXELS,
        description="Lower bound on a resized frame's pixels.",
    )
    max_pixels: Int = Field(
        default=768 * 28 * 28,
        ge=1,
        le=MAX_FRAME_PIXELS,
        description="Upper bound on a resized frame's pixels.",
    )
    cap_pixels_per_frame: bool = Field(
        default=False, description="Bound each frame by an even share of max_video_tokens."
    )
    max_video_tokens: Int = Field(
        default=128000, ge=1, le=1 << 30, description="Token budget behind cap_pixels_per_frame."
    )
    max_source_frames: Int = Field(
        default=100_000, ge=1, le=1 << 31, description="Longer stored videos are refused."
    )

    @model_validator(mode="after")
    def _consistent(self) -> VideoSettings:
        if self.min_pixels > self.max_pixels:
            raise ValueError(
                f"min_pixels ({self.min_pixels}) is more than max_pixels ({self.max_pixels})"
            )
        if self.min_frames > self.max_frames:
            raise ValueError(
                f"min_frames ({self.min_frames}) is more than max_frames ({self.max_frames})"
            )
        if importlib.util.find_spec("av") is None:
            raise ValueError(
                "decoding videos needs PyAV, the optional extra 'video': "
                "pip install 'mixer[video]' (or pip install av)"
            )
        return self
