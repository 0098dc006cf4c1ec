"""Shared by tests/test_integrations.py and its job scripts: the recipe, the tiny model, digests.

A job appends one line per batch its model's forward saw, `{"rank", "i", "hash"}`, to
`<prefix>.rank<r>`; `digest` hashes what the model receives (input_ids, labels, position_ids).
A job may kill itself (SIGKILL, every rank) once its model has seen a given number of batches.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "data" / "tokenizer.json"
VOCAB = 8192
MODEL_KEYS = ("input_ids", "labels", "position_ids")


def recipe_dict() -> dict:
    sample = ROOT / "data" / "sample"
    return {
        "seed": 5,
        "tokenizer": str(TOKENIZER),
        "seq_len": 32,
        "batch_size": 2,
        "lanes": 4,
        "shuffle_window": 16,
        "sources": [
            {"name": "prose", "path": str(sample / "prose" / "*.jsonl.zst"), "weight": 0.6},
            {"name": "changelog", "path": str(sample / "changelog" / "*.jsonl"), "weight": 0.4},
        ],
    }


def digest(batch: dict) -> str:
    h = hashlib.sha256()
    for key in MODEL_KEYS:
        h.update(batch[key].detach().cpu().to(torch.int64).numpy().tobytes())
    return h.hexdigest()[:16]


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def say(line: str) -> None:
    """Print `line` in one write: the lines of several ranks sharing one pipe never interleave
    (`print` writes the text and the newline apart)."""
    os.write(1, (line + "\n").encode())


class DigestLog:
    """Appends a digest line per batch to `<prefix>.rank<rank>`; with `kill_after=n` the
    process SIGKILLs itself once it has logged its n-th batch (before computing on it)."""

    def __init__(self, prefix: str | Path, rank: int, kill_after: int | None = None) -> None:
        self.path = Path(f"{prefix}.rank{rank}")
        self.rank, self.count, self.kill_after = rank, 0, kill_after

    def __call__(self, batch: dict) -> None:
        with self.path.open("a") as out:
            out.write(
                json.dumps({"rank": self.rank, "i": self.count, "hash": digest(batch)}) + "\n"
            )
        self.count += 1
        if self.count == self.kill_after:
            say(f"KILLING rank {self.rank} after {self.count} batches")
            os.kill(os.getpid(), signal.SIGKILL)

    def hook(self, module, args, kwargs):  # a forward pre-hook (with_kwargs=True)
        if "labels" in kwargs:  # a padding batch's forward (no labels) is not a batch seen
            self({k: kwargs[k] for k in MODEL_KEYS})


def read_digests(prefix: Path, rank: int) -> list[str]:
    path = Path(f"{prefix}.rank{rank}")
    return [json.loads(line)["hash"] for line in path.read_text().splitlines()]


def titan_view(inputs: dict, labels) -> dict:
    """A torchtitan batch (`({"input", "positions"}, labels)`) under the keys `digest` reads."""
    return {"input_ids": inputs["input"], "labels": labels, "position_ids": inputs["positions"]}
