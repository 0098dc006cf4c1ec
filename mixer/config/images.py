"""The recipe's `images:` block: how images become pixels and sequence tokens."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from mixer.config.fields import Float, Int, _Frozen
from mixer.config.qwen3_vl import with_qwen3_vl_defaults
from mixer.config.video import VideoSettings

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_IMAGE_SIDE = 1 << 15


class ImageSettings(_Frozen):
    """The `images:` block: how images become pixels and sequence tokens (docs/recipes.md)."""

    layout: Literal["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava"] = Field(
        description="Batch layout and image tokens."
    )
    patch_size: Int = Field(default=14, ge=1, le=1024, description="Vision patch side (pixels).")
    merge_size: Int = Field(
        default=2, ge=1, le=64, description="qwen2_vl: patches merged per side into one token."
    )
    temporal_patch_size: Int = Field(
        default=2, ge=1, le=64, description="qwen2_vl: frames per temporal patch."
    )
    min_pixels: Int = Field(
        default=3136,
        ge=1,
        le=MAX_IMAGE_SIDE**2,
        description="qwen2_vl: lower bound on a resized image's pixels.",
    )
    max_pixels: Int = Field(
        default=1003520,
        ge=1,
        le=MAX_IMAGE_SIDE**2,
        description="qwen2_vl: upper bound on a resized image's pixels.",
    )
    image_size: Int = Field(
        default=336, ge=1, le=MAX_IMAGE_SIDE, description="llava: side of the square centre crop."
    )
    resize: Literal["pil", "torchvision"] = Field(
        default="pil",
        description="Resampling of images: pil (the ...Pil processors') or torchvision (the "
        "torchvision processors', what AutoImageProcessor picks where torchvision is installed).",
    )
    image_mean: tuple[Float, Float, Float] = Field(default=CLIP_MEAN)
    image_std: tuple[Float, Float, Float] = Field(default=CLIP_STD)
    marker: str = Field(
        default="<image>",
        min_length=1,
        description="Where the text holds it, each marker is the next image.",
    )
    max_images_per_batch: Int | None = Field(
        default=None, ge=1, description="Cap per rank batch (null: none)."
    )
    max_patches_per_batch: Int | None = Field(
        default=None, ge=1, description="qwen2_vl: cap on pixel_values rows."
    )
    max_source_pixels: Int = Field(
        default=64 << 20, ge=1, le=1 << 40, description="Larger stored images are refused (bombs)."
    )
    video: VideoSettings | None = Field(
        default=None, description="Video members (null: a video is bad input)."
    )
    video_marker: str = Field(
        default="<video>",
        min_length=1,
        description="Where the text holds it, each marker is the next video.",
    )
    max_videos_per_batch: Int | None = Field(
        default=None, ge=1, description="Cap on videos per rank batch."
    )
    tokens_per_second: Int = Field(
        default=2, ge=1, le=1 << 20, description="qwen2_5_vl: temporal positions per second."
    )

    @model_validator(mode="before")
    @classmethod
    def _layout_defaults(cls, data: object) -> object:
        return with_qwen3_vl_defaults(data)  # (qwen3_vl: its processors' defaults)

    @field_validator("image_std")
    @classmethod
    def _positive_std(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(v <= 0 for v in value):
            raise ValueError("image_std values must be positive")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ImageSettings:
        if self.min_pixels > self.max_pixels:
            raise ValueError(
                f"min_pixels ({self.min_pixels}) is more than max_pixels ({self.max_pixels})"
            )
        if self.layout == "llava" and self.image_size % self.patch_size:
            raise ValueError(
                f"images.image_size ({self.image_size}) is not a multiple of "
                f"images.patch_size ({self.patch_size})"
            )
        if self.layout == "llava" and (
            self.video is not None or self.max_videos_per_batch is not None
        ):
            raise ValueError(
                "images.video: only the qwen2_vl, qwen2_5_vl and qwen3_vl layouts take videos"
            )
        if self.video is not None and self.video_marker == self.marker:
            raise ValueError(
                f"images.video_marker is images.marker ({self.marker!r}): a "
                "marker stands for one kind of medium"
            )
        if self.layout == "llava" and self.max_patches_per_batch is not None:
            raise ValueError(
                "images.max_patches_per_batch: only the qwen2_vl layout has "
                "patches per image that vary"
            )
        return self
