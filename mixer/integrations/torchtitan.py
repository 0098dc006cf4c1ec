"""`MixerDataLoader`: a torchtitan `BaseDataLoader` over a mixer loader, resumable on any DP degree.

torchtitan's `ParallelAwareDataloader` checkpoints one pickle per DP rank and refuses a resume
on another DP degree. `MixerDataLoader.state_dict()` is mixer's merged (global) state instead:
every rank holds the same few kilobytes of fixed shape, DCP writes them once, and a fresh
loader on any DP degree the recipe's lanes allow loads them (torchtitan's `CheckpointManager`
calls `state_dict`/`load_state_dict` on it as the `dataloader` entry; no batch is replayed).

Batches come as torchtitan's trainer takes them: `({"input": input_ids, "positions":
position_ids}, labels)` with the labels next-token aligned (shifted left by one, the last
column -100: torchtitan's loss does not shift), so a masked document boundary
(`mask_document_boundaries`) never lets a document's last token predict the next document.

An optimizer step's `batches_per_step` batches (torchtitan's gradient accumulation steps ×
pipeline microbatches) that are padding on every DP rank (a finite recipe's exhausted lanes,
`mixer.is_padding_batch`) are left out of the iteration, so the loop never steps the
optimizer or the scheduler on them; a step where only some ranks pad comes whole.

In a job config: `dataloader=MixerDataLoader.Config(recipe="recipes/pretrain.yaml")`; the
trainer's `config.dataloader.build(dp_world_size=..., dp_rank=..., tokenizer=..., seq_len=...,
local_batch_size=...)` goes to `build_mixer_dataloader`, which checks those against the recipe.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torchtitan.components.dataloader import BaseDataLoader

from mixer.config.recipe import Recipe, load_recipe
from mixer.core.errors import RecipeError, TopologyError
from mixer.integrations.common import steps_with_data
from mixer.integrations.online_mixing import next_token_loss, require_online_mixing
from mixer.runtime import dist
from mixer.runtime.loader import Loader, build_loader
from mixer.runtime.state import merge_states

log = logging.getLogger(__name__)
IGNORE_INDEX = -100  # torchtitan's cross-entropy ignore index (components/loss.py)


def titan_batch(batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A mixer batch as torchtitan's trainer takes it: inputs and next-token labels."""
    labels = torch.full_like(batch["labels"], IGNORE_INDEX)
    labels[:, :-1] = batch["labels"][:, 1:]
    return {"input": batch["input_ids"], "positions": batch["position_ids"]}, labels


class MixerDataLoader(BaseDataLoader):
    """Batches of `mixer.build_loader(recipe, ...)` for DP rank `dp_rank` of `dp_world_size`."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        recipe: str
        """The mixer recipe (a YAML file); its seq_len and batch_size are the training's."""

        num_workers: int = 0
        """DataLoader worker processes per rank (num_workers x DP degree must divide lanes)."""

        batches_per_step: int = 1
        """Batches one optimizer step takes per DP rank (gradient accumulation steps x
        pipeline microbatches): steps of padding on every DP rank are left out whole."""

        def build(self, **kwargs: Any) -> MixerDataLoader:
            return build_mixer_dataloader(self, **kwargs)

    def __init__(
        self,
        recipe: Recipe | dict | str,
        dp_rank: int,
        dp_world_size: int,
        num_workers: int = 0,
        batches_per_step: int = 1,
    ) -> None:
        recipe = load_recipe(recipe)
        if batches_per_step < 1:
            raise ValueError(f"batches_per_step must be at least 1, got {batches_per_step}")
        self.batches_per_step = batches_per_step
        if recipe.images is not None:
            raise RecipeError(
                "MixerDataLoader serves text recipes; this one has `images:` "
                "(torchtitan's image+text trainers take their own batch format)"
            )
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        job = dist.rank_and_world()
        # DP over the whole job: the loader's own collectives gather and agree on the end.
        # Fewer DP ranks than processes (TP, PP): ranks of one DP rank load the same batches,
        # and state_dict() gathers one state per DP rank itself.
        self._gather = dist.is_distributed() and job != (dp_rank, dp_world_size)
        if self._gather and recipe.finite:
            raise TopologyError(
                f"a finite recipe (every source has `epochs`) needs the DP degree to be the "
                f"whole job ({job[1]} processes, DP degree {dp_world_size}): its ranks agree "
                "on the stream's end through collectives over every process"
            )
        if self._gather or not dist.is_distributed():
            self.loader: Loader = build_loader(
                recipe, rank=dp_rank, world_size=dp_world_size, num_workers=num_workers
            )
        else:
            self.loader = build_loader(recipe, num_workers=num_workers)

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        mixing = self.loader.recipe.online_mixing is not None
        self._unreported: deque[dict[str, torch.Tensor]] = deque()
        finite = self.loader.recipe.finite
        for step in steps_with_data(self.loader, self.batches_per_step, finite):
            for batch in step:
                if mixing:  # (for mixing_loss: the batches whose loss is not computed yet)
                    self._unreported.append(batch)
                yield titan_batch(batch)

    def mixing_loss(self, loss_fn: Callable[..., Any]) -> Callable[..., Any]:
        """`loss_fn` (torchtitan's, `(pred, labels, ...)`) that also reports each batch's
        per-token loss to the loader for online mixing, the batches taken in the order they
        were fetched. After building the trainer: `trainer.loss_fn =
        trainer.dataloader.mixing_loss(trainer.loss_fn)` (data parallelism; not under
        pipeline parallelism, where the last stage alone computes the loss)."""
        require_online_mixing(self.loader, "MixerDataLoader.mixing_loss")

        def loss_and_report(pred: torch.Tensor, labels: torch.Tensor, *args: Any, **kw: Any):
            out = loss_fn(pred, labels, *args, **kw)
            pending = getattr(self, "_unreported", None)
            if not pending:
                raise RuntimeError("mixing_loss: a loss computed for no batch fetched")
            batch = pending.popleft()
            if tuple(labels.shape) != tuple(batch["labels"].shape):
                raise RuntimeError(
                    f"mixing_loss: labels of shape {tuple(labels.shape)} for a batch of "
                    f"{tuple(batch['labels'].shape)} (split microbatches are not supported)"
                )
            self.loader.report_loss(next_token_loss(pred, labels), batch)
            return out

        return loss_and_report

    def state_dict(self) -> dict[str, Any]:
        """The global state (a collective under torch.distributed: every rank calls it, as
        torchtitan's checkpointing does)."""
        if not self._gather:
            return self.loader.state_dict()
        by_rank = dict(dist.all_gather_objects((self.dp_rank, self.loader.local_state_dict())))
        return merge_states([by_rank[rank] for rank in sorted(by_rank)])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:  # torchtitan: an empty state is a fresh start
            return
        self.loader.load_state_dict(state_dict)
        log.info(
            "mixer: resuming the stream at global batch %d (state loaded: no batch "
            "skipped by replay)",
            self.loader.next_global_batch,
        )

    def metrics(self, all_ranks: bool = False) -> dict[str, Any]:
        """`loader.metrics()` (for `mixer.integrations.tensorboard.log_metrics`)."""
        return self.loader.metrics(all_ranks=all_ranks)

    def close(self) -> None:
        self.loader.close()


def build_mixer_dataloader(
    config: MixerDataLoader.Config,
    *,
    dp_world_size: int,
    dp_rank: int,
    tokenizer: Any = None,
    seq_len: int | None = None,
    local_batch_size: int | None = None,
    snapshot_every_n_steps: int | None = None,
    **_: Any,
) -> MixerDataLoader:
    """What torchtitan's trainer calls to build its data loader (the keywords of
    `config.dataloader.build(...)`), checked against the recipe: `training.seq_len` and
    `training.local_batch_size` must be the recipe's, and the tokenizer's EOS id its EOS id.
    `snapshot_every_n_steps` is not needed: the state is exact at every step. Other keywords
    a later torchtitan passes are ignored, as its own loaders do."""
    recipe = load_recipe(config.recipe)
    for name, theirs, field, ours, meaning in (
        ("seq_len", seq_len, "seq_len", recipe.seq_len, "tokens per row"),
        ("local_batch_size", local_batch_size, "batch_size", recipe.batch_size, "rows per DP rank"),
    ):
        if theirs is not None and theirs != ours:
            raise RecipeError(
                f"training.{name} is {theirs} but the recipe {config.recipe} has "
                f"{field}: {ours} ({meaning}): set one to the other"
            )
    loader = MixerDataLoader(
        recipe,
        dp_rank,
        dp_world_size,
        num_workers=config.num_workers,
        batches_per_step=config.batches_per_step,
    )
    eos = getattr(tokenizer, "eos_id", None)
    if eos is not None and eos != loader.loader.tokenizer.eos_id:
        loader.close()
        raise RecipeError(
            f"torchtitan's tokenizer has EOS id {eos}, the recipe's tokenizer "
            f"{loader.loader.tokenizer.eos_id}: train with the recipe's tokenizer"
        )
    return loader
