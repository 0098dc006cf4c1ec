"""`flatten: true`: one row per batch with the keys of transformers' DataCollatorWithFlattening.

The oracle is the collator itself, fed the pieces of the unflattened batch (cut, by a plain
loop here, wherever its `position_ids` restart on a real token or its padding begins); the
stream and the state are the unflattened recipe's; a tiny random Llama run on a flattened
batch gives each piece the logits it has alone.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import corpus, make_tokenizer, write_docs
from test_images_loader import corpus as image_corpus  # noqa: F401 (a fixture)
from test_images_loader import recipe_of as image_recipe_of

import mixer

transformers = pytest.importorskip("transformers")

BATCHES = 6


@pytest.fixture(scope="module")
def text_recipe(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("flatten")
    tokenizer = make_tokenizer(root / "tokenizer.json")
    write_docs(root / "a.jsonl", corpus(0, 120, max_len=30), "jsonl")
    write_docs(root / "b.jsonl", corpus(500, 40, min_len=20, max_len=90, seed=1), "jsonl")
    return {
        "seed": 3,
        "tokenizer": str(tokenizer),
        "seq_len": 32,
        "batch_size": 3,
        "lanes": 2,
        "shuffle_window": 8,
        "mask_document_boundaries": True,
        "sources": [
            {"name": "a", "path": str(root / "a.jsonl"), "weight": 0.6},
            {"name": "b", "path": str(root / "b.jsonl"), "weight": 0.4},
        ],
    }


def take(loader, n: int) -> list[dict]:
    out = []
    for batch in loader:
        out.append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
        if len(out) == n:
            break
    return out


def pieces(batch: dict) -> list[tuple[int, int, int]]:
    """(row, start, end) of each piece of an unflattened batch, by the contract's rule."""
    positions = batch["position_ids"]
    positions = positions[0] if positions.dim() == 3 else positions
    out = []
    for row in range(positions.shape[0]):
        start = 0
        for col in range(1, positions.shape[1]):
            real = batch["source_ids"][row, col] >= 0
            was_real = batch["source_ids"][row, col - 1] >= 0
            if (real and positions[row, col] == 0) or (was_real and not real):
                out.append((row, start, col))
                start = col
        out.append((row, start, positions.shape[1]))
    return out


def collated(batch: dict) -> dict:
    from transformers import DataCollatorWithFlattening

    features = [
        {"input_ids": batch["input_ids"][r, s:e], "labels": batch["labels"][r, s:e]}
        for r, s, e in pieces(batch)
    ]
    return DataCollatorWithFlattening(return_flash_attn_kwargs=True)(features)


def assert_collator_equal(flat: dict, plain: dict) -> None:
    expected = collated(plain)
    for key in ("input_ids", "labels", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert flat[key].dtype == expected[key].dtype, key
        assert torch.equal(flat[key], expected[key]), key
    positions = flat["position_ids"]
    assert torch.equal(
        positions[0] if positions.dim() == 3 else positions, expected["position_ids"]
    )
    assert flat["max_length_q"] == expected["max_length_q"]
    assert flat["max_length_k"] == expected["max_length_k"]


@pytest.mark.parametrize("packing", ["concat", "best_fit", "pad"])
def test_flattened_batches_are_the_collators_of_the_unflattened_stream(text_recipe, packing):
    recipe = {**text_recipe, "packing": packing}
    plain_loader = mixer.build_loader(recipe)
    flat_loader = mixer.build_loader({**recipe, "flatten": True})
    plain, flat = take(plain_loader, BATCHES), take(flat_loader, BATCHES)
    assert plain_loader.state_dict() == flat_loader.state_dict()  # the same stream and state
    starts = 0
    for p, f in zip(plain, flat):
        assert f["input_ids"].shape == (1, 3 * 32)
        assert torch.equal(f["source_ids"], p["source_ids"].reshape(1, -1))
        assert_collator_equal(f, p)
        starts += len(f["cu_seq_lens_q"]) - 1
    assert starts > 3 * BATCHES, "the batches must hold several documents per row"


def test_flattened_resume_and_elastic_resume(text_recipe):
    recipe = {**text_recipe, "packing": "best_fit", "flatten": True}
    plain = take(mixer.build_loader({**recipe, "flatten": False}), 12)
    reference = [f["input_ids"] for f in take(mixer.build_loader(recipe), 12)]
    assert all(torch.equal(r, p["input_ids"].reshape(1, -1)) for r, p in zip(reference, plain))
    first = mixer.build_loader(recipe, num_workers=1)
    take(first, 5)
    resumed = mixer.build_loader(recipe)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    got = take(resumed, 7)
    assert all(torch.equal(g["input_ids"], r) for g, r in zip(got, reference[5:]))
    states = []
    for rank in range(2):
        loader = mixer.build_loader(recipe, rank=rank, world_size=2)
        got = take(loader, 2)
        assert all(torch.equal(g["input_ids"], reference[rank + 2 * i]) for i, g in enumerate(got))
        states.append(loader.state_dict())
    single = mixer.build_loader(recipe)
    single.load_state_dict(mixer.merge_states(states))
    got = take(single, 8)
    assert all(torch.equal(g["input_ids"], r) for g, r in zip(got, reference[4:]))


def test_flattened_qwen2_vl_batches(image_corpus):  # noqa: F811
    recipe = image_recipe_of(image_corpus)
    plain = take(mixer.build_loader(recipe), 3)
    flat = take(mixer.build_loader({**recipe, "flatten": True}), 3)
    for p, f in zip(plain, flat):
        total = p["input_ids"].numel()
        assert f["position_ids"].shape == (4, 1, total)
        assert torch.equal(f["position_ids"][1:], p["position_ids"][1:].reshape(3, 1, total))
        assert torch.equal(f["mm_token_type_ids"], p["mm_token_type_ids"].reshape(1, total))
        assert torch.equal(f["pixel_values"], p["pixel_values"])
        assert torch.equal(f["image_grid_thw"], p["image_grid_thw"])
        # labels: the collator's on each piece (-100 on its first token), vision tokens masked
        expected = collated(p)
        assert torch.equal(f["input_ids"], expected["input_ids"])
        assert torch.equal(f["cu_seq_lens_q"], expected["cu_seq_lens_q"])
        assert torch.equal(f["position_ids"][0], expected["position_ids"])


def tiny_llama(vocab: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval()


def test_flattened_batch_through_llama_equals_each_document_alone(text_recipe):
    """SDPA on CPU ignores cu_seq_lens; transformers builds its block-diagonal mask from the
    flattened position_ids (restarting at 0 in each piece) when no attention_mask is given."""
    recipe = {**text_recipe, "packing": "best_fit", "flatten": True}
    (batch,) = take(mixer.build_loader(recipe), 1)
    model = tiny_llama(int(batch["input_ids"].max()) + 1)
    inputs = {k: v for k, v in batch.items() if k != "source_ids"}
    with torch.no_grad():
        packed = model(**inputs, use_cache=False).logits[0]
        bounds = batch["cu_seq_lens_q"].tolist()
        for start, end in zip(bounds, bounds[1:]):
            alone = model(input_ids=batch["input_ids"][:, start:end], use_cache=False).logits[0]
            torch.testing.assert_close(packed[start:end], alone, rtol=1e-5, atol=1e-5)
        # the check sees leakage: the rows end to end without the restarts differ
        leaked = model(input_ids=batch["input_ids"], use_cache=False).logits[0]
    assert len(bounds) > 4
    assert not torch.allclose(leaked[bounds[1] : bounds[2]], packed[bounds[1] : bounds[2]])


def test_flatten_is_not_in_the_fingerprint(text_recipe):
    plain = mixer.build_loader(text_recipe)
    take(plain, 3)
    flat = mixer.build_loader({**text_recipe, "flatten": True})
    flat.load_state_dict(plain.state_dict())
    expected = take(plain, 2)
    got = take(flat, 2)
    assert all(
        torch.equal(g["input_ids"], e["input_ids"].reshape(1, -1)) for g, e in zip(got, expected)
    )
