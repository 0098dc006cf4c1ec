"""`flatten: true`: one row per batch with the keys of transformers' DataCollatorWithFlattening.

The oracle is the collator itself, fed the pieces of the unflattened batch (cut, by a plain
loop here, wherever its `position_ids` restart on a real token or its padding begins); the
stream and the state are the unflattened recipe's; a tiny random Llama run on a flattened
batch gives each piece the logits it has alone.
"""

from __future__ import annotations

import functools
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


@pytest.mark.slow
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


@pytest.mark.parametrize("layout", ["qwen2_vl", "qwen2_5_vl", "llava"])
def test_flattened_image_batches(image_corpus, layout):  # noqa: F811
    recipe = image_recipe_of(image_corpus, layout=layout)
    plain = take(mixer.build_loader(recipe), 3)
    flat = take(mixer.build_loader({**recipe, "flatten": True}), 3)
    for p, f in zip(plain, flat):
        total = p["input_ids"].numel()
        if layout == "llava":
            assert set(f) == set(p) | {"cu_seq_lens_q", "cu_seq_lens_k"} | {
                "max_length_q",
                "max_length_k",
            }
            assert f["position_ids"].shape == (1, total)
        else:
            assert f["position_ids"].shape == (4, 1, total)
            assert torch.equal(f["position_ids"][1:], p["position_ids"][1:].reshape(3, 1, total))
            assert torch.equal(f["mm_token_type_ids"], p["mm_token_type_ids"].reshape(1, total))
            assert torch.equal(f["image_grid_thw"], p["image_grid_thw"])
        assert torch.equal(f["pixel_values"], p["pixel_values"])
        # labels: the collator's on each piece (-100 on its first token), vision tokens masked
        expected = collated(p)
        assert torch.equal(f["input_ids"], expected["input_ids"])
        assert torch.equal(f["cu_seq_lens_q"], expected["cu_seq_lens_q"])
        assert torch.equal(f["cu_seq_lens_k"], expected["cu_seq_lens_k"])
        assert f["max_length_q"] == f["max_length_k"] == expected["max_length_q"]
        text_positions = f["position_ids"][0] if layout != "llava" else f["position_ids"]
        assert torch.equal(text_positions, expected["position_ids"])


def varlen_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """Attention over the pieces `cu_seq_lens_q/k` name, each causal and alone (what
    flash-attention's varlen kernel computes), as a transformers attention function; without
    them, causal over the whole row. Records the varlen keys each call was given."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    VARLEN_CALLS.append({k: kwargs.get(k) for k in FLASH_KEYS})
    if cu_q is None or cu_k is None:
        cu_q = cu_k = torch.tensor([0, query.shape[2]])
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    out = torch.empty_like(query)
    q_bounds, k_bounds = cu_q.tolist(), cu_k.tolist()
    for qs, qe, ks, ke in zip(q_bounds, q_bounds[1:], k_bounds, k_bounds[1:]):
        out[:, :, qs:qe] = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, qs:qe], key[:, :, ks:ke], value[:, :, ks:ke], is_causal=True, scale=scaling
        )
    return out.transpose(1, 2).contiguous(), None


FLASH_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
VARLEN_CALLS: list[dict] = []


@functools.cache
def register_varlen() -> str:
    """The name of `varlen_attention` in transformers' registries (its mask: flash's, none)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register("mixer_test_varlen", varlen_attention)
    AttentionMaskInterface.register(
        "mixer_test_varlen", ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"]
    )
    return "mixer_test_varlen"


def tiny_llama(vocab: int, attention: str = "sdpa") -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    if attention == "varlen":
        attention = register_varlen()

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation=attention,
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


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
@pytest.mark.parametrize("packing", ["best_fit", "pad", "concat"])
def test_flattened_batch_trains_like_its_documents_alone(text_recipe, packing, attention):
    """model(**batch)'s loss and gradients on a flattened batch are those of its documents
    run one at a time (token-weighted), under SDPA (block mask from the position_ids) and under
    varlen attention driven by cu_seq_lens_q/k alone."""
    recipe = {**text_recipe, "packing": packing, "seq_len": 64}
    flat = take(mixer.build_loader({**recipe, "flatten": True}), 2)
    model = tiny_llama(max(int(b["input_ids"].max()) for b in flat) + 1, attention)
    params = [p for p in model.parameters() if p.requires_grad]
    documents = rows = 0
    for batch, plain in zip(flat, take(mixer.build_loader(recipe), 2)):
        inputs = {k: v for k, v in batch.items() if k != "source_ids"}
        VARLEN_CALLS.clear()
        loss = model(**inputs, use_cache=False).loss
        packed_grads = torch.autograd.grad(loss, params)
        if attention == "varlen":  # the keys reach each layer's attention as the batch has them
            assert len(VARLEN_CALLS) == 2
            for call in VARLEN_CALLS:
                assert torch.equal(call["cu_seq_lens_q"], batch["cu_seq_lens_q"])
                assert torch.equal(call["cu_seq_lens_k"], batch["cu_seq_lens_k"])
                assert call["max_length_q"] == call["max_length_k"] == batch["max_length_q"]
        total, counted = torch.zeros(()), 0
        for row, start, end in pieces(plain):  # the unflattened rows' documents (and padding)
            labels = plain["labels"][row : row + 1, start:end].clone()
            labels[:, 0] = -100  # alone, a piece's first token has nothing before it
            predicted = int((labels[:, 1:] != -100).sum())  # HF shifts: token t predicts t + 1
            if predicted == 0:
                continue  # padding, or a one-token piece: nothing to learn
            ids = plain["input_ids"][row : row + 1, start:end]
            alone = model(input_ids=ids, labels=labels, use_cache=False)
            total, counted = total + alone.loss * predicted, counted + predicted
            documents += 1
        assert counted == int((batch["labels"][:, 1:] != -100).sum())
        torch.testing.assert_close(loss, total / counted, rtol=1e-5, atol=1e-6)
        for packed, alone in zip(packed_grads, torch.autograd.grad(total / counted, params)):
            torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-6)
        rows += plain["input_ids"].shape[0]
    assert documents >= rows and (packing == "pad" or documents > rows)  # pad: one a row


@pytest.mark.parametrize("layout", [pytest.param("qwen2_vl", marks=pytest.mark.slow), "llava"])
def test_flattened_image_batch_gives_the_unflattened_logits(image_corpus, layout):  # noqa: F811
    """A tiny random Qwen2-VL / LLaVA gives every real token of a flattened batch the logits it
    has in the unflattened batch, whose documents test_images_loader proves equal to each
    document alone: under SDPA and under the varlen stand-in for the language model."""
    from image_data import vision_ids
    from vlm_models import tiny_llava, tiny_qwen2_vl

    ids = vision_ids(image_corpus[1])
    vocab = max(ids.values()) + 1
    if layout == "qwen2_vl":
        model = tiny_qwen2_vl(
            vocab, ids["<|image_pad|>"], ids["<|vision_start|>"], ids["<|vision_end|>"]
        )
        recipe = image_recipe_of(image_corpus)
        keys = ("input_ids", "position_ids", "mm_token_type_ids", "pixel_values", "image_grid_thw")
    else:
        model = tiny_llava(vocab, ids["<image>"], image_size=28, patch_size=14)
        recipe = image_recipe_of(image_corpus, layout="llava", image_size=28)
        keys = ("input_ids", "position_ids", "pixel_values")
    plain = take(mixer.build_loader(recipe), 1)
    flat = take(mixer.build_loader({**recipe, "flatten": True}), 1)
    language = model.model.language_model.config
    for p, f in zip(plain, flat):
        real = p["source_ids"] >= 0
        language._attn_implementation = "sdpa"
        with torch.no_grad():
            want = model(**{k: p[k] for k in keys}, use_cache=False).logits
            for attention in ("sdpa", register_varlen()):
                language._attn_implementation = attention
                VARLEN_CALLS.clear()
                flat_inputs = {k: f[k] for k in (*keys, *FLASH_KEYS)}
                got = model(**flat_inputs, use_cache=False).logits.reshape(want.shape)
                torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
                assert bool(VARLEN_CALLS) == (attention != "sdpa")
        assert len(f["cu_seq_lens_q"]) - 1 > p["input_ids"].shape[0]


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
def test_hf_trainer_computes_the_flattened_loss_documents_alone_give(
    text_recipe, attention, tmp_path
):
    """MixerTrainer hands a flattened batch's varlen keys to the model (a forward taking
    **kwargs) and, the Trainer turning the model's cache off (TrainingArguments.use_cache),
    its loss is the one test_flattened_batch_trains_like_its_documents_alone equals to the
    documents alone."""
    from transformers import TrainingArguments

    from mixer.integrations.hf import MixerTrainer

    recipe = {**text_recipe, "packing": "best_fit", "seq_len": 64, "flatten": True}
    model = tiny_llama(
        int(take(mixer.build_loader(recipe), 1)[0]["input_ids"].max()) + 1, attention
    )
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=1, use_cpu=True, report_to=[], save_strategy="no"
    )
    trainer = MixerTrainer(model=model, args=args, recipe=recipe)
    (batch,) = take(trainer.mixer_loader, 1)
    VARLEN_CALLS.clear()
    loss = trainer.compute_loss(model, dict(batch))
    if attention == "varlen":
        assert len(VARLEN_CALLS) == 2
        assert all(torch.equal(c["cu_seq_lens_q"], batch["cu_seq_lens_q"]) for c in VARLEN_CALLS)
    inputs = {k: v for k, v in batch.items() if k != "source_ids"}
    torch.testing.assert_close(loss, model(**inputs, use_cache=False).loss)


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
