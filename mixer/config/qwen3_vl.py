"""Defaults of the `images` block under `layout: qwen3_vl`: the values of Qwen3-VL's processors.

Images follow the image processor the released Qwen3-VL checkpoints configure
(`Qwen2VLImageProcessor` with 16-pixel patches, mean and std 0.5, between 65536 and 16777216
pixels); videos follow the defaults of transformers' `Qwen3VLVideoProcessor` (the same patches,
mean and std; 2 frames per second, 4 to 768 frames, `size` shortest_edge 131072 and
longest_edge 786432 pixels over all frames of a video). A key the recipe sets wins.
"""

from __future__ import annotations

from typing import Any

QWEN3_VL_IMAGES: dict[str, Any] = {
    "patch_size": 16,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "min_pixels": 65536,
    "max_pixels": 16777216,
    "image_mean": (0.5, 0.5, 0.5),
    "image_std": (0.5, 0.5, 0.5),
}
QWEN3_VL_VIDEO: dict[str, Any] = {
    "fps": 2.0,
    "min_frames": 4,
    "max_frames": 768,
    "min_pixels": 128 * 32 * 32,
    "max_pixels": 768 * 32 * 32,
    "max_video_tokens": 768,
}


def with_qwen3_vl_defaults(data: Any) -> Any:
    """The raw `images` mapping with Qwen3-VL's defaults under the keys it does not set
    (anything else is returned as given)."""
    if not isinstance(data, dict) or data.get("layout") != "qwen3_vl":
        return data
    out = {**QWEN3_VL_IMAGES, **data}
    video = out.get("video")
    if isinstance(video, dict):
        out["video"] = {**QWEN3_VL_VIDEO, **video}
    return out
