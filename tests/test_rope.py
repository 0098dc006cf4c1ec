"""mrope_positions equals the model's own Qwen2-VL get_rope_index on single documents."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vlm_models import tiny_qwen2_vl

from mixer.images.rope import mrope_positions

VOCAB, BOS, PAD, START, END = 64, 2, 60, 61, 62


@pytest.fixture(scope="module")
def models():
    return {
        merge: tiny_qwen2_vl(VOCAB, PAD, START, END, spatial_merge_size=merge) for merge in (1, 2)
    }


def document(data, merge: int) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """Text pieces and up to three images, each as vision_start + pads + vision_end."""
    tokens = [BOS] if data.draw(st.booleans()) else []
    grids = []
    text = st.lists(st.integers(3, PAD - 1), max_size=7)
    tokens += data.draw(text)
    for _ in range(data.draw(st.integers(0, 3))):
        t = data.draw(st.integers(1, 2))
        h, w = (merge * data.draw(st.integers(1, 5)) for _ in range(2))
        tokens += [START] + [PAD] * (t * h * w // merge**2) + [END] + data.draw(text)
        grids.append((t, h, w))
    return np.array(tokens, dtype=np.int64), grids


def model_positions(model, ids: np.ndarray, grids) -> np.ndarray:
    input_ids = torch.from_numpy(ids)[None]
    mm = (input_ids == PAD).long()
    thw = torch.tensor(grids, dtype=torch.long).reshape(-1, 3) if grids else None
    positions, _ = model.model.get_rope_index(
        input_ids, mm, image_grid_thw=thw, attention_mask=torch.ones_like(input_ids)
    )
    return positions[:, 0].numpy()


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_equals_get_rope_index(models, data):
    merge = data.draw(st.sampled_from([1, 2]))
    ids, grids = document(data, merge)
    if len(ids) == 0:  # the model's function cannot take an empty document
        assert mrope_positions(
            ids, grids, image_pad_id=PAD, vision_start_id=START, spatial_merge_size=merge
        ).shape == (3, 0)
        return
    got = mrope_positions(
        ids, grids, image_pad_id=PAD, vision_start_id=START, spatial_merge_size=merge
    )
    want = model_positions(models[merge], ids, grids)
    assert got.dtype == np.int64 and got.shape == (3, len(ids))
    np.testing.assert_array_equal(got, want)
    # An (n, 3) array of grids is taken like the list.
    again = mrope_positions(
        ids,
        np.array(grids, dtype=np.int64).reshape(-1, 3),
        image_pad_id=PAD,
        vision_start_id=START,
        spatial_merge_size=merge,
    )
    np.testing.assert_array_equal(again, want)


def test_example_by_hand():
    # text(2) + image 1×4×6 (merge 2: 2×3 tokens) + text(2): text resumes at 3 + max(2, 3).
    ids = np.array([5, START] + [PAD] * 6 + [END, 7])
    got = mrope_positions(
        ids, [(1, 4, 6)], image_pad_id=PAD, vision_start_id=START, spatial_merge_size=2
    )
    np.testing.assert_array_equal(
        got,
        [
            [0, 1, 2, 2, 2, 2, 2, 2, 5, 6],
            [0, 1, 2, 2, 2, 3, 3, 3, 5, 6],
            [0, 1, 2, 3, 4, 2, 3, 4, 5, 6],
        ],
    )


@pytest.mark.parametrize(
    "ids, grids, message",
    [
        ([START, PAD, PAD, END], [(1, 2, 2)], "needs 1"),
        ([START, PAD, END], [], "1 image placeholder runs but 0 grids"),
        ([START, PAD, END], [(1, 2, 2), (1, 2, 2)], "but 2 grids"),
        ([5, PAD, END], [(1, 2, 2)], "do not follow"),
        ([PAD, END], [(1, 2, 2)], "do not follow"),
        ([START, PAD, END], [(1, 3, 2)], "multiples of the merge size"),
    ],
)
def test_refuses_what_the_model_would_not_compute(ids, grids, message):
    with pytest.raises(ValueError, match=message):
        mrope_positions(
            np.array(ids), grids, image_pad_id=PAD, vision_start_id=START, spatial_merge_size=2
        )
