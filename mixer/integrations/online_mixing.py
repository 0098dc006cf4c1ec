"""Online mixing in the adapters: the per-token loss from a framework's logits, and the
losses a trainer reports after the loader has already fetched the next batch.

- `causal_token_loss(logits, labels)`: transformers' convention (the model shifts: position
  t's logits predict `labels[:, t + 1]`); the loss in the shifted `[B, seq_len - 1]` form.
- `next_token_loss(pred, labels)`: torchtitan's (the labels are shifted already, as
  `titan_batch` makes them); the same shifted `[B, seq_len - 1]` form of the mixer batch.
- `LateReports`: a framework that fetches ahead (Lightning fetches one batch before the step
  that trains the previous one) saves the loader's state from before a fetched batch; the
  losses reported after that state was taken are saved beside it and given back to the
  loader after the resumed run's first fetch, where the uninterrupted run added them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from mixer.core.errors import RecipeError
from mixer.pipeline.packing import IGNORE_INDEX
from mixer.runtime.loader import Loader
from mixer.runtime.loss_sums import source_sums
from mixer.runtime.mixing_state import to_fixed

Sums = list[list[int]]  # per source: [loss sum (fixed point), tokens]


CHUNK_ELEMENTS = 1 << 26  # logits upcast to float32 at a time: 256 MB


def _token_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-position cross-entropy of `logits` `[B, T, V]` against `target` `[B, T]` with no
    gradient, upcast to float32 a chunk of positions at a time (a whole `[B, T, V]` float32
    copy of a large vocabulary's logits would cost gigabytes); -100 targets give 0."""
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    labels = target.to(logits.device).reshape(-1)
    step = max(1, CHUNK_ELEMENTS // max(vocab, 1))
    with torch.no_grad():
        parts = [
            F.cross_entropy(
                flat[i : i + step].float(),
                labels[i : i + step],
                reduction="none",
                ignore_index=IGNORE_INDEX,
            )
            for i in range(0, flat.shape[0], step)
        ]
    return torch.cat(parts).view(target.shape)


def causal_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`[B, L - 1]` cross-entropy of `logits[:, t]` against `labels[:, t + 1]` (no gradient);
    -100 labels give 0 (`report_loss` ignores them)."""
    return _token_cross_entropy(logits[:, :-1], labels[:, 1:])


def next_token_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`[B, L - 1]` cross-entropy of `pred[:, t]` against next-token labels `labels[:, t]`
    (torchtitan's batch; its last column is -100 and is dropped)."""
    return _token_cross_entropy(pred[:, :-1], labels[:, :-1])


def require_online_mixing(loader: Loader, who: str) -> None:
    if loader.recipe.online_mixing is None:
        raise RecipeError(f"{who}: online_mixing=True needs a recipe with an online_mixing block")


class LateReports:
    """The running sums of the losses reported through it, so that the sums reported since
    any state was taken are known (`mark` when taking it, `since(mark)` later)."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self.count = len(loader.recipe.names)
        self.total: Sums = self.zero()
        self.give_back: Sums | None = None  # a resumed run's, added after its first fetch

    @property
    def on(self) -> bool:
        return self.loader.recipe.online_mixing is not None

    def mark(self) -> Sums:
        """The running sums now (taken with a state)."""
        return [list(s) for s in self.total]

    def since(self, mark: Sums) -> Sums:
        """The sums reported since `mark` was taken."""
        return [[t[0] - m[0], t[1] - m[1]] for t, m in zip(self.total, mark)]

    def report(self, token_loss: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
        """`loader.report_loss`, added to the running sums."""
        self.loader.report_loss(token_loss, batch)
        sums = [(to_fixed(s), t) for s, t in source_sums(token_loss, batch, self.count)]
        for slot, (loss, tokens) in zip(self.total, sums):
            slot[0] += loss
            slot[1] += tokens

    def zero(self) -> Sums:
        return [[0, 0] for _ in range(self.count)]

    def fetched(self) -> None:
        """After each fetch: a resumed run gets back the sums its state left out."""
        if self.give_back is not None:
            mixing = self.loader._mixture.mixing  # (the pending sums: no public setter)
            if mixing is not None:
                mixing.add([(loss, tokens) for loss, tokens in self.give_back])
            self.give_back = None


def summed(all_sums: list[Any]) -> Sums:
    """Per-rank sums added up (ranks' lists of [loss, tokens] per source)."""
    out = [[0, 0] for _ in all_sums[0]]
    for sums in all_sums:
        for slot, (loss, tokens) in zip(out, sums):
            slot[0] += int(loss)
            slot[1] += int(tokens)
    return out
