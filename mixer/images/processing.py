"""Per layout: an image's plan (resized size, patch grid, tokens) from its size alone, and its
pixels -- the values transformers' image processors give for the same image and settings.

qwen2_vl follows `Qwen2VLImageProcessorPil`: `smart_resize` to multiples of
patch_size × merge_size within [min_pixels, max_pixels], PIL bicubic on uint8, rescale by 1/255
and normalize, then patches of temporal_patch_size copies of the image, flattened in the
processor's merge-window order to (grid_h · grid_w, 3 · temporal_patch_size · patch_size²);
image_grid_thw is (1, grid_h, grid_w).
llava follows `CLIPImageProcessorPil` as LLaVA-1.5 configures it: shortest edge resized to
image_size (bicubic), centre crop image_size², rescale and normalize, (3, S, S) per image. An
image so elongated that its resized size would dwarf both the stored image and the crop is
resampled only where the crop lies (the processor would allocate the whole resized image).

Rescale and normalize are a 256-entry table per channel computed with the processor's
own arithmetic (uint8 · (1/255) in float64, to float32, minus mean, over std in float32), so the
values are bit for bit the processor's; only PIL and numpy run. That is `images.resize: pil`,
the default. With `images.resize: torchvision` both layouts resample and normalize as the
torchvision processors (`Qwen2VLImageProcessor`, `CLIPImageProcessor`) do instead, with torch
(`resize.py`); llava then resizes the whole image before its crop, as that processor does.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from PIL import Image

from mixer.config.images import ImageSettings
from mixer.images.decode import to_rgb
from mixer.images.resize import fused_tables, qwen_patches, torch_resized

MAX_ASPECT_RATIO = 200  # qwen2_vl's smart_resize refuses longer/shorter sides past this


@dataclass(frozen=True)
class ImagePlan:
    """What an image becomes, known from its stored size before any pixel is decoded."""

    width: int  # resized size before patching (qwen2_vl), crop (llava)
    height: int
    grid_thw: tuple[int, int, int]  # the processor's image_grid_thw row
    tokens: int  # placeholder tokens standing for the image
    rows: int  # rows the image adds to pixel_values


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """(height, width) as transformers' qwen2_vl `smart_resize` computes them (the same
    float operations in the same order, so the same integers)."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, "
            f"got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _tables(settings: ImageSettings) -> list[list[float]]:
    """Per channel, the normalized value of each uint8 level (float32 values)."""
    levels = (np.arange(256, dtype=np.float64) * (1 / 255)).astype(np.float32)
    mean = np.array(settings.image_mean, dtype=np.float32)
    std = np.array(settings.image_std, dtype=np.float32)
    return ((levels[None, :] - mean[:, None]) / std[:, None]).tolist()


def _planes(image: Image.Image, tables: list[list[float]]) -> Iterator[np.ndarray]:
    """Channel by channel, the image's normalized (height, width) float32 plane (PIL's
    8-bit to float table lookup: one C pass, faster than numpy's gather)."""
    for band, table in zip(image.split(), tables):
        yield np.asarray(band.point(table, "F"))


def _resized(image: Image.Image, width: int, height: int) -> Image.Image:
    image = to_rgb(image)  # as the processors do; no-op on decode_rgb's images
    if image.size == (width, height):
        return image  # PIL's resize to the same size is a copy
    return image.resize((width, height), Image.Resampling.BICUBIC)


# llava: resized images of up to this many crops' pixels are made whole, then cropped (what
# CLIPImageProcessor does); larger ones are resampled only where the crop lies.
_FULL_RESIZE_PIXELS = 16


def _taps(first: int, count: int, scale: float, limit: int) -> tuple[int, int]:
    """The source pixels [lo, hi) that bicubic output pixels [first, first + count) read, at
    `scale` source pixels per output pixel (PIL widens the filter by the scale when it
    shrinks), with a pixel to spare on each side; within [0, limit)."""
    support = 2.0 * max(scale, 1.0)
    lo = math.floor(first * scale - support) - 1
    hi = math.ceil((first + count) * scale + support) + 1
    return max(lo, 0), min(hi, limit)


def _resized_crop(image: Image.Image, width: int, height: int, size: int) -> Image.Image:
    """The centre size×size crop of `image` resized to width×height (bicubic), resampled
    from the source pixels the crop reads only, rows first as PIL's whole resize does: memory
    follows the stored image and the crop, never width×height. PIL takes a box in float32, so
    a pixel may be a level off the whole resize's."""
    image = to_rgb(image)
    w, h = image.size
    left, top = (width - size) // 2, (height - size) // 2  # rounds down, as the full path
    sx, sy = w / width, h / height
    x0, x1 = _taps(left, size, sx, w)
    y0, y1 = _taps(top, size, sy, h)
    band = image.crop((x0, y0, x1, y1))
    rows = band.resize(
        (size, y1 - y0),
        Image.Resampling.BICUBIC,
        box=(left * sx - x0, 0, (left + size) * sx - x0, y1 - y0),
    )
    return rows.resize(
        (size, size), Image.Resampling.BICUBIC, box=(0, top * sy - y0, size, (top + size) * sy - y0)
    )


class Qwen2VLProcessing:
    """Plans and pixels of the qwen2_vl layout."""

    def __init__(self, settings: ImageSettings) -> None:
        self.settings = settings
        self.patch = settings.patch_size
        self.merge = settings.merge_size
        self.frames = settings.temporal_patch_size
        self.factor = self.patch * self.merge
        self.row_shape: tuple[int, ...] = (3 * self.frames * self.patch**2,)
        self._tables = _tables(settings)
        self._torchvision = settings.resize == "torchvision"

    def plan(self, width: int, height: int, max_pixels: int | None = None) -> ImagePlan:
        """The plan of a `width`×`height` image. `max_pixels` lowers the recipe's bound (to fit
        a long document); it is clamped to [min_pixels, settings.max_pixels]. Raises
        ValueError past an aspect ratio of 200, as transformers does."""
        s = self.settings
        budget = (
            s.max_pixels if max_pixels is None else min(max(max_pixels, s.min_pixels), s.max_pixels)
        )
        h, w = smart_resize(height, width, self.factor, s.min_pixels, budget)
        gh, gw = h // self.patch, w // self.patch
        return ImagePlan(
            width=w, height=h, grid_thw=(1, gh, gw), tokens=gh * gw // self.merge**2, rows=gh * gw
        )

    def lower_plans(self, width: int, height: int) -> list[ImagePlan]:
        """Every distinct plan of the image, largest first (see `budgeted_plans`)."""
        return [plan for _, plan in self.budgeted_plans(width, height)]

    def budgeted_plans(self, width: int, height: int) -> list[tuple[int, ImagePlan]]:
        """(pixel budget, plan) pairs, largest first: the recipe's plan (budget max_pixels),
        then each time the largest budget in [min_pixels, previous budget) whose plan has fewer
        pixels, found by bisection, down to the plan at min_pixels. A plan only shrinks as its
        budget does (smart_resize is monotone, float operations included), so pixels and tokens
        strictly decrease along the list and no plan any budget gives is skipped. The plan of
        any budget b is that of the smallest listed budget >= b."""
        return list(self.iter_budgeted_plans(width, height))

    def iter_budgeted_plans(self, width: int, height: int) -> Iterator[tuple[int, ImagePlan]]:
        """`budgeted_plans`, made one at a time (a caller that stops early saves the rest)."""
        low = self.settings.min_pixels
        budget = self.settings.max_pixels
        plan = self.plan(width, height)
        yield budget, plan
        while True:
            pixels = plan.width * plan.height

            def smaller(b: int, pixels: int = pixels) -> bool:
                candidate = self.plan(width, height, b)
                return candidate.width * candidate.height < pixels

            if budget - 1 < low or not smaller(low):
                return
            lo, hi = low, budget - 1  # smaller(lo) holds; find the largest such budget
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if smaller(mid) else (lo, mid - 1)
            budget = lo
            plan = self.plan(width, height, budget)
            yield budget, plan

    def lower_steps(
        self, index: int, width: int, height: int
    ) -> Iterator[tuple[int, int, int, ImagePlan]]:
        """(-budget, index, k, plan) of each plan below the first of `iter_budgeted_plans`,
        largest first: the steps of item `index` (an image, a video's frames) when several
        items' steps are merged by budget (`k` orders the item's own steps, so equal keys
        never compare two plans)."""
        lower = itertools.islice(self.iter_budgeted_plans(width, height), 1, None)
        for k, (budget, plan) in enumerate(lower):
            yield -budget, index, k, plan

    def empty_pixels(self) -> np.ndarray:
        """pixel_values with no image: (0, 3 · temporal_patch_size · patch_size²)."""
        return np.zeros((0, *self.row_shape), dtype=np.float32)

    def pixels(self, image: Image.Image, plan: ImagePlan) -> np.ndarray:
        """(plan.rows, 3 · temporal_patch_size · patch_size²) float32; `image` in any mode
        (converted as `decode.to_rgb` does), its size need not be the planned one."""
        if self._torchvision:
            return qwen_patches(image, plan.width, plan.height, self.settings)
        planes = _planes(_resized(image, plan.width, plan.height), self._tables)
        p, m, frames = self.patch, self.merge, self.frames
        _, gh, gw = plan.grid_thw
        # Move whole patch rows (p float32 values, contiguous on both sides) as single items:
        # numpy then copies 56-byte items instead of looping over 14-value runs.
        run = np.dtype((np.void, 4 * p))
        out = np.empty((gh // m, gw // m, m, m, 3, frames, p), dtype=run)
        for c, plane in enumerate(planes):
            # plane (y, x) = (gh/m, m, p, gw/m, m, p) -> (gh/m, gw/m, m, m, p) of runs
            src = plane.view(run).reshape(gh // m, m, p, gw // m, m).transpose(0, 3, 1, 4, 2)
            for frame in range(frames):
                out[:, :, :, :, c, frame] = src
        return out.view(np.float32).reshape(plan.rows, self.row_shape[0])


class LlavaProcessing:
    """Plans and pixels of the llava layout (every image the same square crop)."""

    def __init__(self, settings: ImageSettings) -> None:
        self.settings = settings
        self.size = settings.image_size
        side = self.size // settings.patch_size
        self._plan = ImagePlan(
            width=self.size, height=self.size, grid_thw=(1, side, side), tokens=side * side, rows=1
        )
        self.row_shape: tuple[int, ...] = (3, self.size, self.size)
        self._tables = _tables(settings)
        self._torch_tables = fused_tables(settings) if settings.resize == "torchvision" else None

    def plan(self, width: int, height: int, max_pixels: int | None = None) -> ImagePlan:
        """The fixed plan: (image_size / patch_size)² tokens whatever the image (max_pixels
        is ignored; the layout has one resolution). Under `resize: torchvision` the whole
        image is resized before its crop, as the processor does: ValueError when that would
        be over `max_source_pixels` (an elongated image)."""
        if self._torch_tables is not None:
            w, h = self.resized_size(width, height)
            if w * h > self.settings.max_source_pixels:
                raise ValueError(
                    f"its shortest-edge resize to {w}x{h} is over images.max_source_pixels "
                    f"({self.settings.max_source_pixels}); images.resize: torchvision resizes "
                    "the whole image before the crop"
                )
        return self._plan

    def lower_plans(self, width: int, height: int) -> list[ImagePlan]:
        """Only the fixed plan: llava images cannot shrink."""
        return [self._plan]

    def empty_pixels(self) -> np.ndarray:
        """pixel_values with no image: (0, 3, image_size, image_size)."""
        return np.zeros((0, *self.row_shape), dtype=np.float32)

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after the shortest-edge resize, as transformers'
        `get_resize_output_image_size(default_to_square=False)` computes it."""
        short, long = (width, height) if width <= height else (height, width)
        new_long = int(self.size * long / short)
        return (self.size, new_long) if width <= height else (new_long, self.size)

    def pixels(self, image: Image.Image, plan: ImagePlan) -> np.ndarray:
        """(3, image_size, image_size) float32; `image` in any mode (see `decode.to_rgb`).

        The resize keeps the aspect ratio, so an elongated image would become a huge one
        before its crop (a one-pixel-wide strip grows by image_size in both directions). Past
        `_FULL_RESIZE_PIXELS` crops (or the stored size, when larger) only the crop is
        resampled (`_resized_crop`)."""
        width, height = self.resized_size(*image.size)
        left, top = (width - self.size) // 2, (height - self.size) // 2  # rounds down
        if self._torch_tables is not None:
            crop = torch_resized(image, width, height)[
                :, top : top + self.size, left : left + self.size
            ]
            return np.stack([self._torch_tables[c][crop[c]] for c in range(3)])
        if width * height > max(image.width * image.height, _FULL_RESIZE_PIXELS * self.size**2):
            return np.stack(
                list(_planes(_resized_crop(image, width, height, self.size), self._tables))
            )
        image = _resized(image, width, height)
        image = image.crop((left, top, left + self.size, top + self.size))
        return np.stack(list(_planes(image, self._tables)))


Processing = Qwen2VLProcessing | LlavaProcessing


def processing_for(settings: ImageSettings) -> Processing:
    """The processing of the recipe's image layout."""
    if settings.layout == "llava":
        return LlavaProcessing(settings)
    return Qwen2VLProcessing(settings)  # qwen2_vl and qwen2_5_vl
