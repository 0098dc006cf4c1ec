"""Qwen2-VL's M-RoPE positions (temporal, height, width) of one document, in numpy.

The model (transformers' `Qwen2VLModel.get_rope_index`) gives a document's tokens three rows
of positions. A text token advances all three by one. An image of patch grid (t, h, w) is a run
of t·(h/m)·(w/m) `<|image_pad|>` tokens (m = spatial merge size), laid out frame by frame, row
by row; its token at (i, j, k) gets (p + i, p + j, p + k), p being the position the image starts
at, and text after it resumes at p + max(h, w)/m. A video is the same with `<|video_pad|>`;
Qwen2.5-VL spaces its temporal positions: frame group i gets p + ⌊i · interval⌋, interval =
tokens_per_second · second_per_grid_t computed in float32 as the model does. In a packed row
each document gets these positions as if it were alone; the layout then places them at the
document's offset.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _image_runs(is_pad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive) of each maximal run of image placeholders."""
    edges = np.diff(is_pad.astype(np.int8), prepend=0, append=0)
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def mrope_positions(
    input_ids: np.ndarray,
    grids: Sequence[tuple[int, int, int]] | np.ndarray,
    *,
    image_pad_id: int,
    vision_start_id: int,
    spatial_merge_size: int,
    video_pad_id: int | None = None,
    intervals: Sequence[float] | None = None,
) -> np.ndarray:
    """The (3, len(input_ids)) int64 M-RoPE positions of one document, as the model gives them.

    `grids` holds each image's or video's (t, h, w) patch grid, in the order of their
    placeholder runs (`image_pad_id` or `video_pad_id`); `intervals`, where given, each run's
    temporal spacing (Qwen2.5-VL videos; 1 elsewhere). Each image must be `vision_start`
    followed by exactly t·h·w / merge² image pads (the vision tower emits that many
    embeddings); anything else raises ValueError rather than yielding positions that the
    model would not compute.
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 1:
        raise ValueError(f"input_ids must be one document (1-D), got shape {ids.shape}")
    grid = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    merge = int(spatial_merge_size)
    pads = [image_pad_id] if video_pad_id is None else [image_pad_id, video_pad_id]
    starts, ends = _image_runs(np.isin(ids, pads))
    if len(starts) != len(grid):
        raise ValueError(f"{len(starts)} image placeholder runs but {len(grid)} grids")
    if len(grid) and ((grid <= 0).any() or (grid[:, 1:] % merge).any()):
        raise ValueError(
            f"image grids must be positive with h and w multiples of the merge "
            f"size {merge}: {grid.tolist()}"
        )
    out = np.empty((3, len(ids)), dtype=np.int64)
    text_from, position = 0, 0  # next text token's index and position
    spacing = [1.0] * len(grid) if intervals is None else list(intervals)
    for (t, h, w), start, end, interval in zip(
        grid.tolist(), starts.tolist(), ends.tolist(), spacing
    ):
        if start == 0 or ids[start - 1] != vision_start_id:
            raise ValueError(
                f"the image placeholders at token {start} do not follow "
                f"<|vision_start|> (id {vision_start_id})"
            )
        rows, cols = h // merge, w // merge
        if end - start != t * rows * cols:
            raise ValueError(
                f"image at token {start} has {end - start} placeholders; its grid "
                f"({t}, {h}, {w}) needs {t * rows * cols}"
            )
        out[:, text_from:start] = np.arange(position, position + start - text_from)
        position += start - text_from
        index = np.arange(end - start)
        frame = index // (rows * cols)
        if interval != 1:  # (float32, truncated: the model's `(arange(t) * interval).long()`)
            frame = (frame.astype(np.float32) * np.float32(interval)).astype(np.int64)
        out[0, start:end] = frame + position
        out[1, start:end] = (index // cols) % rows + position
        out[2, start:end] = index % cols + position
        position += max(h, w) // merge
        text_from = end
    out[:, text_from:] = np.arange(position, position + len(ids) - text_from)
    return out
