"""`MixerDataModule`: a Lightning `LightningDataModule` whose training data is a mixer loader.

`train_dataloader()` returns the loader (wrapped in a plain iterable, not a torch DataLoader,
so Lightning injects no DistributedSampler whatever `use_distributed_sampler` says); rank and
world size come from the trainer's strategy. `state_dict()` is the loader's global state at
the last batch a training step received, so Lightning's own checkpoints (`ModelCheckpoint`,
`trainer.save_checkpoint`) hold it and `Trainer.fit(ckpt_path=...)` resumes the stream exactly,
on any world size the recipe's lanes allow. Lightning fetches one batch ahead of the step (its
`_PrefetchDataFetcher`, for loaders without a length): the module keeps the loader's local
state before each fetched batch and saves the one of the first batch no step has received.
Every `log_every_n_steps` the loader's metrics go to the trainer's loggers as
`mixer/<key>/<source>`.

The module overrides none of the batch hooks a LightningModule shares with it
(`on_before_batch_transfer`, `transfer_batch_to_device`, `on_after_batch_transfer`), so the
module's own run: it adds a callback (`MixerCallback`) to the trainer in `setup` that sees each
batch a training step receives (`on_train_batch_start`).

A finite recipe's spent stream ends `fit()` (whatever `max_steps` and `max_epochs` say), with
one INFO line naming the step. An optimizer step (`accumulate_grad_batches` batches) that is
padding on every rank is left out before Lightning sees it: no step, no optimizer or scheduler
step. Padding batches of a step where only some ranks pad reach `training_step` (its labels
are all -100: weight the loss by the global token count so it is zero, not NaN).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as torch_dist

if TYPE_CHECKING:  # (checked against one package: the two classes are distinct types)
    from lightning.pytorch import Callback, LightningDataModule
else:
    try:
        from lightning.pytorch import Callback, LightningDataModule
    except ImportError:  # the standalone package
        from pytorch_lightning import Callback, LightningDataModule

from mixer.config.recipe import Recipe, load_recipe
from mixer.integrations.common import flat_metrics, steps_with_data
from mixer.integrations.online_mixing import LateReports, Sums, causal_token_loss, summed
from mixer.runtime.loader import Loader, build_loader
from mixer.runtime.state import merge_states

log = logging.getLogger(__name__)


class _Fetched:
    """The loader as Lightning iterates it; remembers the state before each fetched batch."""

    def __init__(self, loader: Loader, module: MixerDataModule) -> None:
        self.loader, self.module = loader, module
        # (state, the reports' running sums when it was taken) of fetched, unreceived batches
        self.before: deque[tuple[dict, Sums]] = deque()
        self.late = LateReports(loader)  # online mixing: losses reported after those states
        self.spent = False  # the stream ended (a finite recipe's data is exhausted)

    def _with_states(self) -> Iterator[tuple[dict, Sums, dict[str, torch.Tensor]]]:
        it = iter(self.loader)
        while True:
            state, mark = self.loader.local_state_dict(), self.late.mark()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.late.fetched()
            yield state, mark, batch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self.before.clear()
        trainer = self.module.trainer
        per_step = max(int(trainer.accumulate_grad_batches), 1) if trainer is not None else 1
        finite = self.loader.recipe.finite
        for step in steps_with_data(self._with_states(), per_step, finite, lambda i: i[2]):
            for state, mark, batch in step:
                self.before.append((state, mark))
                yield batch
        self.spent = True
        if trainer is not None:
            trainer.should_stop = True  # every rank: the stream ends at one global batch

    def received(self) -> None:
        if self.before:
            self.before.popleft()

    def local_state(self) -> dict:
        return self.before[0][0] if self.before else self.loader.local_state_dict()

    def late_sums(self) -> Sums:
        """The losses reported since the state `local_state` returns was taken."""
        return self.late.since(self.before[0][1]) if self.before else self.late.zero()


class MixerDataModule(LightningDataModule):
    """Training batches from `mixer.build_loader(recipe, num_workers=...)`."""

    def __init__(self, recipe: Recipe | dict | str, num_workers: int = 0) -> None:
        super().__init__()
        self.recipe = load_recipe(recipe)
        self.num_workers = num_workers
        self.loader: Loader | None = None
        self._fetched: _Fetched | None = None
        self._to_load: dict | None = None
        self._logged_step = -1
        self._late_losses: list | None = None  # online mixing: reported after the saved state
        self._said_spent = False

    def setup(self, stage: str) -> None:
        if self.loader is not None:
            return
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer else (0, 1)
        if world > 1 and torch_dist.is_initialized():
            self.loader = build_loader(self.recipe, num_workers=self.num_workers)
            if (self.loader.rank, self.loader.world_size) != (rank, world):
                raise RuntimeError(
                    f"MixerDataModule: the strategy says rank {rank} of {world}, "
                    "torch.distributed otherwise (model parallelism?)"
                )
        else:
            self.loader = build_loader(
                self.recipe, rank=rank, world_size=world, num_workers=self.num_workers
            )
        self._fetched = _Fetched(self.loader, self)
        # (Any: Lightning's Trainer gets `callbacks` from its connector, undeclared)
        trainer: Any = self.trainer
        if trainer is not None and not any(isinstance(c, MixerCallback) for c in trainer.callbacks):
            trainer.callbacks.append(MixerCallback(self))
        if self._to_load is not None:
            self._load(self._to_load)
            self._to_load = None

    def train_dataloader(self) -> _Fetched:
        if self._fetched is None:
            self.setup("fit")
        assert self._fetched is not None  # (`setup` made it)
        return self._fetched

    def teardown(self, stage: str) -> None:
        if self.loader is not None:
            self.loader.close()

    # -- state (in every Lightning checkpoint) ----------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The global state at the first batch no training step has received (every rank
        calls it: Lightning dumps the checkpoint on all ranks)."""
        if self._fetched is None:
            return {"mixer": self._to_load} if self._to_load else {}
        local = self._fetched.local_state()
        late = self._fetched.late
        if torch_dist.is_initialized() and self._fetched.loader.world_size > 1:
            gathered: list[Any] = [None] * torch_dist.get_world_size()
            torch_dist.all_gather_object(gathered, (local, self._fetched.late_sums()))
            state: dict[str, Any] = {"mixer": merge_states([g[0] for g in gathered])}
            if late.on:
                state["mixer_late_losses"] = summed([g[1] for g in gathered])
            return state
        if late.on:
            return {"mixer": local, "mixer_late_losses": self._fetched.late_sums()}
        return {"mixer": local}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state.get("mixer"):
            return
        self._late_losses = state.get("mixer_late_losses")
        if self.loader is None:
            self._to_load = state["mixer"]
        else:
            self._load(state["mixer"])

    def _load(self, state: dict) -> None:
        loader = self.loader
        assert loader is not None
        loader.load_state_dict(state)
        late = self._late_losses
        if late is not None and self._fetched is not None and loader.rank == 0:
            self._fetched.late.give_back = late  # (the merged state's sums are rank 0's)
        log.info(
            "mixer: resuming the stream at global batch %d (state loaded: no batch "
            "skipped by replay)",
            loader.next_global_batch,
        )

    # -- online mixing -----------------------------------------------------------------------
    def report_loss(self, token_loss: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
        """`loader.report_loss` for the batch a training step received, kept exact in the
        checkpoints although Lightning fetched the next batch already (docs/online-mixing.md).
        In `training_step`: `self.trainer.datamodule.report_loss(token_loss, batch)`."""
        if self._fetched is None:
            raise RuntimeError("MixerDataModule.report_loss: the module is not set up")
        self._fetched.late.report(token_loss, batch)

    def report_logits(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
        """`report_loss` of a causal LM's logits (`logits[:, t]` predicts `labels[:, t + 1]`,
        as transformers' models): `self.trainer.datamodule.report_logits(out.logits, batch)`."""
        self.report_loss(causal_token_loss(logits, batch["labels"]), batch)

    # -- per batch (through MixerCallback) ---------------------------------------------------
    def _received(self, trainer: Any) -> None:
        if self._fetched is None:
            return
        self._fetched.received()
        step = trainer.global_step
        every = trainer.log_every_n_steps
        if step % max(every, 1) == 0 and step != self._logged_step:
            self._logged_step = step
            self._log_metrics(trainer, step)

    def _epoch_ended(self, trainer: Any) -> None:
        if self._fetched is not None and self._fetched.spent and not self._said_spent:
            self._said_spent = True
            log.info(
                "mixer: the recipe's data is exhausted after step %d (global batch %d): fit() ends",
                trainer.global_step,
                self._fetched.loader.next_global_batch,
            )

    def _log_metrics(self, trainer: Any, step: int) -> None:
        assert self._fetched is not None  # (called once set up)
        loader = self._fetched.loader
        metrics = flat_metrics(loader.metrics(all_ranks=True))  # every rank, same step
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)


class MixerCallback(Callback):
    """What `MixerDataModule` does per training batch and at an epoch's end; `setup` adds it
    to the trainer (a LightningModule's batch hooks stay the module's)."""

    def __init__(self, datamodule: MixerDataModule) -> None:
        self.datamodule = datamodule

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self.datamodule._received(trainer)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.datamodule._epoch_ended(trainer)
