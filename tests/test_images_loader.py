"""Image+text batches through the whole loader: keys, pixels, determinism, resume, caps."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import numpy as np
import pytest
from helpers import EOS_ID, FIRST_WORD_ID, word_id, write_docs
from image_data import Sample, make_image, make_vlm_tokenizer, vision_ids, write_tar

import mixer
from mixer.runtime.state import unpack

SEQ_LEN = 96
SIZES = [(56, 56), (84, 112), (140, 70), (28, 28), (30, 45), (200, 150)]


def _samples(first: int, count: int, rng: np.random.Generator) -> list[Sample]:
    out = []
    for doc in range(first, first + count):
        n_images = int(rng.choice([0, 1, 1, 1, 2]))
        sizes = [SIZES[int(rng.integers(len(SIZES)))] for _ in range(n_images)]
        out.append(
            Sample(
                doc,
                int(rng.integers(n_images + 1, 20)),
                sizes,
                fmt=str(rng.choice(["png", "jpg", "webp"])),
                marker=bool(rng.integers(2)) and n_images > 0,
            )
        )
    return out


@pytest.fixture
def corpus(tmp_path):
    """4 tars of 10 image+text samples, and a jsonl text source."""
    tokenizer = make_vlm_tokenizer(tmp_path / "tokenizer.json")
    rng = np.random.default_rng(7)
    samples = []
    for shard in range(4):
        part = _samples(shard * 10, 10, rng)
        write_tar(tmp_path / "pics" / f"shard-{shard:03d}.tar", part)
        samples += part
    texts = [(1000 + i, int(rng.integers(5, 60))) for i in range(40)]
    write_docs(tmp_path / "prose.jsonl", texts, "jsonl")
    return tmp_path, tokenizer, samples, texts


def recipe_of(corpus, *, layout="qwen2_vl", packing="concat", epochs=None, **images) -> dict:
    root, tokenizer, _, _ = corpus
    settings = {
        "layout": layout,
        "min_pixels": 784,
        "max_pixels": 112 * 112,
        "image_size": 56,
        **images,
    }
    return {
        "seed": 5,
        "tokenizer": str(tokenizer),
        "seq_len": SEQ_LEN,
        "batch_size": 3,
        "lanes": 4,
        "packing": packing,
        "images": settings,
        "shuffle_window": 8,
        "sources": [
            {"name": "pics", "path": str(root / "pics" / "*.tar"), "weight": 3, "epochs": epochs},
            {"name": "prose", "path": str(root / "prose.jsonl"), "weight": 1, "epochs": epochs},
        ],
    }


def take(loader, n: int | None) -> list[dict]:
    out: list[dict] = []
    if n == 0:
        return out
    for batch in loader:
        out.append({k: v.clone() for k, v in batch.items()})
        if n is not None and len(out) == n:
            break
    return out


def digest(batch: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(batch):
        h.update(key.encode())
        h.update(str(tuple(batch[key].shape)).encode())
        h.update(batch[key].numpy().tobytes())
    return h.hexdigest()[:16]


def digests(batches: list[dict]) -> list[str]:
    return [digest(b) for b in batches]


QWEN_KEYS = {
    "input_ids",
    "labels",
    "position_ids",
    "source_ids",
    "mm_token_type_ids",
    "pixel_values",
    "image_grid_thw",
}
LLAVA_KEYS = {"input_ids", "labels", "position_ids", "source_ids", "pixel_values"}


def test_qwen2_vl_batches_have_every_key_and_consistent_images(corpus):
    ids = vision_ids(corpus[1])
    batches = take(mixer.build_loader(recipe_of(corpus)), 12)
    seen_images = 0
    for batch in batches:
        assert set(batch) == QWEN_KEYS
        b, length = batch["input_ids"].shape
        assert (b, length) == (3, SEQ_LEN)
        assert batch["position_ids"].shape == (4, b, length)
        grid = batch["image_grid_thw"]
        assert grid.ndim == 2 and grid.shape[1] == 3
        pixels = batch["pixel_values"]
        assert pixels.dtype.is_floating_point and pixels.shape[1] == 3 * 2 * 14 * 14
        assert pixels.shape[0] == int(grid.prod(dim=1).sum())
        pads = batch["input_ids"] == ids["<|image_pad|>"]
        assert int(pads.sum()) == int(grid.prod(dim=1).sum()) // 4
        assert int((batch["input_ids"] == ids["<|vision_start|>"]).sum()) == grid.shape[0]
        assert (batch["mm_token_type_ids"].bool() == pads).all()
        vision = (
            pads
            | (batch["input_ids"] == ids["<|vision_start|>"])
            | (batch["input_ids"] == ids["<|vision_end|>"])
        )
        assert (batch["labels"][vision] == -100).all()
        assert (batch["labels"][batch["source_ids"] < 0] == -100).all()
        seen_images += grid.shape[0]
    assert seen_images > 5, "the batches held images"


def test_llava_batches_have_every_key_and_one_crop_per_image(corpus):
    ids = vision_ids(corpus[1])
    batches = take(mixer.build_loader(recipe_of(corpus, layout="llava", image_size=56)), 12)
    seen = 0
    for batch in batches:
        assert set(batch) == LLAVA_KEYS
        assert batch["position_ids"].shape == batch["input_ids"].shape
        n = batch["pixel_values"].shape[0]
        assert batch["pixel_values"].shape[1:] == (3, 56, 56)
        image_tokens = batch["input_ids"] == ids["<image>"]
        assert int(image_tokens.sum()) == n * (56 // 14) ** 2
        assert (batch["labels"][image_tokens] == -100).all()
        seen += n
    assert seen > 5


def _images_by_sample(batch: dict, start_id: int) -> list[tuple[int, int]]:
    """(sample, image index) of each image of a qwen2_vl batch, in placeholder order: an
    image belongs to the sample whose caption word follows it (image documents are never
    cut, and every image precedes a word of its caption)."""
    out, counters = [], Counter()
    for row in batch["input_ids"].tolist():
        pending = 0
        for token in row:
            if token == start_id:
                pending += 1
            elif FIRST_WORD_ID <= token < FIRST_WORD_ID + 30000 and pending:
                doc = token - FIRST_WORD_ID
                for _ in range(pending):
                    out.append((doc, counters[doc]))
                    counters[doc] += 1
                pending = 0
        assert pending == 0
    return out


def test_pixels_equal_the_transformers_processor(corpus):
    from transformers import Qwen2VLImageProcessorPil

    root, tokenizer, samples, _ = corpus
    ids = vision_ids(tokenizer)
    by_doc = {s.doc: s for s in samples}
    processor = Qwen2VLImageProcessorPil(min_pixels=784, max_pixels=112 * 112)
    recipe = recipe_of(corpus)
    recipe["sources"] = recipe["sources"][:1]
    recipe["sources"][0]["epochs"] = 1
    compared = 0
    for batch in take(mixer.build_loader(recipe), None):
        at = 0
        for (doc, index), grid in zip(
            _images_by_sample(batch, ids["<|vision_start|>"]), batch["image_grid_thw"].tolist()
        ):
            sample = by_doc[doc]
            image = make_image(doc, index, sample.sizes[index], sample.mode)
            if sample.fmt != "png":  # lossy: compare with what the tar holds
                import io

                from image_data import encode_image
                from PIL import Image

                image = Image.open(io.BytesIO(encode_image(image, sample.fmt)))
            expected = processor(images=[image], return_tensors="np")
            rows = int(np.prod(grid))
            assert grid == expected["image_grid_thw"][0].tolist()
            got = batch["pixel_values"][at : at + rows].numpy()
            assert np.abs(got - expected["pixel_values"]).max() <= 1e-3
            at += rows
            compared += 1
        assert at == batch["pixel_values"].shape[0]
    assert compared == sum(len(s.sizes) for s in samples)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["qwen2_vl", "llava"])
def test_same_batches_with_any_worker_count_and_after_resume(corpus, layout):
    recipe = recipe_of(corpus, layout=layout)
    reference = digests(take(mixer.build_loader(recipe), 14))
    assert digests(take(mixer.build_loader(recipe, num_workers=2), 14)) == reference
    for k in (0, 1, 5):
        loader = mixer.build_loader(recipe, num_workers=2)
        head = digests(take(loader, k))
        state = json.loads(json.dumps(loader.state_dict()))
        assert len(json.dumps(state)) < 64_000
        again = mixer.build_loader(recipe, num_workers=2 if k % 2 else 0)
        again.load_state_dict(state)
        assert head + digests(take(again, 14 - k)) == reference
    twice = mixer.build_loader(recipe)
    first = mixer.build_loader(recipe)
    take(first, 3)
    twice.load_state_dict(first.state_dict())
    twice.load_state_dict(first.state_dict())
    assert digests(take(twice, 11)) == reference[3:]


def assert_elastic_resume(
    recipe: dict,
    reference: list[str],
    *,
    steps: int,
    rest: int,
    rank_workers: int,
    single_workers: int,
) -> None:
    """Two ranks take `steps` batches each (rank r: global batches r, r + 2, ...); their
    merged state resumes one process, which gives the next `rest` global batches."""
    states = []
    for rank in range(2):
        part = mixer.build_loader(recipe, rank=rank, world_size=2, num_workers=rank_workers)
        assert digests(take(part, steps)) == reference[rank : 2 * steps : 2]
        states.append(part.state_dict())
    single = mixer.build_loader(recipe, num_workers=single_workers)
    single.load_state_dict(mixer.merge_states(states))
    assert digests(take(single, rest)) == reference[2 * steps : 2 * steps + rest]


@pytest.mark.slow
def test_elastic_resume_with_images(corpus):
    recipe = recipe_of(corpus)
    reference = digests(take(mixer.build_loader(recipe), 16))
    assert_elastic_resume(recipe, reference, steps=3, rest=10, rank_workers=2, single_workers=1)


def _delivered(batches, ids) -> tuple[Counter, Counter]:
    """(real tokens per id, images per sample) over batches of a qwen2_vl finite run."""
    tokens: Counter = Counter()
    for b in batches:
        tokens.update(b["input_ids"][b["source_ids"] >= 0].tolist())
    return tokens, Counter()


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["concat", "best_fit", "pad"])
def test_finite_recipe_delivers_every_sample_and_image_exactly_once(corpus, packing):
    _, tokenizer, samples, texts = corpus
    ids = vision_ids(tokenizer)
    recipe = recipe_of(corpus, packing=packing, epochs=1)
    batches = []
    for rank in range(2):
        batches += take(mixer.build_loader(recipe, rank=rank, world_size=2, num_workers=1), None)
    tokens, _ = _delivered(batches, ids)
    for s in samples:
        assert tokens[word_id(s.doc)] == s.length, s
    for doc, length in texts:
        assert tokens[word_id(doc)] == length
    assert tokens[EOS_ID] == len(samples) + len(texts)
    images = sum(b["image_grid_thw"].shape[0] for b in batches)
    assert images == sum(len(s.sizes) for s in samples)
    assert tokens[ids["<|vision_start|>"]] == images


def test_per_batch_caps_are_respected_and_nothing_is_dropped(corpus):
    _, _, samples, texts = corpus
    recipe = recipe_of(corpus, epochs=1, max_images_per_batch=2, max_patches_per_batch=120)
    for packing in ("concat", "best_fit", "pad"):
        recipe["packing"] = packing
        loader = mixer.build_loader(recipe)
        batches = take(loader, None)
        assert all(b["image_grid_thw"].shape[0] <= 2 for b in batches)
        assert all(b["pixel_values"].shape[0] <= 120 for b in batches)
        assert max(b["image_grid_thw"].shape[0] for b in batches) == 2, "the cap was reached"
        # every sample fits the caps (at a lower resolution where needed): none is dropped
        assert loader.metrics()["oversize"] == {"pics": 0, "prose": 0}
        assert sum(b["image_grid_thw"].shape[0] for b in batches) == sum(
            len(s.sizes) for s in samples
        )
        tokens = Counter()
        for b in batches:
            tokens.update(b["input_ids"][b["source_ids"] >= 0].tolist())
        assert tokens[EOS_ID] == len(samples) + len(texts)


def test_long_documents_get_lower_resolution_or_are_counted_as_oversize(tmp_path):
    tokenizer = make_vlm_tokenizer(tmp_path / "tokenizer.json")
    write_tar(
        tmp_path / "big.tar",
        [Sample(1, 3, [(400, 400)]), Sample(2, 90, [(400, 400)]), Sample(3, 2, [(28, 28)] * 3)],
    )
    recipe = {
        "tokenizer": str(tokenizer),
        "seq_len": 64,
        "batch_size": 1,
        "lanes": 1,
        "images": {
            "layout": "qwen2_vl",
            "min_pixels": 784 * 4,
            "max_pixels": 400 * 400,
            "max_images_per_batch": 2,
        },
        "sources": [{"name": "big", "path": str(tmp_path / "big.tar"), "weight": 1, "epochs": 1}],
    }
    loader = mixer.build_loader(recipe)
    batches = take(loader, None)
    grids = [g for b in batches for g in b["image_grid_thw"].tolist()]
    # sample 1 fits once its image is lowered; sample 2's text after the image is cut;
    # sample 3 has more images than a batch may hold: oversize.
    assert len(grids) == 2
    assert all(t * h * w // 4 + 2 <= 64 for t, h, w in grids)
    assert loader.metrics()["oversize"] == {"big": 1}
    state = unpack(loader.state_dict())
    assert state is None or "oversize" in json.dumps(state)


def test_corrupt_image_is_a_data_error_naming_member_or_a_counted_skip(corpus, tmp_path):
    root = tmp_path / "bad"
    path = write_tar(
        root / "bad.tar",
        [Sample(1, 3, [(56, 56)]), Sample(2, 3, [(56, 56)]), Sample(3, 3, [(56, 56)])],
    )
    data = bytearray(path.read_bytes())
    # truncate the second sample's PNG inside the tar (its member keeps its size)
    marker = data.find(b"IDAT", data.find(b"s000002.png"))
    data[marker + 40 : marker + 400] = b"\0" * 360
    path.write_bytes(bytes(data))
    recipe = recipe_of(corpus, epochs=1)
    recipe["sources"] = [{"name": "bad", "path": str(path), "weight": 1, "epochs": 1}]
    with pytest.raises(mixer.DataError) as err:
        take(mixer.build_loader(recipe), None)
    assert err.value.source == "bad" and err.value.file.endswith("bad.tar")
    assert "s000002.png" in str(err.value) and "offset" in str(err.value)
    recipe["sources"][0]["on_error"] = "skip"
    loader = mixer.build_loader(recipe)
    batches = take(loader, None)
    assert sum(b["image_grid_thw"].shape[0] for b in batches) == 2
    assert loader.metrics()["skipped"]["bad"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["qwen2_vl", "llava"])
def test_loader_batches_train_like_their_documents_alone(corpus, layout):
    """The real loader's packed rows, fed to tiny random models: every document's logits in
    the packed batch equal its logits alone (vlm_models.assert_packed_equals_alone)."""
    from vlm_models import assert_packed_equals_alone, tiny_llava, tiny_qwen2_vl

    ids = vision_ids(corpus[1])
    vocab = max(ids.values()) + 1
    if layout == "qwen2_vl":
        model = tiny_qwen2_vl(
            vocab, ids["<|image_pad|>"], ids["<|vision_start|>"], ids["<|vision_end|>"]
        )
        recipe = recipe_of(corpus)
    else:
        model = tiny_llava(vocab, ids["<image>"], image_size=28, patch_size=14)
        recipe = recipe_of(corpus, layout="llava", image_size=28)
    seen = Counter()
    for batch in take(mixer.build_loader(recipe), 4):
        counts = assert_packed_equals_alone(
            model, batch, layout, eos_id=EOS_ID, require_coverage=False
        )
        seen.update(counts)
    assert seen["units_with_images"] > 0 and seen["packed_rows"] > 0, seen


def test_images_in_a_recipe_without_an_images_block_are_never_dropped_silently(corpus):
    recipe = recipe_of(corpus, epochs=1)
    del recipe["images"]
    recipe["sources"] = recipe["sources"][:1]
    with pytest.raises(mixer.DataError, match="no `images:` block") as err:
        take(mixer.build_loader(recipe, num_workers=1), None)
    assert err.value.source == "pics" and err.value.file.endswith(".tar")
    recipe["sources"][0]["on_error"] = "skip"
    loader = mixer.build_loader(recipe)
    take(loader, None)
    _, _, samples, _ = corpus
    assert loader.metrics()["skipped"]["pics"] == sum(bool(s.sizes) for s in samples)
