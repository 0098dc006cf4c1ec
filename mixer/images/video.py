"""Videos of the qwen2_vl / qwen2_5_vl layouts: which frames, what size, which pixels.

Values follow transformers' `Qwen2VLVideoProcessor` called with `do_sample_frames=True`:

- **Frames.** From `total` frames at container rate `r`: n = total / r × fps, clamped to
  [min_frames, min(max_frames, total)] and rounded down to a multiple of
  temporal_patch_size; indices ⌊i·total/n⌋ for i < n (`sample_count`, `sample_indices`).
- **Size.** Each frame goes to `smart_resize` of the frame size (factor patch × merge,
  within [min_pixels, max_pixels]; with `cap_pixels_per_frame`, max_pixels is also bounded by
  an even share of `max_video_tokens`' pixels over the n frames, floored at 1.05 · min_pixels).
- **Pixels.** Bicubic with antialias on uint8 (torch's `interpolate`, which the processor's
  torchvision resize calls), then (x - 255·mean) / (255·std) in float32 (the processor's
  fused rescale and normalize, here a 256-entry table per channel), and patches in the
  processor's order: (t·h·w, 3 · temporal_patch_size · patch²) with video_grid_thw
  (n / temporal, h, w). (The processor repeats the last frame up to a multiple of
  temporal_patch_size; n already is one.)

A `VideoPlan` is known from the header alone; `LazyVideo` makes the pixels on demand on the
image pool, under the same per-process pixel budget as images (`handle.py`), decoding only
the sampled frames and resizing and normalizing each into its patches as it comes
(`video_decode.py`): memory holds the result and a few frames, never the whole video.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from mixer.config.images import ImageSettings
from mixer.config.video import VideoSettings
from mixer.core.document import MediaKind
from mixer.core.errors import DataError
from mixer.core.records import EncodedImage
from mixer.images.handle import LazyMedia, stopping
from mixer.images.processing import ImagePlan, Qwen2VLProcessing
from mixer.images.resize import fused_tables, resized_array
from mixer.images.video_decode import VideoInfo, decode_frames, video_error


def sample_count(
    total: int, rate: float, video: VideoSettings, temporal: int, cap: int | None = None
) -> int:
    """Frames sampled from `total` frames at `rate` per second (see the module docstring);
    `cap` lowers the fps rule's count (a document being fitted), never under min_frames."""
    most = math.floor(min(video.max_frames, total) / temporal) * temporal
    n = total / rate * video.fps
    if cap is not None:
        n = min(n, cap)
    n = min(max(n, video.min_frames), most, total)
    return math.floor(n / temporal) * temporal


def sample_indices(total: int, n: int) -> list[int]:
    """The sampled frame indices: ⌊i·total/n⌋ for i < n."""
    return [i * total // n for i in range(n)]


@dataclass(frozen=True)
class VideoPlan:
    """What a video becomes, known from its header: the frames and each frame's plan."""

    frame: ImagePlan  # one frame's resized size and (1, h, w) grid
    frames: int  # n sampled frames (a multiple of temporal_patch_size)
    total: int  # frames in the stored video
    fps: float  # the container's frame rate
    grid_thw: tuple[int, int, int]  # video_grid_thw row
    tokens: int
    rows: int

    @property
    def width(self) -> int:
        return self.frame.width

    @property
    def height(self) -> int:
        return self.frame.height

    @property
    def indices(self) -> list[int]:
        return sample_indices(self.total, self.frames)

    @property
    def sampled_fps(self) -> float:
        """The processor's `VideoMetadata.sampled_fps`: n / total × fps."""
        return self.frames / self.total * self.fps


class VideoProcessing:
    """Plans and pixels of videos under a qwen2_vl-style layout."""

    def __init__(self, settings: ImageSettings) -> None:
        assert settings.video is not None
        self.settings = settings
        self.video = settings.video
        self.temporal = settings.temporal_patch_size
        self.patch, self.merge = settings.patch_size, settings.merge_size
        self.factor = self.patch * self.merge
        self.row_shape: tuple[int, ...] = (3 * self.temporal * self.patch**2,)
        self._tables = fused_tables(settings)  # (3, 256) float32
        self._frames: dict[int, Qwen2VLProcessing] = {}

    def max_pixels(self, frames: int) -> int:
        """The per-frame pixel bound for n frames (`cap_pixels_per_frame` as the processor)."""
        v = self.video
        if not v.cap_pixels_per_frame:
            return v.max_pixels
        total_pixels = int(v.max_video_tokens * self.factor * self.factor * 0.9)
        return max(
            min(v.max_pixels, total_pixels * self.temporal // frames), int(v.min_pixels * 1.05)
        )

    def frame_processing(self, frames: int) -> Qwen2VLProcessing:
        """The image processing that plans one frame of an n-frame video (its budgets)."""
        bound = self.max_pixels(frames)
        found = self._frames.get(bound)
        if found is None:  # (bound >= min_pixels: the recipe checks it, and the cap's floor)
            found = Qwen2VLProcessing(
                self.settings.model_copy(
                    update={"min_pixels": self.video.min_pixels, "max_pixels": bound}
                )
            )
            self._frames[bound] = found
        return found

    def count(self, info: VideoInfo, cap: int | None = None) -> int:
        return sample_count(info.frames, info.fps, self.video, self.temporal, cap)

    def plan(
        self, info: VideoInfo, budget: int | None = None, frames: int | None = None
    ) -> VideoPlan:
        """The plan of a video: the fps rule's frames (or `frames`), each frame at the
        recipe's bound (or `budget`, clamped as images' are). ValueError when the video has
        fewer frames than one temporal patch, or an aspect ratio past 200."""
        n = self.count(info) if frames is None else frames
        if n <= 0:
            raise ValueError(
                f"{info.frames} frame(s) are fewer than one temporal patch "
                f"(images.temporal_patch_size {self.temporal})"
            )
        return self._with_frame(
            info, n, self.frame_processing(n).plan(info.width, info.height, budget)
        )

    def _with_frame(self, info: VideoInfo, n: int, frame: ImagePlan) -> VideoPlan:
        _, gh, gw = frame.grid_thw
        t = n // self.temporal
        return VideoPlan(
            frame=frame,
            frames=n,
            total=info.frames,
            fps=info.fps,
            grid_thw=(t, gh, gw),
            tokens=t * gh * gw // self.merge**2,
            rows=t * gh * gw,
        )

    def lowered(self, infos: list[VideoInfo]) -> Iterator[list[VideoPlan]]:
        """Plans for all of a document's videos, largest first: the recipe's; then, all videos
        at one per-frame pixel budget, each budget from max_pixels down to min_pixels where a
        plan shrinks (no frame under min_pixels, nor under its recipe plan when that already
        is); then, at the lowest budgets, fewer frames (the fps rule's count capped, down to
        min_frames). Tokens strictly decrease along the list."""
        current = [self.plan(info) for info in infos]
        yield list(current)
        budgets = [self.max_pixels(plan.frames) for plan in current]
        floors = [min(self.video.min_pixels, self.volume(p.frame, p.frames)) for p in current]
        steps = [
            self.frame_processing(plan.frames).lower_steps(i, info.width, info.height)
            for i, (info, plan) in enumerate(zip(infos, current))
        ]
        for _, group in itertools.groupby(heapq.merge(*steps), key=lambda step: step[0]):
            changed = False
            for negative, i, _, frame in group:
                if self.volume(frame, current[i].frames) >= floors[i]:
                    current[i] = self._with_frame(infos[i], current[i].frames, frame)
                    budgets[i], changed = -negative, True
            if changed:
                yield list(current)
        for cap in range(max(p.frames for p in current) - self.temporal, 0, -self.temporal):
            fewer = [
                self.plan(info, budget, self.count(info, cap)) if plan.frames > cap else plan
                for info, plan, budget in zip(infos, current, budgets)
            ]
            if any(a.tokens != b.tokens for a, b in zip(fewer, current)):
                current = fewer
                yield list(current)
            if cap < self.video.min_frames:
                return

    def empty_pixels(self) -> np.ndarray:
        return np.zeros((0, *self.row_shape), dtype=np.float32)

    def volume(self, frame: ImagePlan, frames: int) -> int:
        """The pixels that min_pixels and max_pixels bound: one frame's."""
        return frame.width * frame.height

    def finish_pixels(self, out: np.ndarray, plan: VideoPlan) -> None:
        """Complete `out` once every sampled frame is in (nothing to do here)."""

    def resized(self, rgb: np.ndarray, plan: VideoPlan) -> np.ndarray:
        """One decoded (H, W, 3) uint8 frame at the plan's size, (3, h, w) uint8."""
        return resized_array(rgb, plan.width, plan.height)

    def new_pixels(self, plan: VideoPlan) -> np.ndarray:
        """The video's pixels to fill frame by frame (`put_frame`), in the processor's patch
        order: (t, h/m, w/m, m, m, 3, temporal, p, p) float32; `.reshape(plan.rows, -1)` is
        `pixel_values_videos`."""
        p, m = self.patch, self.merge
        t, gh, gw = plan.grid_thw
        return np.empty((t, gh // m, gw // m, m, m, 3, self.temporal, p, p), dtype=np.float32)

    def put_frame(self, out: np.ndarray, i: int, frame: np.ndarray) -> None:
        """Normalize resized frame i ((3, h, w) uint8) into its place in `out`."""
        p, m = self.patch, self.merge
        _, rows, cols = out.shape[:3]
        group, slot = divmod(i, self.temporal)
        for c in range(3):
            plane = self._tables[c][frame[c]]  # (h, w) float32
            out[group, :, :, :, :, c, slot] = plane.reshape(rows, m, p, cols, m, p).transpose(
                0, 3, 1, 4, 2, 5
            )


class LazyVideo(LazyMedia[VideoPlan, VideoProcessing]):
    """A video of a document: its pixels are its sampled frames' patches."""

    kind: MediaKind = "video"

    def __init__(
        self,
        encoded: EncodedImage,
        info: VideoInfo,
        plan: VideoPlan,
        processing: VideoProcessing,
        extra_tokens: int,
        source: str,
        file: str,
    ) -> None:
        # (max_source_pixels is the image decoder's; the header was checked by probe_video)
        super().__init__(
            encoded,
            (info.width, info.height),
            plan,
            processing,
            extra_tokens=extra_tokens,
            source=source,
            file=file,
            max_source_pixels=info.width * info.height,
        )
        self.info = info

    def replan(self, plan: VideoPlan) -> LazyVideo:
        return LazyVideo(
            self.encoded,
            self.info,
            plan,
            self.processing,
            extra_tokens=self.extra_tokens,
            source=self.source,
            file=self.file,
        )

    def _make(self) -> np.ndarray:
        plan, processing = self.plan, self.processing
        out = processing.new_pixels(plan)

        def keep(i: int, rgb: np.ndarray) -> None:  # each frame as it is decoded
            if stopping():
                raise RuntimeError("the process is exiting")
            if rgb.shape[:2] != (self.info.height, self.info.width):
                raise video_error(
                    f"frame {plan.indices[i]} is {rgb.shape[1]}x{rgb.shape[0]}, "
                    f"not the {self.info.width}x{self.info.height} of the header",
                    self.encoded,
                    self.source,
                    self.file,
                )
            processing.put_frame(out, i, processing.resized(rgb, plan))

        decode_frames(self.encoded, plan.indices, keep, source=self.source, file=self.file)
        processing.finish_pixels(out, plan)
        return out.reshape(plan.rows, processing.row_shape[0])

    def __repr__(self) -> str:
        plan = self.plan
        return (
            f"LazyVideo({self.encoded.member!r}, {self.info.width}x{self.info.height} "
            f"-> {plan.frames}x{plan.width}x{plan.height}, {self.tokens} tokens)"
        )


def probe_error(
    exc: ValueError, encoded: EncodedImage, info: VideoInfo, source: str, file: str
) -> DataError:
    """A video the layout cannot plan, as the `DataError` naming it."""
    return video_error(
        f"video of {info.width}x{info.height}, {info.frames} frames: {exc}", encoded, source, file
    )
