"""DataLoader workers send text batches several to an item (`torch_dataset`): the loader's
process still hands them out in global order, the first one as soon as it is made, and image
batches one at a time."""

from __future__ import annotations

import itertools

import pytest
from helpers import batch_digest
from hypothesis import given, settings
from hypothesis import strategies as st

import mixer
from mixer.images.select import layout_for
from mixer.runtime import torch_dataset
from mixer.runtime.torch_dataset import InOrder, _grouped, batches_per_item


def _worker_pairs(worker: int, workers: int, fail_at: int | None):
    step = worker
    while True:
        if fail_at is not None and step >= fail_at:
            yield None, {"g": step, "error": "failed", "worker": worker}
            return
        yield f"batch {step}", {"g": step, "worker": worker}
        step += workers


def _as_a_dataloader(workers: int, most: int, fail_at: int | None):
    """Items as torch's DataLoader returns them: one per worker in turn, a worker whose
    iterator ended skipped."""
    streams = [_grouped(_worker_pairs(w, workers, fail_at), most) for w in range(workers)]
    live = list(range(workers))
    while live:
        for w in list(live):
            item = next(streams[w], None)
            if item is None:
                live.remove(w)
            else:
                yield item


@settings(max_examples=60, deadline=None)
@given(
    workers=st.integers(1, 5),
    most=st.integers(1, 8),
    fail_at=st.one_of(st.none(), st.integers(0, 60)),
)
def test_batches_come_out_in_global_order_whatever_the_item_sizes(workers, most, fail_at):
    out = InOrder(_as_a_dataloader(workers, most, fail_at), workers)
    got = []
    for data, meta in itertools.islice(out, 80):
        assert data == (None if "error" in meta else f"batch {meta['g']}")
        got.append(meta["g"])
        if "error" in meta:
            break
    end = 80 if fail_at is None else min(fail_at + 1, 80)
    assert got == list(range(end))


def test_a_workers_items_grow_from_one_batch():
    sizes = [len(item) for item in itertools.islice(_grouped(iter(range(1000)), 8), 7)]
    assert sizes == [1, 2, 4, 8, 8, 8, 8]


def test_text_batches_go_several_to_an_item_and_image_batches_one(three_sources, tmp_path):
    from image_data import make_vlm_tokenizer

    recipe = mixer.load_recipe(three_sources[0])
    layout = layout_for(recipe, mixer.build_loader(three_sources[0]).tokenizer)
    assert batches_per_item(recipe, layout) == torch_dataset.MAX_ITEM_BATCHES
    big = mixer.load_recipe({**three_sources[0], "seq_len": 8192, "batch_size": 8})
    assert batches_per_item(big, layout_for(big, mixer.build_loader(big).tokenizer)) == 1
    vlm = {
        **three_sources[0],
        "tokenizer": str(make_vlm_tokenizer(tmp_path / "vlm.json")),
        "images": {"layout": "llava", "image_size": 28},
    }
    images = mixer.load_recipe(vlm)
    assert batches_per_item(images, layout_for(images, mixer.build_loader(vlm).tokenizer)) == 1


@pytest.mark.slow
def test_a_resume_and_set_weights_between_items_keep_the_stream(three_sources):
    """State taken, and weights changed, in the middle of a worker's item: the batches after
    it are those of num_workers 0."""
    recipe = three_sources[0]

    def run(workers: int) -> list[str]:
        loader = mixer.build_loader(recipe, num_workers=workers)
        it = iter(loader)
        out = [batch_digest(next(it)) for _ in range(11)]  # inside an item of 8
        state = loader.state_dict()
        loader.set_weights({"prose": 0.2, "code": 0.4, "web": 0.4})
        out += [batch_digest(next(it)) for _ in range(13)]
        loader.close()
        resumed = mixer.build_loader(recipe, num_workers=workers)
        resumed.load_state_dict(state)
        it = iter(resumed)
        out += [batch_digest(next(it)) for _ in range(9)]
        resumed.close()
        return out

    assert run(2) == run(0) == run(1)


@pytest.mark.slow
def test_an_exception_in_a_worker_comes_after_the_batches_made_before_it(
    three_sources, monkeypatch
):
    """Not a data error (those travel as items): an OSError raised on lane 1's 20th batch
    reaches the user after exactly the batches num_workers 0 gives before it, mid-item too."""
    from mixer.pipeline import lanes

    recipe = three_sources[0]  # (unlimited sources)
    real = lanes.Lane.next_batch
    calls: dict[int, int] = {}

    def next_batch(self, n):
        calls[self.lane] = calls.get(self.lane, 0) + 1
        if self.lane == 1 and calls[self.lane] == 20:
            raise OSError("the disk went away")
        return real(self, n)

    monkeypatch.setattr(lanes.Lane, "next_batch", next_batch)

    def run(workers: int) -> list[str]:
        calls.clear()
        loader = mixer.build_loader(recipe, num_workers=workers)
        got: list[str] = []
        try:
            for batch in loader:
                got.append(batch_digest(batch))
        except Exception as exc:
            assert "the disk went away" in str(exc)
        else:
            raise AssertionError("the error was lost")
        finally:
            loader.close()
        return got

    reference = run(0)
    assert len(reference) == 4 * 19 + 1  # lanes 0..3 in turn; lane 1's 20th is batch 77
    assert run(1) == reference and run(2) == reference
