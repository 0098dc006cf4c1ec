"""What `mixer preview` shows of a batch: decoded rows with compact image placeholders, and
the batch's images rebuilt from `pixel_values`.

An image's run of placeholder tokens prints as `<image 448x336 → 192 tokens>`: the size the
image was resized to and its placeholder tokens (qwen2_vl: the `<|image_pad|>` tokens, without
`<|vision_start|>` and `<|vision_end|>`; llava: the `<image>` tokens); a video's as
`<video 8×112×112 @2 fps → 32 tokens>`: frames × width × height after sampling and resizing,
the sampled rate (qwen2_5_vl: temporal_patch_size / second_per_grid_ts; qwen2_vl, whose
batches do not carry it: the recipe's `images.video.fps`) and its placeholder tokens. Saved
images are the
model's input turned back into pixels (patches reassembled, normalization undone), so they
show exactly what a batch carries: the resized image, transparency composited on white.
An audio clip (qwen2_audio) prints as `<audio 1.37 s → 35 tokens>`: its length as its
`feature_attention_mask` row gives it (10 ms frames) and its `<|AUDIO|>` tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mixer.audio.layout import Qwen2AudioLayout
from mixer.pipeline.batch import BatchLayout
from mixer.tokenize import Encoder


@dataclass(frozen=True)
class ImageRef:
    """One image of a batch: its index in the batch's image order and its resized size."""

    index: int
    width: int
    height: int
    tokens: int

    def __str__(self) -> str:
        return f"<image {self.width}x{self.height} → {self.tokens} tokens>"


@dataclass(frozen=True)
class VideoRef:
    """One video of a batch: its index in the batch's video order, frames and frame size."""

    index: int
    frames: int
    width: int
    height: int
    fps: float
    tokens: int

    def __str__(self) -> str:
        return (
            f"<video {self.frames}×{self.width}×{self.height} @{self.fps:.3g} fps → "
            f"{self.tokens} tokens>"
        )


@dataclass(frozen=True)
class AudioRef:
    """One audio clip of a batch: its index in `input_features` and its mask frames."""

    index: int
    frames: int
    tokens: int

    def __str__(self) -> str:
        return f"<audio {self.frames / 100:.2f} s → {self.tokens} tokens>"


class RowRenderer:
    """Renders the rows of a batch in order (images are numbered across the batch's rows)."""

    def __init__(self, layout: BatchLayout, encoder: Encoder, batch: dict) -> None:
        self.encoder = encoder
        self.vision = getattr(layout, "vision", None)
        self.settings = getattr(layout, "settings", None)
        self.grids = batch["image_grid_thw"].tolist() if "image_grid_thw" in batch else None
        self.next_image = 0
        video = getattr(layout, "video_vision", None)
        self.video_pad = video.placeholder if video is not None else None
        self.video_grids = batch["video_grid_thw"].tolist() if "video_grid_thw" in batch else []
        self.seconds = (
            batch["second_per_grid_ts"].tolist() if "second_per_grid_ts" in batch else None
        )
        self.next_video = 0
        # qwen3_vl writes a video as one run per temporal patch, timestamps between them: the
        # first run stands for the video, the rest are skipped
        self.patch_runs = getattr(layout, "name", "") == "qwen3_vl"
        self.runs_left = 0
        self.audio_frames: list[int] | None = None
        if isinstance(layout, Qwen2AudioLayout):
            self.vision = layout.audio
            self.audio_frames = batch["feature_attention_mask"].sum(dim=1).tolist()

    def _audio(self, run: int) -> AudioRef:
        assert self.audio_frames is not None
        index = self.next_image
        self.next_image += 1
        return AudioRef(index, int(self.audio_frames[index]), run)

    def _video(self, run: int) -> VideoRef | None:
        s = self.settings
        assert s is not None and s.video is not None  # a batch with videos has their settings
        if self.runs_left:
            self.runs_left -= 1
            return None
        index = self.next_video
        t, h, w = self.video_grids[index]
        if self.patch_runs:
            self.runs_left = t - 1
            run *= t
        fps = (
            s.temporal_patch_size / self.seconds[index] if self.seconds is not None else s.video.fps
        )
        self.next_video += 1
        return VideoRef(
            index, t * s.temporal_patch_size, w * s.patch_size, h * s.patch_size, fps, run
        )

    def _image(self, run: int) -> list[ImageRef]:
        """The image(s) a run of `run` placeholder tokens stands for."""
        s = self.settings
        assert s is not None  # a batch with images has their settings
        if self.grids is not None:  # qwen2_vl: one run per image, delimited
            t, h, w = self.grids[self.next_image]
            refs = [ImageRef(self.next_image, w * s.patch_size, h * s.patch_size, run)]
        else:  # llava: fixed-size images, adjacent runs merge
            side = s.image_size
            per = (side // s.patch_size) ** 2
            refs = [
                ImageRef(self.next_image + i, side, side, per) for i in range(max(run // per, 1))
            ]
        self.next_image += len(refs)
        return refs

    def render(self, ids: list[int]) -> tuple[list[str | ImageRef | VideoRef | AudioRef], int]:
        """Pieces of the row (decoded text, images, videos and audio clips) and its number of
        image, video and audio tokens."""
        if self.vision is None:
            return [self.encoder.decode(ids)], 0
        pads = {self.vision.placeholder, self.video_pad} - {None}
        before, after = list(self.vision.before), list(self.vision.after)
        pieces: list[str | ImageRef | VideoRef | AudioRef] = []
        text: list[int] = []
        image_tokens = i = 0
        while i < len(ids):
            starts = (
                bool(before)
                and ids[i : i + len(before)] == before
                and i + len(before) < len(ids)
                and ids[i + len(before)] in pads
            )
            if ids[i] not in pads and not starts:
                text.append(ids[i])
                i += 1
                continue
            j = i + len(before) if starts else i
            pad = ids[j]
            k = j
            while k < len(ids) and ids[k] == pad:
                k += 1
            if text:
                pieces.append(self.encoder.decode(text))
                text = []
            if self.audio_frames is not None:
                pieces.append(self._audio(k - j))
            elif pad == self.video_pad:
                video = self._video(k - j)
                if video is not None:
                    pieces.append(video)
            else:
                pieces.extend(self._image(k - j))
            image_tokens += k - j
            i = k + len(after) if ids[k : k + len(after)] == after else k
        if text:
            pieces.append(self.encoder.decode(text))
        return pieces, image_tokens


def join(pieces: list[str | ImageRef | VideoRef | AudioRef], chars: int) -> str:
    """The row as text, cut after `chars` characters (0: no cut); placeholders stay whole."""
    out, length = [], 0
    for piece in pieces:
        text = str(piece)
        if chars and length + len(text) > chars:
            out.append(text if not isinstance(piece, str) else text[: chars - length])
            return "".join(out) + " …"
        out.append(text)
        length += len(text)
    return "".join(out)


# -- images from pixel_values ---------------------------------------------------------------
def _to_uint8(chw: np.ndarray, mean, std) -> np.ndarray:
    """(3, H, W) normalized floats -> (H, W, 3) uint8 (rescale 1/255 and normalize undone)."""
    rgb = (
        chw * np.asarray(std, np.float32)[:, None, None]
        + np.asarray(mean, np.float32)[:, None, None]
    )
    return np.clip(np.rint(rgb * 255), 0, 255).astype(np.uint8).transpose(1, 2, 0)


def qwen2_vl_image(rows: np.ndarray, grid: tuple[int, int, int], settings) -> np.ndarray:
    """One image's `pixel_values` rows (Qwen2VLImageProcessor's patch order) -> (H, W, 3)."""
    _, gh, gw = grid
    p, m, tp = settings.patch_size, settings.merge_size, settings.temporal_patch_size
    patches = rows.reshape(-1, gh // m, gw // m, m, m, 3, tp, p, p)[0, ..., 0, :, :]
    chw = patches.transpose(4, 0, 2, 5, 1, 3, 6).reshape(3, gh * p, gw * p)
    return _to_uint8(chw, settings.image_mean, settings.image_std)


def batch_images(batch: dict, layout: BatchLayout) -> list[np.ndarray]:
    """Every image of a batch, in placeholder order, as (H, W, 3) uint8 arrays."""
    settings = getattr(layout, "settings", None)
    if settings is None or "pixel_values" not in batch:
        return []
    pixels = batch["pixel_values"].float().numpy()
    if "image_grid_thw" not in batch:  # llava: (n, 3, S, S)
        return [_to_uint8(image, settings.image_mean, settings.image_std) for image in pixels]
    out, at = [], 0
    for grid in batch["image_grid_thw"].tolist():
        rows = int(np.prod(grid))
        out.append(qwen2_vl_image(pixels[at : at + rows], tuple(grid), settings))
        at += rows
    return out


def save_images(
    images: list[np.ndarray],
    refs: list[ImageRef],
    folder: Path,
    *,
    batch: int,
    row: int,
    source: str,
) -> list[Path]:
    """Write a row's images as PNG: `batch{b}-row{r}-image{i}-{source}.png`, where i is the
    image's index in the batch (its row in `image_grid_thw`, its place in `pixel_values`)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", source)
    paths = []
    for ref in refs:
        path = folder / f"batch{batch:04d}-row{row:02d}-image{ref.index:03d}-{safe}.png"
        Image.fromarray(images[ref.index], "RGB").save(path)
        paths.append(path)
    return paths
