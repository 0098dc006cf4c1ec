"""Tiny random-weight vision-language models, and the oracle that packed rows train like
documents alone.

`assert_packed_equals_alone` knows nothing of how a batch was made: it reads the units of each
row from `position_ids` (row 0 for qwen2_vl) and `source_ids`, hands each unit's images (and
videos) to it by counting placeholders in order, and compares the packed batch's logits with
those of each unit run alone, the model computing that unit's positions itself (Qwen2-VL's and
Qwen2.5-VL's own `get_rope_index`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import (
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)

QWEN_LAYOUTS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")

# Weights wider than transformers' default (std 0.02) so that attention is far from uniform
# and a wrong position or a leaked token moves the logits by much more than the tolerance.
INIT_STD = 0.3


def _finish(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim >= 2:  # matrices and convolutions; norms keep their ones and zeros
                param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)
            elif name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return model.eval()


def tiny_qwen2_vl(
    vocab_size: int,
    image_pad_id: int,
    vision_start_id: int,
    vision_end_id: int,
    *,
    hidden_size: int = 32,
    num_layers: int = 1,
    num_heads: int = 2,
    patch_size: int = 14,
    temporal_patch_size: int = 2,
    spatial_merge_size: int = 2,
    seed: int = 0,
    video_pad_id: int | None = None,
    tokens_per_second: int | None = None,
) -> Qwen2VLForConditionalGeneration:
    """A random float32 Qwen2-VL (sdpa, no cache) whose vision tower has depth 1; with
    `tokens_per_second`, a Qwen2.5-VL (window attention over a window of one merge unit)."""
    head_dim = hidden_size // num_heads
    if head_dim % 8:
        raise ValueError("hidden_size // num_heads must be a multiple of 8 (M-RoPE sections)")
    half = head_dim // 2
    section = [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]  # 16:24:24 like 7B
    torch.manual_seed(seed)
    vision = dict(
        depth=1,
        embed_dim=hidden_size,
        hidden_size=hidden_size,
        num_heads=num_heads,
        mlp_ratio=2,
        patch_size=patch_size,
        temporal_patch_size=temporal_patch_size,
        spatial_merge_size=spatial_merge_size,
    )
    kind, model_class = Qwen2VLConfig, Qwen2VLForConditionalGeneration
    if tokens_per_second is not None:
        vision = {k: v for k, v in vision.items() if k not in ("embed_dim", "mlp_ratio")}
        vision.update(
            intermediate_size=2 * hidden_size,
            out_hidden_size=hidden_size,
            tokens_per_second=tokens_per_second,
            fullatt_block_indexes=[0],
            window_size=patch_size * spatial_merge_size,
        )
        kind, model_class = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    config = kind(
        text_config=dict(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_heads,
            max_position_embeddings=1 << 16,
            use_cache=False,
            bos_token_id=None,
            eos_token_id=None,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": section,
            },
        ),
        vision_config=vision,
        image_token_id=image_pad_id,
        vision_start_token_id=vision_start_id,
        vision_end_token_id=vision_end_id,
        video_token_id=vocab_size + 1 if video_pad_id is None else video_pad_id,
    )
    model = model_class._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    return _finish(model, seed)


def tiny_qwen3_vl(
    vocab_size: int,
    image_pad_id: int,
    vision_start_id: int,
    vision_end_id: int,
    video_pad_id: int,
    *,
    hidden_size: int = 32,
    num_layers: int = 1,
    num_heads: int = 2,
    patch_size: int = 16,
    temporal_patch_size: int = 2,
    spatial_merge_size: int = 2,
    seed: int = 0,
):
    """A random float32 Qwen3-VL (sdpa, no cache): a vision tower of depth 1 with one deepstack
    layer, interleaved M-RoPE over a Qwen3 of `num_layers`."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    head_dim = hidden_size // num_heads
    if head_dim % 8:
        raise ValueError("hidden_size // num_heads must be a multiple of 8 (M-RoPE sections)")
    half = head_dim // 2
    section = [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]
    torch.manual_seed(seed)
    config = Qwen3VLConfig(
        text_config=dict(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_heads,
            head_dim=head_dim,
            max_position_embeddings=1 << 16,
            use_cache=False,
            bos_token_id=None,
            eos_token_id=None,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": section,
                "mrope_interleaved": True,
            },
        ),
        vision_config=dict(
            depth=1,
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_heads=num_heads,
            patch_size=patch_size,
            temporal_patch_size=temporal_patch_size,
            spatial_merge_size=spatial_merge_size,
            out_hidden_size=hidden_size,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        ),
        image_token_id=image_pad_id,
        video_token_id=video_pad_id,
        vision_start_token_id=vision_start_id,
        vision_end_token_id=vision_end_id,
    )
    model = Qwen3VLForConditionalGeneration._from_config(
        config, attn_implementation="sdpa", dtype=torch.float32
    )
    return _finish(model, seed)


def tiny_llava(
    vocab_size: int,
    image_token_id: int,
    image_size: int,
    patch_size: int,
    *,
    hidden_size: int = 32,
    num_layers: int = 1,
    num_heads: int = 2,
    seed: int = 0,
) -> LlavaForConditionalGeneration:
    """A random float32 LLaVA (CLIP tower of 2 layers, Llama of `num_layers`; sdpa, no cache).

    LLaVA's defaults: features of the vision tower's second-to-last layer, CLS dropped, so an
    image stands for (image_size / patch_size)² `image_token_id` tokens.
    """
    torch.manual_seed(seed)
    vision = CLIPVisionConfig(
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=num_heads,
        image_size=image_size,
        patch_size=patch_size,
        projection_dim=hidden_size,
    )
    text = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=1 << 16,
        use_cache=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=image_token_id,
        image_seq_length=(image_size // patch_size) ** 2,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
    )
    model = LlavaForConditionalGeneration._from_config(
        config, attn_implementation="sdpa", dtype=torch.float32
    )
    return _finish(model, seed)


@dataclass
class Unit:
    """A 0-start run of real tokens in one row, and the images its placeholders stand for."""

    row: int
    start: int
    end: int
    images: list[int]  # indices into the batch's images, in placeholder order
    videos: list[int] = field(default_factory=list)  # the same for its videos


def _units(batch: dict[str, torch.Tensor], layout: str) -> list[Unit]:
    positions = batch["position_ids"]
    text_positions = positions[0] if layout in QWEN_LAYOUTS else positions
    units = []
    for row, (reals, starts) in enumerate(
        zip((batch["source_ids"] >= 0).tolist(), (text_positions == 0).tolist())
    ):
        start = None
        for index, (is_real, at_zero) in enumerate(zip(reals, starts)):
            begins = is_real and (start is None or at_zero)
            if start is not None and (begins or not is_real):
                units.append(Unit(row, start, index, []))
                start = None
            if begins:
                start = index
        if start is not None:
            units.append(Unit(row, start, len(reals), []))
    return units


def _assign_images(
    units: list[Unit], batch: dict[str, torch.Tensor], model, layout: str, kind: str = "image"
) -> int:
    """Hand each unit its images (or videos) by counting placeholders in order; returns how
    many."""
    ids = batch["input_ids"]
    owners: list[int] | None = None  # qwen3_vl videos: the video of each run of pads
    if layout in QWEN_LAYOUTS:
        grids = batch[f"{kind}_grid_thw"].tolist() if f"{kind}_grid_thw" in batch else []
        merge = model.config.vision_config.spatial_merge_size
        pad = getattr(model.config, f"{kind}_token_id")
        sizes = [t * h * w // merge**2 for t, h, w in grids]
        if layout == "qwen3_vl" and kind == "video":  # one run per temporal patch
            owners = [i for i, (t, _, _) in enumerate(grids) for _ in range(t)]
            sizes = [h * w // merge**2 for t, h, w in grids for _ in range(t)]
    else:
        vision = model.config.vision_config
        pad = model.config.image_token_id
        sizes = [(vision.image_size // vision.patch_size) ** 2] * batch["pixel_values"].shape[0]
    image = 0
    for unit in units:
        is_pad = (ids[unit.row, unit.start : unit.end] == pad).tolist()
        index = 0
        while index < len(is_pad):
            if not is_pad[index]:
                index += 1
                continue
            assert image < len(sizes), (
                f"row {unit.row}: more {kind} placeholders than {kind}s ({len(sizes)}) in the batch"
            )
            count = sizes[image]
            if layout in QWEN_LAYOUTS:  # one run of pads is one image (llava's may touch)
                count = (
                    next((i for i in range(index, len(is_pad)) if not is_pad[i]), len(is_pad))
                    - index
                )
            assert count == sizes[image] and all(is_pad[index : index + count]), (
                f"row {unit.row}, token {unit.start + index}: {kind} {image} needs "
                f"{sizes[image]} placeholders inside one unit"
            )
            found = unit.videos if kind == "video" else unit.images
            medium = image if owners is None else owners[image]
            if medium not in found:
                found.append(medium)
            image += 1
            index += count
    assert image == len(sizes), f"{len(sizes)} {kind}s in the batch, {image} placeholder groups"
    return image if owners is None else len(set(owners))


def _offsets(grids: torch.Tensor) -> list[int]:
    offsets = [0]
    for t, h, w in grids.tolist():
        offsets.append(offsets[-1] + t * h * w)
    return offsets


def _inputs(
    batch: dict[str, torch.Tensor], layout: str, unit: Unit, offsets: dict[str, list[int]]
) -> dict[str, torch.Tensor]:
    """The model inputs of a unit's tokens, run alone (positions left to the model), with
    its images and videos."""
    inputs = {"input_ids": batch["input_ids"][unit.row : unit.row + 1, unit.start : unit.end]}
    if unit.images and layout in QWEN_LAYOUTS:
        at = offsets["image"]
        inputs["pixel_values"] = torch.cat(
            [batch["pixel_values"][at[i] : at[i + 1]] for i in unit.images]
        )
        inputs["image_grid_thw"] = batch["image_grid_thw"][unit.images]
    elif unit.images:
        inputs["pixel_values"] = batch["pixel_values"][unit.images]
    if unit.videos:
        at = offsets["video"]
        inputs["pixel_values_videos"] = torch.cat(
            [batch["pixel_values_videos"][at[i] : at[i + 1]] for i in unit.videos]
        )
        inputs["video_grid_thw"] = batch["video_grid_thw"][unit.videos]
        if "second_per_grid_ts" in batch:
            inputs["second_per_grid_ts"] = batch["second_per_grid_ts"][unit.videos]
    return inputs


def _token_types(model, input_ids: torch.Tensor) -> torch.Tensor:
    """transformers' mm_token_type_ids: 1 on image pads, 2 on video pads, 0 elsewhere."""
    return (input_ids == model.config.image_token_id).long() + 2 * (
        input_ids == model.config.video_token_id
    ).long()


def _forward(model, layout: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    if layout in QWEN_LAYOUTS:
        # The model needs mm_token_type_ids to compute M-RoPE itself.
        inputs = dict(inputs)
        inputs.setdefault("mm_token_type_ids", _token_types(model, inputs["input_ids"]))
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits


def _packed_inputs(
    batch: dict[str, torch.Tensor], layout: str, n_images: int, n_videos: int
) -> dict[str, torch.Tensor]:
    keys = ["input_ids", "position_ids"]
    if layout in QWEN_LAYOUTS:
        keys.append("mm_token_type_ids")
    if n_images:
        keys += ["pixel_values", "image_grid_thw"] if layout in QWEN_LAYOUTS else ["pixel_values"]
    if n_videos:
        keys += ["pixel_values_videos", "video_grid_thw", "second_per_grid_ts"]
    return {key: batch[key] for key in keys if key in batch}


def assert_packed_equals_alone(
    model,
    batch: dict[str, torch.Tensor],
    layout: str,
    atol: float = 1e-4,
    *,
    check_positions: bool = True,
    eos_id: int | None = None,
    require_coverage: bool = True,
) -> dict[str, int]:
    """Every document of a packed batch has the logits it has when run alone (≤ atol).

    A unit is a run of real tokens (`source_ids >= 0`) starting where the text positions
    (`position_ids`, row 0 of qwen2_vl's four) are 0: a document, or the piece of one that
    continues at a row start. The batch runs once as given (no attention mask: the model derives
    the block-diagonal mask from the positions); each unit then runs alone with its images and
    positions computed by the model itself. With `check_positions` the batch's positions of each
    unit must also equal, exactly, those the model computes for it alone (row 0: 0, 1, ...;
    qwen2_vl rows 1-3: `get_rope_index`): a constant shift of M-RoPE rows within a document
    leaves the logits equal (RoPE is relative), so only this check sees it. With `eos_id`, no
    unit may hold that token before its last position (two documents merged into one unit).
    Unless `require_coverage` is False, at least one compared unit has images and one row holds
    two or more units, so the check cannot pass vacuously. Returns the counts it saw.
    """
    if layout not in (*QWEN_LAYOUTS, "llava"):
        raise ValueError(f"unknown layout {layout!r}")
    rows, length = batch["input_ids"].shape
    want = (4, rows, length) if layout in QWEN_LAYOUTS else (rows, length)
    assert tuple(batch["position_ids"].shape) == want, (
        f"position_ids has shape {tuple(batch['position_ids'].shape)}, {layout} needs {want}"
    )
    units = _units(batch, layout)
    n_images = _assign_images(units, batch, model, layout)
    n_videos = _assign_images(units, batch, model, layout, "video") if layout != "llava" else 0
    offsets: dict[str, list[int]] = {}
    for kind, pixels in (("image", "pixel_values"), ("video", "pixel_values_videos")):
        if layout in QWEN_LAYOUTS and f"{kind}_grid_thw" in batch:
            offsets[kind] = _offsets(batch[f"{kind}_grid_thw"])
            assert offsets[kind][-1] == batch[pixels].shape[0], (
                f"{pixels} has {batch[pixels].shape[0]} rows, the grids need {offsets[kind][-1]}"
            )
    packed = _forward(model, layout, _packed_inputs(batch, layout, n_images, n_videos))
    for unit in units:
        where = f"row {unit.row}, tokens {unit.start}:{unit.end}"
        ids = batch["input_ids"][unit.row, unit.start : unit.end]
        if eos_id is not None:
            assert not bool((ids[:-1] == eos_id).any()), (
                f"{where}: an EOS inside the unit (a document does not restart its positions)"
            )
        inputs = _inputs(batch, layout, unit, offsets)
        if check_positions:
            _check_positions(model, batch, layout, unit, inputs, where)
        alone = _forward(model, layout, inputs)[0]
        diff = (packed[unit.row, unit.start : unit.end] - alone).abs().max().item()
        assert diff <= atol, (
            f"{where} (images {unit.images}, videos {unit.videos}): packed "
            f"logits differ from the unit alone by {diff:.3g} > {atol}"
        )
    units_per_row = [sum(u.row == row for u in units) for row in range(batch["input_ids"].shape[0])]
    seen = {
        "units": len(units),
        "units_with_images": sum(bool(u.images) for u in units),
        "images": n_images,
        "packed_rows": sum(n >= 2 for n in units_per_row),
    }
    if "video_grid_thw" in batch:
        seen.update(units_with_videos=sum(bool(u.videos) for u in units), videos=n_videos)
    if require_coverage:
        assert seen["units_with_images"] + seen.get("units_with_videos", 0) >= 1, (
            f"no unit with images or videos was compared: {seen}"
        )
        assert seen["packed_rows"] >= 1, f"no row holds two or more documents: {seen}"
    return seen


def _check_positions(model, batch, layout: str, unit: Unit, inputs, where: str) -> None:
    positions = batch["position_ids"]
    length = unit.end - unit.start
    text = torch.arange(length)
    if layout == "llava":
        got = positions[unit.row, unit.start : unit.end]
        assert torch.equal(got, text), f"{where}: positions {got.tolist()} are not 0, 1, ..."
        return
    got = positions[:, unit.row, unit.start : unit.end]
    assert torch.equal(got[0], text), f"{where}: text positions {got[0].tolist()}"
    mm = _token_types(model, inputs["input_ids"])
    if "mm_token_type_ids" in batch:
        assert torch.equal(batch["mm_token_type_ids"][unit.row, unit.start : unit.end], mm[0]), (
            f"{where}: mm_token_type_ids is not 1 exactly on <|image_pad|> and 2 on <|video_pad|>"
        )
    if "image_grid_thw" in inputs or "video_grid_thw" in inputs:
        extra = {
            k: inputs[k]
            for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")
            if k in inputs
        }
        want, _ = model.model.get_rope_index(inputs["input_ids"], mm, **extra)
        want = want[:, 0]
    else:  # text alone: the model's positions are 0, 1, ... in all three rows
        want = text.expand(3, -1)
    assert torch.equal(got[1:], want), (
        f"{where}: M-RoPE rows differ from the model's get_rope_index of the unit alone:\n"
        f"got  {got[1:].tolist()}\nwant {want.tolist()}"
    )


def tiny_qwen2_audio(
    vocab_size: int,
    audio_token_id: int,
    *,
    hidden_size: int = 32,
    num_layers: int = 1,
    num_heads: int = 2,
    seed: int = 0,
):
    """A random float32 Qwen2-Audio (sdpa, no cache): an audio encoder of one layer over the
    128 mel bins (1500 positions, as the 30 s features need) and a Qwen2 of `num_layers`."""
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration

    torch.manual_seed(seed)
    config = Qwen2AudioConfig(
        audio_config=dict(
            num_mel_bins=128,
            encoder_layers=1,
            encoder_attention_heads=num_heads,
            encoder_ffn_dim=2 * hidden_size,
            d_model=hidden_size,
            max_source_positions=1500,
        ),
        text_config=dict(
            model_type="qwen2",
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_heads,
            max_position_embeddings=1 << 16,
            use_cache=False,
            bos_token_id=None,
            eos_token_id=None,
        ),
        audio_token_index=audio_token_id,
    )
    model = Qwen2AudioForConditionalGeneration._from_config(
        config, attn_implementation="sdpa", dtype=torch.float32
    )
    return _finish(model, seed)
