"""Batch layouts with images (and videos): `qwen2_vl`, `qwen2_5_vl` and `llava`.

Both add `pixel_values` (images in the order of their placeholders, row by row) to the text
keys and put -100 in `labels` on every vision token. `qwen2_vl` also has `image_grid_thw`,
`mm_token_type_ids` (1 on `<|image_pad|>`) and a `[4, B, L]` `position_ids`: row 0 restarts at
every document and row start (what builds the packed attention mask), rows 1-3 are the
M-RoPE positions of each document computed for that document alone. A batch without images
keeps every key, with zero rows.

With `images.video`, the qwen layouts also have `pixel_values_videos`, `video_grid_thw` and
`mm_token_type_ids` 2 on `<|video_pad|>` (transformers' convention: 0 text, 1 image, 2 video);
`qwen2_5_vl` adds `second_per_grid_ts` (temporal_patch_size / sampled fps, per video) and
spaces a video's temporal positions by `images.tokens_per_second` times it, as
`Qwen2_5_VLModel.get_rope_index` does. A batch without videos has zero-row video arrays.
"""

from __future__ import annotations

import numpy as np

from mixer.config.recipe import Recipe
from mixer.core.document import Budget
from mixer.core.errors import RecipeError
from mixer.core.token_info import TokenizerInfo
from mixer.images.documents import ImageDocuments, VisionTokens
from mixer.images.processing import processing_for
from mixer.images.rope import mrope_positions
from mixer.images.shared_pixels import new_pixels, shared_tensor
from mixer.images.video import VideoPlan, VideoProcessing
from mixer.pipeline.batch import FLOAT32, INT32, INT64, ArraySpec, Batch, BatchLayout, Wire
from mixer.pipeline.packing import IGNORE_INDEX, Row
from mixer.tokenize import Encoder

QWEN2_VL_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
QWEN2_VL_VIDEO_TOKEN = "<|video_pad|>"
VIDEO_SPECS = (
    ArraySpec("pixel_values_videos", FLOAT32, FLOAT32, per_token=0),
    ArraySpec("video_grid_thw", INT64, INT32, per_token=0),
)
LLAVA_TOKEN = "<image>"


def _token_ids(tokenizer: TokenizerInfo, names: tuple[str, ...], layout: str) -> list[int]:
    encoder = Encoder(tokenizer)
    ids = []
    for name in names:
        token_id = encoder.token_id(name)
        if token_id is None:
            raise RecipeError(
                f"images.layout: the {layout} layout needs the token {name!r}, "
                f"which the tokenizer {tokenizer.path!r} does not have"
            )
        ids.append(token_id)
    return ids


class _ImageLayout(BatchLayout):
    """What both image layouts share: the builder, caps, labels and pixels."""

    vision: VisionTokens
    vision_names: dict[int, str]  # token id -> its name, for errors naming a stray token
    video_vision: VisionTokens | None = None

    def __init__(self, recipe: Recipe, tokenizer: TokenizerInfo) -> None:
        super().__init__(seq_len=recipe.seq_len, pad_id=tokenizer.pad_id, flatten=recipe.flatten)
        assert recipe.images is not None
        self.settings = recipe.images
        self.processing = processing_for(recipe.images)
        self.videos = VideoProcessing(recipe.images) if recipe.images.video else None
        ids = set(self.vision.ids) | set(self.video_vision.ids if self.video_vision else ())
        self._vision_ids = np.array(sorted(ids), dtype=np.int64)

    def document_builder(self, encoder: Encoder, source: str) -> ImageDocuments:
        return ImageDocuments(
            settings=self.settings,
            processing=self.processing,
            encoder=encoder,
            vision=self.vision,
            vision_names=self.vision_names,
            seq_len=self.seq_len,
            source=source,
            videos=self.videos,
            video_vision=self.video_vision,
        )

    def budget(self) -> Budget | None:
        s = self.settings
        if (
            s.max_images_per_batch is None
            and s.max_patches_per_batch is None
            and s.max_videos_per_batch is None
        ):
            return None
        return Budget(s.max_images_per_batch, s.max_patches_per_batch, s.max_videos_per_batch)

    def put_row(self, arrays: dict[str, np.ndarray], index: int, row: Row, source_id: int) -> None:
        arrays["input_ids"][index] = row.input_ids
        labels = arrays["labels"][index]
        labels[:] = row.labels
        labels[np.isin(row.input_ids, self._vision_ids)] = IGNORE_INDEX
        arrays["source_ids"][index, : row.real] = source_id
        self._put_positions(arrays, index, row)

    def _put_positions(self, arrays: dict[str, np.ndarray], index: int, row: Row) -> None:
        arrays["position_ids"][index] = row.position_ids

    def _pixels(
        self, rows: list[Row | None], kind: str = "image", empty: np.ndarray | None = None
    ) -> tuple[np.ndarray, list]:
        """The pixels of the batch's images (or videos), in placeholder order, and their
        handles' plans."""
        handles = [
            placement.image
            for row in rows
            if row is not None
            for piece in row.pieces
            for placement in piece.document.images
            if placement.image.kind == kind
        ]
        for image in handles:  # those not made yet are made now, side by side on the pool
            image.prefetch(needed=True)
        images, plans = [], []
        for image in handles:
            images.append(image.pixels())
            plans.append(image.plan)
            image.release()
        if not images:
            return self.processing.empty_pixels() if empty is None else empty, plans
        parts = [self._as_rows(p) for p in images]
        out = new_pixels((sum(len(part) for part in parts), *parts[0].shape[1:]))
        return np.concatenate(parts, out=out), plans

    @staticmethod
    def _as_rows(pixels: np.ndarray) -> np.ndarray:
        return pixels

    def to_wire(self, batch: Batch, into: np.ndarray | None = None) -> Wire:
        """The batch as it leaves a DataLoader worker: pixels made in shared memory
        (`images.shared_pixels`) are sent as their shared tensor, which crosses without a copy."""
        wire = super().to_wire(batch, into)
        for key in wire.tensors:
            tensor = shared_tensor(batch.arrays[key])
            if tensor is not None:
                wire.tensors[key] = tensor
        return wire


class Qwen2VLLayout(_ImageLayout):
    name = "qwen2_vl"
    specs = (
        ArraySpec("input_ids", INT64, INT32),
        ArraySpec("labels", INT64, INT32),
        ArraySpec("position_ids", INT64, INT32, per_token=4),
        ArraySpec("source_ids", INT64, INT32),
        ArraySpec("mm_token_type_ids", INT64, INT32),
        ArraySpec("pixel_values", FLOAT32, FLOAT32, per_token=0),
        ArraySpec("image_grid_thw", INT64, INT32, per_token=0),
    )
    video_specs = VIDEO_SPECS  # added to `specs` when the recipe has `images.video`

    def __init__(self, recipe: Recipe, tokenizer: TokenizerInfo) -> None:
        assert recipe.images is not None
        start, pad, end = _token_ids(tokenizer, QWEN2_VL_TOKENS, self.name)
        self.vision = VisionTokens(pad, (start,), (end,))
        self.vision_names = dict(zip((start, pad, end), QWEN2_VL_TOKENS))
        self.image_pad_id, self.vision_start_id = pad, start
        self.video_pad_id: int | None = None
        if recipe.images.video is not None:
            (video,) = _token_ids(tokenizer, (QWEN2_VL_VIDEO_TOKEN,), self.name)
            self.video_vision = VisionTokens(video, (start,), (end,))
            self.vision_names[video] = QWEN2_VL_VIDEO_TOKEN
            self.video_pad_id = video
            self.specs = self.specs + self.video_specs
        super().__init__(recipe, tokenizer)

    def new_rows(self, batch_size: int) -> dict[str, np.ndarray]:
        arrays = super().new_rows(batch_size)
        arrays["position_ids"] = np.zeros((4, batch_size, self.seq_len), dtype=np.int64)
        arrays["mm_token_type_ids"] = np.zeros((batch_size, self.seq_len), dtype=np.int64)
        return arrays

    def _put_positions(self, arrays: dict[str, np.ndarray], index: int, row: Row) -> None:
        positions = arrays["position_ids"][:, index]
        positions[0] = row.position_ids
        for piece in row.pieces:
            span = slice(piece.at, piece.at + piece.length)
            if piece.document.images:  # whole documents only: never cut
                positions[1:, span] = self._mrope(piece.document)
            else:  # text: the same positions in all three rows
                positions[1:, span] = positions[0, span]
        types = arrays["mm_token_type_ids"][index]
        types[:] = row.input_ids == self.image_pad_id
        if self.video_pad_id is not None:
            types[row.input_ids == self.video_pad_id] = 2
        types[row.real :] = 0

    def _interval(self, plan) -> float:
        """A placeholder run's temporal spacing (1: Qwen2-VL; see `Qwen2_5VLLayout`)."""
        return 1.0

    def _mrope(self, document) -> np.ndarray:
        cached = document.meta.get("mrope")
        if cached is None:
            intervals = [self._interval(p.image.plan) for p in document.images]
            cached = mrope_positions(
                document.tokens,
                document.meta["grids"],
                image_pad_id=self.image_pad_id,
                vision_start_id=self.vision_start_id,
                spatial_merge_size=self.settings.merge_size,
                video_pad_id=self.video_pad_id,
                intervals=intervals,
            )
            document.meta["mrope"] = cached
        return cached

    def finish(self, arrays: dict[str, np.ndarray], rows: list[Row | None], padding: bool) -> Batch:
        pixels, plans = self._pixels(rows)
        arrays["pixel_values"] = pixels.astype(np.float32, copy=False)
        arrays["image_grid_thw"] = _grids(plans)
        if self.videos is not None:
            pixels, plans = self._pixels(rows, "video", self.videos.empty_pixels())
            arrays["pixel_values_videos"] = pixels.astype(np.float32, copy=False)
            arrays["video_grid_thw"] = _grids(plans)
            self._video_extras(arrays, plans)
        return Batch(arrays, padding)

    def _video_extras(self, arrays: dict[str, np.ndarray], plans: list[VideoPlan]) -> None:
        """Per-video arrays a subclass adds (none here)."""


def _grids(plans: list) -> np.ndarray:
    return np.array([plan.grid_thw for plan in plans], dtype=np.int64).reshape(-1, 3)


class Qwen2_5VLLayout(Qwen2VLLayout):
    """Qwen2.5-VL: the qwen2_vl layout whose videos' temporal positions are spaced by
    tokens_per_second · second_per_grid_ts, with `second_per_grid_ts` in the batch."""

    name = "qwen2_5_vl"
    video_specs = (*VIDEO_SPECS, ArraySpec("second_per_grid_ts", FLOAT32, FLOAT32, per_token=0))

    def _interval(self, plan) -> float:
        if not isinstance(plan, VideoPlan):
            return 1.0
        # The model multiplies its int tokens_per_second by a float32 second_per_grid_ts.
        return float(np.float32(self.settings.tokens_per_second) * self._second_per_grid(plan))

    def _second_per_grid(self, plan: VideoPlan) -> np.float32:
        return np.float32(self.settings.temporal_patch_size / plan.sampled_fps)

    def _video_extras(self, arrays: dict[str, np.ndarray], plans: list[VideoPlan]) -> None:
        arrays["second_per_grid_ts"] = np.array(
            [self._second_per_grid(p) for p in plans], dtype=np.float32
        )


class LlavaLayout(_ImageLayout):
    name = "llava"
    specs = (
        ArraySpec("input_ids", INT64, INT32),
        ArraySpec("labels", INT64, INT32),
        ArraySpec("position_ids", INT64, INT32),
        ArraySpec("source_ids", INT64, INT32),
        ArraySpec("pixel_values", FLOAT32, FLOAT32, per_token=0),
    )

    def __init__(self, recipe: Recipe, tokenizer: TokenizerInfo) -> None:
        (image,) = _token_ids(tokenizer, (LLAVA_TOKEN,), "llava")
        self.vision = VisionTokens(image)
        self.vision_names = {image: LLAVA_TOKEN}
        super().__init__(recipe, tokenizer)

    def finish(self, arrays: dict[str, np.ndarray], rows: list[Row | None], padding: bool) -> Batch:
        pixels, _ = self._pixels(rows)
        arrays["pixel_values"] = pixels.astype(np.float32, copy=False)
        return Batch(arrays, padding)

    @staticmethod
    def _as_rows(pixels: np.ndarray) -> np.ndarray:
        return pixels[None]  # one (3, S, S) image


LAYOUTS = {"qwen2_vl": Qwen2VLLayout, "qwen2_5_vl": Qwen2_5VLLayout, "llava": LlavaLayout}
