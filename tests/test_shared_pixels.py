"""Batch pixels made in shared memory in DataLoader workers (`mixer.images.shared_pixels`): they
cross to the loader's process without the copy torch's queue makes of other tensors."""

from __future__ import annotations

import io
from multiprocessing.reduction import ForkingPickler

import numpy as np
import torch

from mixer.images import shared_pixels
from mixer.pipeline.batch import SHARED_BYTES


def _crosses_without_a_copy(tensor: torch.Tensor) -> bool:
    """Whether pickling for another process (what DataLoader's queue does) keeps the tensor's
    storage: torch moves a storage that is not shared into a new shared one, a copy."""
    before = tensor.untyped_storage().data_ptr()
    ForkingPickler(io.BytesIO()).dump(tensor)
    return tensor.untyped_storage().data_ptr() == before


def test_a_workers_batch_pixels_are_made_where_they_cross_without_a_copy(monkeypatch):
    monkeypatch.setattr(shared_pixels, "_pid", [0])
    rows = SHARED_BYTES // (1176 * 4) + 1
    assert (
        shared_pixels.shared_tensor(shared_pixels.new_pixels((rows, 1176))) is None
    )  # not asked for
    plain = torch.from_numpy(np.zeros((rows, 1176), dtype=np.float32))
    assert not _crosses_without_a_copy(plain)  # what the queue does to an ordinary array

    shared_pixels.make_in_shared_memory()
    pixels = shared_pixels.new_pixels((rows, 1176))
    tensor = shared_pixels.shared_tensor(pixels)
    assert tensor is not None and tensor.is_shared() and pixels.dtype == np.float32
    pixels[:] = 7.0  # written once, where the receiver maps it
    assert tensor.data_ptr() == pixels.ctypes.data and tuple(tensor.shape) == pixels.shape
    assert _crosses_without_a_copy(tensor)
    assert float(tensor.sum()) == 7.0 * pixels.size
    # Small pixels travel in the batch's buffer; views are not the whole tensor.
    assert shared_pixels.shared_tensor(shared_pixels.new_pixels((1, 1176))) is None
    assert shared_pixels.shared_tensor(pixels[1:]) is None
