"""Shared by test_online_mixing.py and its torchrun driver: a small three-source recipe whose
third source is the hardest, and a synthetic per-token loss that depends on the batch only."""

from __future__ import annotations

from pathlib import Path

import torch
from helpers import batch_digest, corpus, make_tokenizer, write_docs

NAMES = ("easy", "mid", "hard")
EVERY = 4


def make_data(root: Path) -> dict:
    tok = make_tokenizer(root / "tok.json")
    for i, name in enumerate(NAMES):
        docs = corpus(1000 * i, 240, max_len=30, seed=i)
        for part in range(2):
            write_docs(root / name / f"{part}.jsonl", docs[part::2], "jsonl")
    return {
        "seed": 7,
        "tokenizer": str(tok),
        "seq_len": 16,
        "batch_size": 4,
        "lanes": 4,
        "split_bytes": 2000,
        "shuffle_window": 32,
        "sources": [
            {"name": n, "path": str(root / n / "*.jsonl"), "weight": w}
            for n, w in zip(NAMES, (1.0, 1.0, 2.0))
        ],
        "online_mixing": {"algorithm": "odm", "every": EVERY},
    }


def fake_loss(batch: dict, shifted: bool = True) -> torch.Tensor:
    """Per-token loss of a batch: larger for later sources, varied by the token; the shifted
    `[B, L-1]` form (or the aligned `[B, L]` one). 1e9 at ignored positions: it must not count."""
    ids, src, labels = batch["input_ids"], batch["source_ids"], batch["labels"]
    if shifted:
        ids, src, labels = ids[:, 1:], src[:, 1:], labels[:, 1:]
    loss = (src.clamp(min=0) + 1).double() * (1 + (ids % 5).double() / 10)
    return torch.where(labels == -100, torch.full_like(loss, 1e9), loss).float()


def train(loader, steps: int, it=None) -> tuple[list[str], list[dict]]:
    """`steps` batches with their losses reported: (digests, mixing metrics after each)."""
    it = iter(loader) if it is None else it
    digests, mixes = [], []
    for _ in range(steps):
        batch = next(it)
        loader.report_loss(fake_loss(batch), batch)
        digests.append(batch_digest(batch))
        mixes.append(loader.metrics()["mixing"])
    return digests, mixes
