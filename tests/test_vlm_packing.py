"""Packed image+text rows train exactly like their documents alone (qwen2_vl and llava).

The batches here are built by hand from the batch contract, so that the oracle
(`vlm_models.assert_packed_equals_alone`) is tested on its own: it passes on right batches and
raises on batches whose positions, images or document boundaries are wrong.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models
from vlm_models import assert_packed_equals_alone, tiny_llava, tiny_qwen2_vl

from mixer.images.rope import mrope_positions

VOCAB, PAD_ID, EOS, BOS = 64, 0, 1, 2
IMAGE_PAD, VISION_START, VISION_END = 60, 61, 62  # qwen2_vl
IMAGE = 60  # llava's <image>
MERGE, PATCH, TEMPORAL = 2, 14, 2
LLAVA_SIZE, LLAVA_PATCH = 28, 7
LLAVA_TOKENS = (LLAVA_SIZE // LLAVA_PATCH) ** 2
SEQ_LEN = 48
IGNORE = -100


@dataclass
class Piece:
    """Tokens of a document (or of the part of it that a row holds) and its images' grids."""

    tokens: list[int]
    grids: list[tuple[int, int, int]] = field(default_factory=list)
    source: int = 0
    continuation: bool = False  # continues a document at a row start: positions from 0


def text(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(3, IMAGE_PAD, size=n).tolist()


def qwen_doc(rng, parts, source=0, bos=False) -> Piece:
    """parts: an int is that many text tokens, an (h, w) pair an image of grid (1, h, w)."""
    tokens, grids = ([BOS] if bos else []), []
    for part in parts:
        if isinstance(part, int):
            tokens += text(rng, part)
        else:
            h, w = part
            tokens += [VISION_START] + [IMAGE_PAD] * (h * w // MERGE**2) + [VISION_END]
            grids.append((1, h, w))
    return Piece(tokens + [EOS], grids, source)


def split(piece: Piece, at: int) -> tuple[Piece, Piece]:
    """A document cut after `at` tokens, between images: the head keeps the images it holds
    and the piece continuing at the next row's start counts its positions from 0."""
    held = piece.tokens[:at].count(VISION_START)
    head = Piece(piece.tokens[:at], piece.grids[:held], piece.source)
    return head, Piece(piece.tokens[at:], piece.grids[held:], piece.source, continuation=True)


def qwen_rows(rng: np.random.Generator) -> list[list[Piece]]:
    """Two rows: three documents and a cut one, then its continuation and two more."""
    a = qwen_doc(rng, [3, (4, 4), 5], bos=True)  # 16 tokens, 4 pads
    b = qwen_doc(rng, [4, (2, 8), (6, 4), 3], source=1)  # 22 tokens, 4 + 6 pads
    c = qwen_doc(rng, [2, (4, 6), 20])  # 31 tokens, cut after 10
    c_head, c_tail = split(c, 10)
    d = qwen_doc(rng, [8], source=1)
    e = qwen_doc(rng, [(2, 2), 4])
    return [[a, b, c_head], [c_tail, d, e]]


def pack_qwen(
    rows: list[list[Piece]], rng: np.random.Generator, *, mode: str = "per_document"
) -> dict[str, torch.Tensor]:
    """The qwen2_vl batch of these rows. `mode` other than per_document computes positions
    wrongly: rows 1-3 over the whole row (`mrope_over_row`), rows 1-3 equal to row 0
    (`text_only`), or row 0 not restarting at documents (`text_over_row`)."""
    shape = (len(rows), SEQ_LEN)
    ids = np.full(shape, EOS, dtype=np.int64)
    sources = np.full(shape, -1, dtype=np.int64)
    positions = np.zeros((4, *shape), dtype=np.int64)
    grids: list[tuple[int, int, int]] = []
    for r, row in enumerate(rows):
        at = 0
        for piece in row:
            n = len(piece.tokens)
            ids[r, at : at + n] = piece.tokens
            sources[r, at : at + n] = piece.source
            positions[0, r, at : at + n] = np.arange(n)
            if piece.continuation:
                positions[1:, r, at : at + n] = np.arange(n)
            else:
                positions[1:, r, at : at + n] = mrope_positions(
                    np.array(piece.tokens),
                    piece.grids,
                    image_pad_id=IMAGE_PAD,
                    vision_start_id=VISION_START,
                    spatial_merge_size=MERGE,
                )
            grids += piece.grids
            at += n
        if mode == "mrope_over_row":
            positions[1:, r, :at] = mrope_positions(
                ids[r, :at],
                [g for p in row for g in p.grids],
                image_pad_id=IMAGE_PAD,
                vision_start_id=VISION_START,
                spatial_merge_size=MERGE,
            )
        elif mode == "text_only":
            positions[1:, r] = positions[0, r]
        elif mode == "text_over_row":
            positions[0, r, :at] = np.arange(at)
    vision = np.isin(ids, [IMAGE_PAD, VISION_START, VISION_END])
    labels = np.where(vision | (sources < 0), IGNORE, ids)
    patches = sum(t * h * w for t, h, w in grids)
    pixels = rng.standard_normal((patches, 3 * TEMPORAL * PATCH**2), dtype=np.float32)
    return {
        "input_ids": torch.from_numpy(ids),
        "labels": torch.from_numpy(labels),
        "source_ids": torch.from_numpy(sources),
        "position_ids": torch.from_numpy(positions),
        "pixel_values": torch.from_numpy(pixels),
        "image_grid_thw": torch.tensor(grids, dtype=torch.long).reshape(-1, 3),
        "mm_token_type_ids": torch.from_numpy((ids == IMAGE_PAD).astype(np.int64)),
    }


@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen2_vl(
        VOCAB,
        IMAGE_PAD,
        VISION_START,
        VISION_END,
        patch_size=PATCH,
        temporal_patch_size=TEMPORAL,
        spatial_merge_size=MERGE,
    )


@pytest.fixture(scope="module")
def llava():
    return tiny_llava(VOCAB, IMAGE, LLAVA_SIZE, LLAVA_PATCH)


def test_qwen2_vl_packed_rows_equal_documents_alone(qwen):
    rng = np.random.default_rng(0)
    batch = pack_qwen(qwen_rows(rng), rng)
    assert batch["position_ids"].shape == (4, 2, SEQ_LEN)
    assert batch["pixel_values"].shape == (16 + 16 + 24 + 24 + 4, 1176)
    seen = assert_packed_equals_alone(qwen, batch, "qwen2_vl", eos_id=EOS)
    assert seen == {"units": 6, "units_with_images": 4, "images": 5, "packed_rows": 2}


def test_qwen2_vl_contract_of_the_hand_built_batch(qwen):
    rng = np.random.default_rng(0)
    batch = pack_qwen(qwen_rows(rng), rng)
    ids, labels = batch["input_ids"], batch["labels"]
    vision = (ids == IMAGE_PAD) | (ids == VISION_START) | (ids == VISION_END)
    assert (labels[vision] == IGNORE).all() and (labels[batch["source_ids"] < 0] == IGNORE).all()
    assert int((batch["mm_token_type_ids"] == 1).sum()) == int((ids == IMAGE_PAD).sum()) == 21


@pytest.mark.parametrize("mode", ["text_only", "text_over_row"])
def test_qwen2_vl_logits_catch_wrong_positions(qwen, mode):
    rng = np.random.default_rng(0)
    batch = pack_qwen(qwen_rows(rng), rng, mode=mode)
    with pytest.raises(AssertionError, match="packed logits differ"):
        assert_packed_equals_alone(qwen, batch, "qwen2_vl", check_positions=False)
    with pytest.raises(AssertionError):
        assert_packed_equals_alone(qwen, batch, "qwen2_vl")


def test_qwen2_vl_mrope_over_the_row_is_a_shift_only_the_exact_check_sees(qwen):
    """Rows 1-3 computed over the whole row shift each later document's M-RoPE positions by a
    constant; RoPE being relative, the logits stay equal. The exact position check refuses it."""
    rng = np.random.default_rng(0)
    batch = pack_qwen(qwen_rows(rng), rng, mode="mrope_over_row")
    with pytest.raises(AssertionError, match="M-RoPE rows differ"):
        assert_packed_equals_alone(qwen, batch, "qwen2_vl")
    assert_packed_equals_alone(qwen, batch, "qwen2_vl", check_positions=False)


def test_qwen2_vl_catches_grids_that_do_not_match_the_positions(qwen):
    """Images 0 and 1 both have 16 patches and 4 placeholders, grids (1, 4, 4) and (1, 2, 8):
    swapped grids run consistently packed and alone, but not with the positions computed
    for the true grids."""
    rng = np.random.default_rng(0)
    batch = pack_qwen(qwen_rows(rng), rng)
    batch["image_grid_thw"] = batch["image_grid_thw"][[1, 0, 2, 3, 4]]
    with pytest.raises(AssertionError, match="M-RoPE rows differ"):
        assert_packed_equals_alone(qwen, batch, "qwen2_vl")


def test_qwen2_vl_catches_images_that_do_not_match_placeholders(qwen):
    rng = np.random.default_rng(0)
    batch = pack_qwen(qwen_rows(rng), rng)
    short = dict(batch, pixel_values=batch["pixel_values"][:-4])
    with pytest.raises(AssertionError, match="pixel_values has 80 rows, the grids need 84"):
        assert_packed_equals_alone(qwen, short, "qwen2_vl")
    fewer = dict(batch, image_grid_thw=batch["image_grid_thw"][:-1])
    with pytest.raises(AssertionError, match="more image placeholders than images"):
        assert_packed_equals_alone(qwen, fewer, "qwen2_vl")


def test_qwen2_vl_cannot_pass_vacuously(qwen):
    rng = np.random.default_rng(0)
    text_only = [[qwen_doc(rng, [5]), qwen_doc(rng, [7])], [qwen_doc(rng, [9])]]
    with pytest.raises(AssertionError, match="no unit with images"):
        assert_packed_equals_alone(qwen, pack_qwen(text_only, rng), "qwen2_vl")
    one_per_row = [[qwen_doc(rng, [5, (4, 4)])], [qwen_doc(rng, [(2, 2), 3])]]
    with pytest.raises(AssertionError, match="no row holds two"):
        assert_packed_equals_alone(qwen, pack_qwen(one_per_row, rng), "qwen2_vl")


# -- llava --------------------------------------------------------------------------------------
def llava_doc(rng, parts, source=0) -> Piece:
    """parts: an int is that many text tokens, "img" one image."""
    tokens, images = [], []
    for part in parts:
        if part == "img":
            tokens += [IMAGE] * LLAVA_TOKENS
            images.append((1, 1, 1))  # only their count matters here
        else:
            tokens += text(rng, part)
    return Piece(tokens + [EOS], images, source)


def pack_llava(
    rows: list[list[Piece]], rng: np.random.Generator, *, mode: str = "per_document"
) -> dict[str, torch.Tensor]:
    """The llava batch of these rows; `over_row` never restarts positions, `offset` starts each
    later document's positions at 5 instead of 0."""
    shape = (len(rows), SEQ_LEN)
    ids = np.full(shape, EOS, dtype=np.int64)
    sources = np.full(shape, -1, dtype=np.int64)
    positions = np.zeros(shape, dtype=np.int64)
    n_images = 0
    for r, row in enumerate(rows):
        at = 0
        for i, piece in enumerate(row):
            n = len(piece.tokens)
            ids[r, at : at + n] = piece.tokens
            sources[r, at : at + n] = piece.source
            start = at if mode == "over_row" else 5 if (mode == "offset" and i) else 0
            positions[r, at : at + n] = np.arange(start, start + n)
            n_images += len(piece.grids)
            at += n
    labels = np.where((ids == IMAGE) | (sources < 0), IGNORE, ids)
    pixels = rng.standard_normal((n_images, 3, LLAVA_SIZE, LLAVA_SIZE), dtype=np.float32)
    return {
        "input_ids": torch.from_numpy(ids),
        "labels": torch.from_numpy(labels),
        "source_ids": torch.from_numpy(sources),
        "position_ids": torch.from_numpy(positions),
        "pixel_values": torch.from_numpy(pixels),
    }


def llava_rows(rng) -> list[list[Piece]]:
    """Three rows: two documents and a cut text one; its continuation and one more; one
    document of two images alone."""
    a = llava_doc(rng, [3, "img", 4])  # 24 tokens
    b = llava_doc(rng, ["img", "img", 2], source=1)  # 35
    c = llava_doc(rng, [6])  # 7
    d = llava_doc(rng, [2, "img"])  # 19
    head, tail = split(llava_doc(rng, [20], source=1), 17)  # 17 + 4
    return [[a, c, head], [tail, d], [b]]


def test_llava_packed_rows_equal_documents_alone(llava):
    rng = np.random.default_rng(1)
    batch = pack_llava(llava_rows(rng), rng)
    seen = assert_packed_equals_alone(llava, batch, "llava", eos_id=EOS)
    assert seen == {"units": 6, "units_with_images": 3, "images": 4, "packed_rows": 2}


def test_llava_catches_images_that_do_not_match_placeholders(llava):
    rng = np.random.default_rng(1)
    batch = pack_llava(llava_rows(rng), rng)
    with pytest.raises(AssertionError, match="more image placeholders than images"):
        assert_packed_equals_alone(
            llava, dict(batch, pixel_values=batch["pixel_values"][:3]), "llava"
        )
    ids = batch["input_ids"].clone()
    ids[0, 5] = 3  # one placeholder short: image 0 now spans into text
    with pytest.raises(AssertionError, match="image 0 needs 16 placeholders"):
        assert_packed_equals_alone(llava, dict(batch, input_ids=ids), "llava")


def test_llava_logits_catch_positions_not_restarting_at_zero(llava):
    rng = np.random.default_rng(1)
    batch = pack_llava(llava_rows(rng), rng, mode="offset")
    with pytest.raises(AssertionError, match="packed logits differ"):
        assert_packed_equals_alone(llava, batch, "llava", check_positions=False)


def test_llava_positions_over_the_row_merge_documents_only_eos_sees(llava):
    """Positions that never restart make a row one sequence to the model and to the oracle
    alike (equal logits); only a document's EOS inside a unit tells them apart."""
    rng = np.random.default_rng(1)
    batch = pack_llava(llava_rows(rng), rng, mode="over_row")
    with pytest.raises(AssertionError, match="an EOS inside the unit"):
        assert_packed_equals_alone(llava, batch, "llava", eos_id=EOS, require_coverage=False)


def test_a_cache_or_a_padding_mask_turns_packing_off(qwen, llava):
    """transformers derives the block-diagonal mask from the positions only when the model gets
    no attention_mask and no cache (use_cache defaults to True in both configs): a training loop
    must pass neither, or documents attend to each other."""
    rng = np.random.default_rng(0)
    batch = pack_qwen(qwen_rows(rng), rng)
    keys = ("input_ids", "position_ids", "pixel_values", "image_grid_thw", "mm_token_type_ids")
    inputs = {key: batch[key] for key in keys}
    real = (batch["source_ids"] >= 0).long()
    with torch.no_grad():
        right = qwen(**inputs, use_cache=False).logits
        for wrong in (
            qwen(**inputs, use_cache=True).logits,
            qwen(**inputs, use_cache=False, attention_mask=real).logits,
        ):
            assert (wrong - right).abs().max() > 0.1
    rng = np.random.default_rng(1)
    batch = pack_llava(llava_rows(rng), rng)
    inputs = {key: batch[key] for key in ("input_ids", "position_ids", "pixel_values")}
    with torch.no_grad():
        right = llava(**inputs, use_cache=False).logits
        assert (llava(**inputs, use_cache=True).logits - right).abs().max() > 0.1


# -- examples/train_vlm.py ------------------------------------------------------------------------
def load_example():
    path = Path(__file__).parents[1] / "examples" / "train_vlm.py"
    spec = importlib.util.spec_from_file_location("train_vlm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_vlm_model_trains_on_packed_batches(tmp_path):
    example = load_example()
    vocab = {f"w{i}": i for i in range(VOCAB)}
    names = {
        IMAGE_PAD: "<|image_pad|>",
        VISION_START: "<|vision_start|>",
        VISION_END: "<|vision_end|>",
    }
    for index, name in names.items():
        del vocab[f"w{index}"]
        vocab[name] = index
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.add_special_tokens(list(names.values()))
    tok.save(str(tmp_path / "tokenizer.json"))
    ids = example.vision_token_ids(str(tmp_path / "tokenizer.json"))
    assert ids == {
        "<|vision_start|>": VISION_START,
        "<|image_pad|>": IMAGE_PAD,
        "<|vision_end|>": VISION_END,
    }
    model = example.build_model(
        VOCAB, SEQ_LEN, ids, patch_size=PATCH, temporal_patch_size=TEMPORAL, merge_size=MERGE
    )
    rng = np.random.default_rng(0)
    batch = pack_qwen(qwen_rows(rng), rng)
    # Its config packs exactly (no cache, sdpa): documents alone give the same logits.
    assert_packed_equals_alone(model.eval(), batch, "qwen2_vl", eos_id=EOS)
    model.train()
    text_only = pack_qwen([[qwen_doc(rng, [5]), qwen_doc(rng, [7])]], rng)
    for one in (batch, text_only):
        model.zero_grad(set_to_none=True)
        losses, anchor = example.token_losses(model, one)
        mask = one["labels"][:, 1:] != -100
        (losses[mask].mean() + anchor).backward()
        assert torch.isfinite(losses).all() and float(anchor.detach()) == 0
        grads = [p.grad for p in model.parameters()]
        assert all(g is not None for g in grads)  # DDP needs every weight in every step
    assert float(model.model.visual.patch_embed.proj.weight.grad.abs().sum()) == 0
