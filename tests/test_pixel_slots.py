"""Reused shared-memory slots for DataLoader workers' batch pixels (`runtime/pixel_slots.py`):
a slot is free again only once nothing views the pixels handed out of it, so a caller that
keeps batches gets the same pixels as at num_workers 0, and one that drops them gets its
pixels out of the same few slots, batch after batch (no fresh segment to map and free)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from image_data import Sample, make_vlm_tokenizer, write_tar

import mixer
from mixer.pipeline.batch import Wire
from mixer.runtime import pixel_slots
from mixer.runtime.pixel_slots import InSlot, PixelSlots

pytestmark = pytest.mark.slow


def _sent(slots: PixelSlots, worker: int, values: np.ndarray) -> Wire:
    """What a worker sends: pixels made in a slot, as the wire's tensor."""
    place = slots.allocate(worker, values.nbytes)
    assert place is not None
    pixels = place.view(np.float32).reshape(values.shape)
    pixels[:] = values
    return slots.send(Wire(b"", [], {"pixel_values": torch.from_numpy(pixels)}))


def test_a_slot_is_reused_only_once_nothing_views_its_pixels():
    slots = PixelSlots(workers=2, slots=2, slot_bytes=1 << 16)
    first = np.arange(1000, dtype=np.float32).reshape(10, 100)
    wire = _sent(slots, 1, first)
    item = wire.tensors["pixel_values"]
    assert isinstance(item, InSlot) and item.slot == 2  # worker 1's first slot
    slots.receive(wire)
    tensor = wire.tensors["pixel_values"]
    view = tensor[3:5].numpy()[:, ::2]  # views of views keep the slot too
    del wire, tensor, item
    gc.collect()
    _sent(slots, 1, first + 1)  # the second slot: the first is still viewed
    assert slots.allocate(1, 4) is None  # both taken: the worker falls back, never waits
    assert np.array_equal(view, first[3:5, ::2])
    del view
    gc.collect()
    assert slots.allocate(1, 4) is not None  # free again once the last view went
    assert slots.allocate(0, (1 << 16) + 1) is None  # too large for a slot


def test_a_slot_taken_for_pixels_a_batch_does_not_carry_is_freed_when_it_is_sent():
    slots = PixelSlots(workers=1, slots=1, slot_bytes=1 << 16)
    assert slots.allocate(0, 400) is not None  # made, then copied or dropped
    wire = slots.send(Wire(b"", [], {"pixel_values": torch.zeros(10)}))
    assert not isinstance(wire.tensors["pixel_values"], InSlot)
    assert slots.allocate(0, 400) is not None


@pytest.fixture(scope="module")
def big_pixels_recipe(tmp_path_factory):
    """Image batches whose pixels (several MB) cross as tensors, not in the batch buffer."""
    root = tmp_path_factory.mktemp("slots")
    tokenizer = make_vlm_tokenizer(root / "tokenizer.json")
    for shard in range(4):
        samples = [Sample(shard * 100 + i, 12, [(336, 336)], fmt="png") for i in range(12)]
        write_tar(root / f"shard-{shard}.tar", samples)
    return {
        "seed": 3,
        "tokenizer": str(tokenizer),
        "seq_len": 512,
        "batch_size": 1,
        "lanes": 2,
        "images": {"layout": "qwen2_vl"},
        "sources": [{"name": "pics", "path": str(root / "*.tar"), "weight": 1, "epochs": 1}],
    }


def _pixels(recipe: dict, num_workers: int, keep: bool, seen: list[int]) -> list[torch.Tensor]:
    out = []
    for batch in mixer.build_loader(recipe, num_workers=num_workers):
        pixels = batch["pixel_values"]
        seen.append(pixels.data_ptr())
        out.append(pixels if keep else pixels.clone())
        del batch, pixels
    return out


def test_kept_and_dropped_batches_have_the_pixels_of_num_workers_0(big_pixels_recipe, monkeypatch):
    made: list[PixelSlots] = []
    original = PixelSlots.for_workers.__func__  # type: ignore[attr-defined]

    def recorded(cls, workers):
        made.append(original(cls, workers))
        return made[-1]

    monkeypatch.setattr(PixelSlots, "for_workers", classmethod(recorded))
    reference = _pixels(big_pixels_recipe, 0, True, [])
    assert len(reference) > 2 * pixel_slots.SLOTS and reference[0].nbytes > 1 << 20
    for keep in (True, False):  # kept: every slot stays taken, later batches fall back
        addresses: list[int] = []
        got = _pixels(big_pixels_recipe, 2, keep, addresses)
        assert len(got) == len(reference)
        assert all(torch.equal(a, b) for a, b in zip(got, reference))
        slots = made[-1]
        start = slots._data.ctypes.data
        in_slots = [a for a in addresses if start <= a < start + len(slots._data)]
        if keep:
            assert len(in_slots) == 2 * pixel_slots.SLOTS  # then the fallback
        else:  # dropped: every batch out of a slot, the same few again and again
            assert len(in_slots) == len(addresses)
            assert len(set(in_slots)) <= 2 * pixel_slots.SLOTS < len(in_slots)
