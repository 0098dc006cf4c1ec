"""A vision-language training client: a tiny random Qwen2-VL trained with DDP on mixer's
image+text batches.

    torchrun --standalone --nproc_per_node=2 examples/train_vlm.py \
        --recipe recipes/multimodal_demo.yaml --steps 20 --ckpt-dir out/vlm-ckpt \
        --ckpt-every 10 [--resume] [--num-workers 2]

The recipe's `images:` block must use the qwen2_vl layout; its tokenizer must hold
`<|vision_start|>`, `<|image_pad|>` and `<|vision_end|>`, whose ids the model's config takes.
Batches carry `input_ids`, `labels`, `source_ids`, `mm_token_type_ids` [B, L], `position_ids`
[4, B, L] (row 0: text positions, from which the model builds the block-diagonal mask of the
packed documents; rows 1-3: M-RoPE), `pixel_values` and `image_grid_thw`. The model is called
with no attention mask and no cache: either one would make transformers ignore the packing and
let documents attend to each other. Model, optimizer and data loader go into one
`torch.distributed.checkpoint` every `--ckpt-every` steps; `--resume` continues from the newest
complete one. With `--step-log FILE` every rank appends one JSON line per step.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch.nn.parallel import DistributedDataParallel
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

import mixer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoints  # noqa: E402  (examples/checkpoints.py, beside this script)

VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")


def batch_hash(batch: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(batch):
        h.update(key.encode())
        h.update(batch[key].numpy().tobytes())
    return h.hexdigest()[:16]


def vision_token_ids(tokenizer_file: str) -> dict[str, int]:
    """The tokenizer's ids of the three vision tokens; refuses a tokenizer without them."""
    tok = Tokenizer.from_file(tokenizer_file)
    ids = {name: tok.token_to_id(name) for name in VISION_TOKENS}
    missing = [name for name, i in ids.items() if i is None]
    if missing:
        raise SystemExit(
            f"tokenizer {tokenizer_file} lacks {', '.join(missing)}: the qwen2_vl "
            "layout needs them as special tokens"
        )
    return ids


def build_model(
    vocab_size: int,
    seq_len: int,
    ids: dict[str, int],
    *,
    patch_size: int,
    temporal_patch_size: int,
    merge_size: int,
) -> Qwen2VLForConditionalGeneration:
    """A tiny random Qwen2-VL whose image tokens are the tokenizer's and whose vision tower
    takes the recipe's patches."""
    torch.manual_seed(0)  # identical init on every rank (DDP also broadcasts rank 0's)
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=max(seq_len, 64),
            use_cache=False,
            bos_token_id=None,
            eos_token_id=None,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3],
            },
        ),  # head_dim 16
        vision_config=dict(
            depth=1,
            embed_dim=32,
            hidden_size=64,
            num_heads=2,
            mlp_ratio=2,
            patch_size=patch_size,
            temporal_patch_size=temporal_patch_size,
            spatial_merge_size=merge_size,
        ),
        image_token_id=ids["<|image_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        video_token_id=vocab_size,
    )  # no video
    return Qwen2VLForConditionalGeneration._from_config(
        config, attn_implementation="sdpa", dtype=torch.float32
    )


def _vision_anchor(model: Qwen2VLForConditionalGeneration) -> torch.Tensor:
    """Zero that depends on every vision weight: a batch without images still gives them a
    (zero) gradient, so DDP's all-reduce sees the same parameters on every rank."""
    visual = model.model.visual
    merge, patch = visual.spatial_merge_size, visual.config.patch_size
    width = 3 * visual.config.temporal_patch_size * patch * patch
    pixels = torch.zeros(merge * merge, width)
    grid = torch.tensor([[1, merge, merge]])
    return 0.0 * visual(pixels, grid_thw=grid).pooler_output.sum()


def token_losses(
    model: torch.nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss of predicting labels[:, 1:] (0 where the label is -100), and a zero
    tied to the vision weights when the batch has no image (else a plain zero)."""
    inputs = {
        "input_ids": batch["input_ids"],
        "position_ids": batch["position_ids"],
        "mm_token_type_ids": batch["mm_token_type_ids"],
    }
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    if batch["image_grid_thw"].shape[0]:
        inputs["pixel_values"] = batch["pixel_values"]
        inputs["image_grid_thw"] = batch["image_grid_thw"]
        anchor = torch.zeros(())
    else:
        anchor = _vision_anchor(inner)
    # No attention_mask and no cache: the packed mask comes from position_ids[0].
    logits = model(**inputs, use_cache=False).logits[:, :-1].float()
    labels = batch["labels"][:, 1:]
    losses = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100, reduction="none"
    ).view_as(labels)
    return losses, anchor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--steps", type=int, default=20, help="stop after this global step")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--ckpt-dir", default="out/vlm-ckpt")
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--step-log", help="append per-step JSON lines here (one file per rank)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--crash-at-step",
        type=int,
        default=-1,
        help="(testing) rank 0 kills itself with SIGKILL at this step",
    )
    args = parser.parse_args()

    recipe = mixer.load_recipe(args.recipe)
    if recipe.images is None or recipe.images.layout != "qwen2_vl":
        raise SystemExit(
            f"{args.recipe}: train_vlm.py needs an `images:` block with layout: qwen2_vl"
        )
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = mixer.build_loader(recipe, num_workers=args.num_workers)  # rank/world from dist
    ids = vision_token_ids(loader.tokenizer.path)
    vocab = max(loader.tokenizer.vocab_size, *ids.values()) + 1
    images = recipe.images
    model = DistributedDataParallel(
        build_model(
            vocab,
            recipe.seq_len,
            ids,
            patch_size=images.patch_size,
            temporal_patch_size=images.temporal_patch_size,
            merge_size=images.merge_size,
        )
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    names = [s.name for s in recipe.sources]

    step = 0
    ckpt_dir = Path(args.ckpt_dir)
    if args.resume:
        step, found = checkpoints.load_latest(ckpt_dir, model, optimizer, loader)
        if found is not None and rank == 0:
            print(f"resumed from {found} at step {step} on {world} rank(s)", flush=True)

    log = open(f"{args.step_log}.rank{rank}", "a") if args.step_log else None
    start = time.perf_counter()
    first_global = loader.next_global_batch
    with loader:
        for i, batch in enumerate(loader):
            if step >= args.steps:
                break
            if step == args.crash_at_step and rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            padding = mixer.is_padding_batch(batch)  # an exhausted rank's placeholder
            mask = batch["labels"][:, 1:] != -100
            count = mask.sum().to(torch.float64)
            total = count.clone()
            dist.all_reduce(total)  # the same decision on every rank, so DDP never waits
            per_source, mean = {}, None
            if total > 0:  # skipped only when every rank's batch is padding
                losses, anchor = token_losses(model, batch)
                # Weighted by tokens across ranks: a padding batch adds 0, never NaN.
                loss = losses[mask].sum() * world / total + anchor
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses = losses.detach()
                if not padding and count > 0:
                    mean = round(float(losses[mask].mean()), 4)
                    target_sources = batch["source_ids"][:, 1:]
                    for index, name in enumerate(names):
                        chosen = mask & (target_sources == index)
                        if chosen.any():
                            per_source[name] = round(float(losses[chosen].mean()), 4)
            step += 1
            record = {
                "step": step,
                "rank": rank,
                "global": first_global + i * world,
                "hash": batch_hash(batch),
                "tokens": int(count),
                "padding": padding,
                "images": int(batch["image_grid_thw"].shape[0]),
                "loss": mean,
                "per_source": per_source,
            }
            if log:
                log.write(json.dumps(record) + "\n")
                log.flush()
            if rank == 0 and (step % 10 == 0 or step == args.steps):
                print(f"step {step} loss {record['loss']} per source {per_source}", flush=True)
            if args.ckpt_every and step % args.ckpt_every == 0:
                checkpoints.save(ckpt_dir, step, model, optimizer, loader)
    if rank == 0:
        print(f"done: {step} steps in {time.perf_counter() - start:.1f}s", flush=True)
    if log:
        log.close()
    # DDP's reducer holds the process group and sits in a reference cycle: left to the final
    # garbage collection, the group is destroyed during interpreter shutdown with gloo's
    # threads still running, which now and then aborts the process ("terminate called
    # without an active exception", pytorch/pytorch#179291). Free it while Python is whole.
    del model, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
