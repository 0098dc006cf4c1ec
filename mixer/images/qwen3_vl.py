"""The qwen3_vl layout: Qwen3-VL's images and videos, as transformers' `Qwen3VLProcessor` makes
them (its image processor, `Qwen2VLImageProcessor`, and `Qwen3VLVideoProcessor`).

Images are qwen2_vl's (`processing.Qwen2VLProcessing` with Qwen3-VL's defaults, see
`config.qwen3_vl`). Videos differ from qwen2_vl's in four ways, each the video processor's:

- **Frames.** n = int(total / rate × fps), clamped to [min_frames, min(max_frames, total)]
  and not rounded to temporal_patch_size; indices round(linspace(0, total - 1, n)). The last
  frame is repeated up to a multiple of temporal_patch_size (`pad_frames`).
- **Size.** One size for all frames from the processor's `smart_resize` over the video's
  volume: min_pixels and max_pixels bound t' · h · w (t' = n rounded to temporal_patch_size),
  a frame smaller than patch × merge is first scaled up to it; with `cap_pixels_per_frame`
  max_pixels becomes n · max(min(max_video_tokens · factor², max_pixels // n),
  int(1.05 · min_pixels)).
- **Tokens.** Each temporal patch is `<t seconds><|vision_start|>` + its h·w/merge²
  `<|video_pad|>` + `<|vision_end|>`, t the mean time of its first and last frame (index /
  container rate) with one decimal, as `Qwen3VLProcessor.replace_video_token` writes it. The
  marker stands for the whole block (the processor collapses a chat template's
  `<|vision_start|><|video_pad|><|vision_end|>` to it). The timestamps are text: byte-level BPE
  merges the `<` of the first one with the text before it, so that `<` is tokenized with the
  preceding text (`TimestampedVideoTokens.lead`) and the rest of each timestamp alone.
- **Positions.** `Qwen3VLModel.get_rope_index` treats each temporal patch as an image of
  grid (1, h, w) (`expanded_grids`), the timestamps between them as text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from mixer.config.images import ImageSettings
from mixer.config.recipe import Recipe
from mixer.config.video import VideoSettings
from mixer.core.token_info import TokenizerInfo
from mixer.images.documents import VisionTokens
from mixer.images.layouts import Qwen2VLLayout
from mixer.images.processing import MAX_ASPECT_RATIO, ImagePlan, Qwen2VLProcessing
from mixer.images.rope import mrope_positions
from mixer.images.video import VideoPlan, VideoProcessing
from mixer.images.video_decode import VideoInfo
from mixer.tokenize import Encoder


def video_smart_resize(
    frames: int,
    height: int,
    width: int,
    temporal: int,
    factor: int,
    min_pixels: int,
    max_pixels: int,
) -> tuple[int, int]:
    """(height, width) as `Qwen3VLVideoProcessor`'s `smart_resize` computes them (the same
    float operations in the same order)."""
    if frames < temporal:
        raise ValueError(f"t:{frames} must be larger than temporal_factor:{temporal}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, "
            f"got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(frames / temporal) * temporal
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def sample_count(total: int, rate: float, video: VideoSettings, cap: int | None = None) -> int:
    """Frames `Qwen3VLVideoProcessor.sample_frames` takes from `total` frames at `rate` per
    second; `cap` lowers the fps rule's count (a document being fitted), never under
    min_frames."""
    n = int(total / rate * video.fps)
    if cap is not None:
        n = min(n, cap)
    return min(max(n, video.min_frames), video.max_frames, total)


def sample_indices(total: int, n: int) -> list[int]:
    """The sampled frame indices: round(linspace(0, total - 1, n))."""
    return np.linspace(0, total - 1, n).round().astype(int).tolist()


def timestamps(indices: list[int], fps: float, temporal: int) -> list[float]:
    """Seconds of each temporal patch, as `Qwen3VLProcessor._calculate_timestamps`."""
    indices = list(indices)
    if len(indices) % temporal:
        indices.extend(indices[-1] for _ in range(temporal - len(indices) % temporal))
    seconds = [index / fps for index in indices]
    return [(seconds[i] + seconds[i + temporal - 1]) / 2 for i in range(0, len(seconds), temporal)]


@dataclass(frozen=True)
class Qwen3VideoPlan(VideoPlan):
    """A qwen3_vl video's plan: its frames sampled by linspace, padded to temporal patches."""

    temporal: int = 2

    @property
    def indices(self) -> list[int]:
        return sample_indices(self.total, self.frames)

    @property
    def timestamps(self) -> list[float]:
        return timestamps(self.indices, self.fps, self.temporal)


class Qwen3FrameProcessing(Qwen2VLProcessing):
    """Plans one frame of an n-frame video: `video_smart_resize` over the video's volume."""

    def __init__(self, settings: ImageSettings, frames: int) -> None:
        super().__init__(settings)
        self.n = frames

    def plan(self, width: int, height: int, max_pixels: int | None = None) -> ImagePlan:
        s = self.settings
        budget = (
            s.max_pixels if max_pixels is None else min(max(max_pixels, s.min_pixels), s.max_pixels)
        )
        h, w = video_smart_resize(
            self.n, height, width, self.frames, self.factor, s.min_pixels, budget
        )
        gh, gw = h // self.patch, w // self.patch
        return ImagePlan(
            width=w, height=h, grid_thw=(1, gh, gw), tokens=gh * gw // self.merge**2, rows=gh * gw
        )


class Qwen3VideoProcessing(VideoProcessing):
    """Plans and pixels of videos under the qwen3_vl layout (see the module docstring)."""

    def __init__(self, settings: ImageSettings) -> None:
        super().__init__(settings)
        self._by_frames: dict[tuple[int, int], Qwen3FrameProcessing] = {}

    def max_pixels(self, frames: int) -> int:
        v = self.video
        if not v.cap_pixels_per_frame:
            return v.max_pixels
        per_frame = max(
            min(v.max_video_tokens * self.factor * self.factor, v.max_pixels // frames),
            int(v.min_pixels * 1.05),
        )
        return per_frame * frames

    def frame_processing(self, frames: int) -> Qwen2VLProcessing:
        bound = self.max_pixels(frames)
        found = self._by_frames.get((bound, frames))
        if found is None:
            update = {"min_pixels": self.video.min_pixels, "max_pixels": bound}
            found = Qwen3FrameProcessing(self.settings.model_copy(update=update), frames)
            self._by_frames[(bound, frames)] = found
        return found

    def count(self, info: VideoInfo, cap: int | None = None) -> int:
        return sample_count(info.frames, info.fps, self.video, cap)

    def plan(
        self, info: VideoInfo, budget: int | None = None, frames: int | None = None
    ) -> VideoPlan:
        n = self.count(info) if frames is None else frames
        if n < self.temporal:
            raise ValueError(
                f"{info.frames} frame(s) are fewer than one temporal patch "
                f"(images.temporal_patch_size {self.temporal})"
            )
        return super().plan(info, budget, n)

    def _with_frame(self, info: VideoInfo, n: int, frame: ImagePlan) -> VideoPlan:
        _, gh, gw = frame.grid_thw
        t = -(-n // self.temporal)
        return Qwen3VideoPlan(
            frame=frame,
            frames=n,
            total=info.frames,
            fps=info.fps,
            grid_thw=(t, gh, gw),
            tokens=t * gh * gw // self.merge**2,
            rows=t * gh * gw,
            temporal=self.temporal,
        )

    def volume(self, frame: ImagePlan, frames: int) -> int:
        """The pixels smart_resize bounds: frames rounded to temporal patches × frame pixels."""
        return round(frames / self.temporal) * self.temporal * frame.width * frame.height

    def finish_pixels(self, out: np.ndarray, plan: VideoPlan) -> None:
        """Repeat the last frame into the temporal patch slots past it, as the processor."""
        last = plan.frames - (plan.grid_thw[0] - 1) * self.temporal  # frames in the last patch
        if last < self.temporal:
            out[-1, :, :, :, :, :, last:] = out[-1, :, :, :, :, :, last - 1 : last]


@dataclass(frozen=True)
class TimestampedVideoTokens(VisionTokens):
    """A qwen3_vl video in the token sequence: per temporal patch, its timestamp and its
    `<|vision_start|>` pads `<|vision_end|>` (see the module docstring)."""

    encoder: Encoder | None = None
    _stamps: dict[str, list[int]] = field(default_factory=dict, compare=False, repr=False)
    lead: ClassVar[str] = "<"

    def _encoded(self, text: str) -> list[int]:
        found = self._stamps.get(text)
        if found is None:
            assert self.encoder is not None
            found = self._stamps[text] = self.encoder.encode_raw([text])[0]
        return found

    def span(self, plan: ImagePlan | VideoPlan) -> np.ndarray:
        assert isinstance(plan, Qwen3VideoPlan)
        pads = [self.placeholder] * plan.frame.tokens
        out: list[int] = []
        for i, seconds in enumerate(plan.timestamps):
            stamp = f"<{seconds:.1f} seconds>"
            out += self._encoded(stamp[len(self.lead) :] if i == 0 else stamp)
            out += [*self.before, *pads, *self.after]
        return np.array(out, dtype=np.int64)

    def length(self, plan: ImagePlan | VideoPlan) -> int:
        return len(self.span(plan))


def expanded_grids(plans: list) -> list[tuple[int, int, int]]:
    """The grids `Qwen3VLModel.get_rope_index` walks: an image's own, a video's (1, h, w) once
    per temporal patch."""
    out: list[tuple[int, int, int]] = []
    for plan in plans:
        t, h, w = plan.grid_thw
        out += [(1, h, w)] * t if isinstance(plan, VideoPlan) else [(t, h, w)]
    return out


class Qwen3VLLayout(Qwen2VLLayout):
    """Qwen3-VL: the qwen2_vl keys, videos as timestamped temporal patches."""

    name = "qwen3_vl"

    def __init__(self, recipe: Recipe, tokenizer: TokenizerInfo) -> None:
        super().__init__(recipe, tokenizer)
        assert recipe.images is not None
        if recipe.images.video is not None:
            assert self.video_vision is not None
            v = self.video_vision
            self.video_vision = TimestampedVideoTokens(
                v.placeholder, v.before, v.after, encoder=Encoder(tokenizer)
            )
            self.videos = Qwen3VideoProcessing(recipe.images)

    def _mrope(self, document) -> np.ndarray:
        cached = document.meta.get("mrope")
        if cached is None:
            cached = mrope_positions(
                document.tokens,
                expanded_grids([p.image.plan for p in document.images]),
                image_pad_id=self.image_pad_id,
                vision_start_id=self.vision_start_id,
                spatial_merge_size=self.settings.merge_size,
                video_pad_id=self.video_pad_id,
            )
            document.meta["mrope"] = cached
        return cached
