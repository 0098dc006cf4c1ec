"""A real training client: a small causal LM trained with DDP under torchrun on mixer batches.

    torchrun --standalone --nproc_per_node=2 examples/train.py --recipe recipes/train_demo.yaml \
        --steps 40 --ckpt-dir out/ckpt --ckpt-every 10 [--resume] [--num-workers 2]

Model, optimizer and data loader go into one `torch.distributed.checkpoint` every
`--ckpt-every` steps; `--resume` continues from the newest complete checkpoint, on any number of
ranks and workers that the recipe's lanes allow. With `--step-log FILE` every rank appends one JSON
line per step: step, rank, global batch index, batch hash, loss and loss per source.

`--metrics-out FILE` (rank 0) appends `{"step", **loader.metrics(all_ranks=True), "loss",
"loss_by_source"}` every `--metrics-every` steps: the log `mixer report` plots.

`--online-mixing` reweights the sources from the training loss every `--mix-every` steps: an
exponentiated-gradient step on the per-source losses (summed over ranks from `source_ids`),
w ← w · exp(η · loss), normalized and smoothed towards uniform, handed to
`loader.set_weights` (a collective: every rank computes the same weights from the same
all-reduced losses). The loader records it in its state, so a resume reproduces the stream.
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
from torch.nn.parallel import DistributedDataParallel
from transformers import LlamaConfig, LlamaForCausalLM

import mixer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoints  # noqa: E402  (examples/checkpoints.py, beside this script)


def batch_hash(batch: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in mixer.BATCH_KEYS:
        h.update(batch[key].numpy().tobytes())
    return h.hexdigest()[:16]


def build_model(vocab_size: int, seq_len: int) -> torch.nn.Module:
    torch.manual_seed(0)  # identical init on every rank (DDP also broadcasts rank 0's)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max(seq_len, 64),
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def token_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-token loss of predicting labels[:, 1:] (0 where the label is -100)."""
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    logits = logits[:, :-1].float()
    labels = batch["labels"][:, 1:]
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100, reduction="none"
    ).view_as(labels)


class OnlineMixing:
    """Per-source losses summed over ranks, and an exponentiated-gradient weight update."""

    def __init__(self, names: list[str], lr: float, smoothing: float) -> None:
        self.names = names
        self.lr = lr
        self.smoothing = smoothing
        self.weights = torch.full((len(names),), 1 / len(names), dtype=torch.float64)
        self.sums = torch.zeros(len(names), dtype=torch.float64)
        self.counts = torch.zeros(len(names), dtype=torch.float64)

    def tensors(self) -> dict[str, torch.Tensor]:
        """What a checkpoint must hold so a resumed run makes the same updates (the losses
        gathered since the last update); loaded in place."""
        return {"weights": self.weights, "loss_sums": self.sums, "loss_counts": self.counts}

    def accumulate(
        self, losses: torch.Tensor, mask: torch.Tensor, sources: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add this step's per-source loss sums and token counts (all ranks); returns this
        step's all-reduced (sums, counts)."""
        sums = torch.zeros(len(self.names), dtype=torch.float64)
        counts = torch.zeros(len(self.names), dtype=torch.float64)
        for index in range(len(self.names)):
            chosen = mask & (sources == index)
            sums[index] = losses[chosen].double().sum()
            counts[index] = chosen.sum()
        both = torch.cat([sums, counts])
        dist.all_reduce(both)
        sums, counts = both[: len(self.names)], both[len(self.names) :]
        self.sums += sums
        self.counts += counts
        return sums, counts

    def mean_losses(self, sums: torch.Tensor, counts: torch.Tensor) -> dict[str, float]:
        return {n: round(float(s / c), 4) for n, s, c in zip(self.names, sums, counts) if c > 0}

    def update(self) -> dict[str, float]:
        """w ← w · exp(lr · mean loss) over the sources seen since the last update,
        normalized, then smoothed towards uniform (so no source starves)."""
        seen = self.counts > 0
        mean = torch.where(seen, self.sums / self.counts.clamp(min=1), torch.zeros(1).double())
        logits = torch.log(self.weights) + self.lr * mean
        logits[~seen] = torch.log(self.weights)[~seen]
        new = torch.softmax(logits, 0)
        self.weights.copy_((1 - self.smoothing) * new + self.smoothing / len(self.names))
        self.sums.zero_()
        self.counts.zero_()
        return {n: float(w) for n, w in zip(self.names, self.weights)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--steps", type=int, default=40, help="stop after this global step")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--ckpt-dir", default="out/ckpt")
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--step-log", help="append per-step JSON lines here (one file per rank)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--metrics-out", help="(rank 0) append loader metrics JSON lines here")
    parser.add_argument("--metrics-every", type=int, default=1)
    parser.add_argument(
        "--online-mixing",
        action="store_true",
        help="reweight sources from per-source losses (exponentiated gradient)",
    )
    parser.add_argument("--mix-every", type=int, default=10)
    parser.add_argument("--mix-lr", type=float, default=1.0, help="η of the weight update")
    parser.add_argument(
        "--mix-smoothing",
        type=float,
        default=0.1,
        help="share of uniform weight mixed into every update",
    )
    parser.add_argument(
        "--crash-at-step",
        type=int,
        default=-1,
        help="(testing) rank 0 kills itself with SIGKILL at this step",
    )
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    recipe = mixer.load_recipe(args.recipe)
    loader = mixer.build_loader(recipe, num_workers=args.num_workers)  # rank/world from dist
    vocab = loader.tokenizer.vocab_size
    model = DistributedDataParallel(build_model(vocab, recipe.seq_len))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    names = [s.name for s in recipe.sources]

    step = 0
    ckpt_dir = Path(args.ckpt_dir)
    mixing = OnlineMixing(names, args.mix_lr, args.mix_smoothing)
    extra = mixing.tensors() if args.online_mixing else None
    if args.resume:
        step, found = checkpoints.load_latest(ckpt_dir, model, optimizer, loader, extra)
        if found is not None and rank == 0:
            print(f"resumed from {found} at step {step} on {world} rank(s)", flush=True)

    log = open(f"{args.step_log}.rank{rank}", "a") if args.step_log else None
    metrics_log = open(args.metrics_out, "a") if args.metrics_out and rank == 0 else None
    start = time.perf_counter()
    first_global = loader.next_global_batch
    with loader:
        for i, batch in enumerate(loader):
            if step >= args.steps:
                break
            if step == args.crash_at_step and rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            losses = token_losses(model, batch)
            mask = batch["labels"][:, 1:] != -100
            # Weight by tokens across ranks: an all-padding batch contributes 0, never NaN.
            count = mask.sum().to(torch.float64)
            total = count.clone()
            dist.all_reduce(total)
            loss = losses[mask].sum() * world / total.clamp(min=1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # every rank runs backward, so DDP's all-reduce never waits
            if total > 0:
                optimizer.step()
            step += 1
            losses = losses.detach()
            per_source = {}
            target_sources = batch["source_ids"][:, 1:]
            for index, name in enumerate(names):
                chosen = mask & (target_sources == index)
                if chosen.any():
                    per_source[name] = round(float(losses[chosen].mean()), 4)
            record = {
                "step": step,
                "rank": rank,
                "global": first_global + i * world,
                "hash": batch_hash(batch),
                "tokens": int(count),
                "loss": round(float(losses[mask].mean()), 4) if count else None,
                "per_source": per_source,
            }
            if log:
                log.write(json.dumps(record) + "\n")
                log.flush()
            sums, counts = mixing.accumulate(losses, mask, target_sources)
            if args.metrics_out and step % args.metrics_every == 0:
                metrics = loader.metrics(all_ranks=True)  # a collective: every rank calls it
                if metrics_log:
                    line = {
                        "step": step,
                        **metrics,
                        "loss": record["loss"],
                        "loss_by_source": mixing.mean_losses(sums, counts),
                    }
                    metrics_log.write(json.dumps(line) + "\n")
                    metrics_log.flush()
            if args.online_mixing and step % args.mix_every == 0:
                weights = mixing.update()
                loader.set_weights(weights)  # same weights, same step, on every rank
                if rank == 0:
                    shown = {n: round(w, 3) for n, w in weights.items()}
                    print(f"step {step} weights {shown}", flush=True)
            if rank == 0 and (step % 10 == 0 or step == args.steps):
                print(f"step {step} loss {record['loss']} per source {per_source}", flush=True)
            if args.ckpt_every and step % args.ckpt_every == 0:
                checkpoints.save(ckpt_dir, step, model, optimizer, loader, extra)
    if rank == 0:
        print(f"done: {step} steps in {time.perf_counter() - start:.1f}s", flush=True)
    if log:
        log.close()
    if metrics_log:
        metrics_log.close()
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
