"""Per-source loss sums of one batch, from the trainer's per-token loss and `source_ids`.

`token_loss` is either aligned with `labels` (`[batch, seq_len]`: the loss of predicting
`labels[b, t]`) or in the shifted form causal-LM code computes (`[batch, seq_len - 1]`: the
loss of predicting `labels[b, t + 1]`). Positions whose label is -100 (padding, document
boundaries under `mask_document_boundaries`) count for nothing, whatever loss they hold.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mixer.pipeline.packing import IGNORE_INDEX


def _aligned(
    token_loss: torch.Tensor, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, source id) of the positions that count, flattened, on the CPU."""
    labels, sources = batch["labels"], batch["source_ids"]
    if not isinstance(token_loss, torch.Tensor) or token_loss.dim() != 2:
        raise ValueError(
            "report_loss: token_loss must be a 2-D tensor (the loss of each position), got "
            f"{type(token_loss).__name__} {getattr(token_loss, 'shape', '')}"
        )
    rows, cols = labels.shape
    if tuple(token_loss.shape) == (rows, cols - 1):
        labels, sources = labels[:, 1:], sources[:, 1:]
    elif tuple(token_loss.shape) != (rows, cols):
        raise ValueError(
            f"report_loss: token_loss has shape {tuple(token_loss.shape)}; expected "
            f"{(rows, cols)} (aligned with labels) or {(rows, cols - 1)} (shifted)"
        )
    loss = token_loss.detach().to("cpu", torch.float64).reshape(-1)
    labels = labels.to("cpu").reshape(-1)
    sources = sources.to("cpu").reshape(-1)
    keep = (labels != IGNORE_INDEX) & (sources >= 0)
    return loss[keep], sources[keep]


def source_sums(
    token_loss: torch.Tensor, batch: dict[str, torch.Tensor], count: int
) -> list[tuple[float, int]]:
    """(loss sum, tokens) of sources 0..count-1 in this batch."""
    loss, sources = _aligned(token_loss, batch)
    if sources.numel() and int(sources.max()) >= count:
        raise ValueError(f"report_loss: source id {int(sources.max())} of a {count}-source recipe")
    if not bool(torch.isfinite(loss).all()):
        raise ValueError(
            "report_loss: token_loss holds NaN or infinite values at counted positions"
        )
    # (bincount on the CPU: one deterministic order of additions)
    sums = torch.bincount(sources, weights=loss, minlength=count).tolist()
    tokens = torch.bincount(sources, minlength=count).tolist()
    return [(float(s), int(t)) for s, t in zip(sums, tokens)]


def loss_by_source(
    token_loss: torch.Tensor, batch: dict[str, torch.Tensor], names: Sequence[str] | None = None
) -> dict[str | int, tuple[float, int]]:
    """`{source: (loss_sum, tokens)}` of this batch, for sources with counted tokens.

    Keys are the source names when `names` (the recipe's, `loader.recipe.names`) is given,
    else the `source_ids` values."""
    loss, sources = _aligned(token_loss, batch)
    out: dict[str | int, tuple[float, int]] = {}
    if not sources.numel():
        return out
    count = int(sources.max()) + 1 if names is None else len(names)
    sums = torch.bincount(sources, weights=loss, minlength=count).tolist()
    tokens = torch.bincount(sources, minlength=count).tolist()
    for i, (s, t) in enumerate(zip(sums, tokens)):
        if t:
            out[names[i] if names is not None else i] = (float(s), int(t))
    return out
