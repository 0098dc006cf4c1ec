"""`MixerTrainer`: a `transformers.Trainer` whose training data is a mixer loader.

Constructed like a Trainer, with `recipe=` and `num_workers=` instead of `train_dataset`. Each
process builds its own loader (rank and world size from torch.distributed, which the Trainer's
accelerator has initialized); accelerate neither dispatches nor splits it (`dispatch_batches`
and `split_batches` off, and `get_train_dataloader` returns the loader itself, never
`accelerator.prepare`d). Every checkpoint folder the Trainer writes holds `mixer_state.json`,
the loader's global state; `train(resume_from_checkpoint=...)` loads it, so no batch is skipped
by replay nor read twice (`ignore_data_skip` is forced on) and the folder resumes on any world
size the recipe's lanes allow. `args.max_steps` bounds the run (the loader has no length);
a finite recipe's spent stream ends `train()` earlier, with one INFO line naming the step.

An optimizer step whose batches are padding on every rank (an exhausted lane's placeholders,
`mixer.is_padding_batch`) is left out: no forward, no optimizer or scheduler step, no step
counted, no zero in the logged loss. Where only some ranks pad, their padding batches still
run forward and backward, so DDP stays in step, with a loss of 0 · Σ logits: zero weight,
never NaN. Evaluation batches reach the model as the eval dataset has them.

The checkpoint's `mixer_state.json` is written before the Trainer rotates older checkpoints
(`save_total_limit`); `train(resume_from_checkpoint=True)` takes the newest folder that holds
it. Training logs carry the sources' shares and skips as `mixer/<key>/<source>` and the
profile's `mixer/wait/share`, `mixer/wait/p99_ms`, `mixer/bottleneck` (`loader.metrics()` has
the rest); TensorBoard gets them under the same names.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any

from transformers import Trainer, TrainingArguments
from transformers.integrations.integration_utils import TensorBoardCallback
from transformers.trainer_pt_utils import AcceleratorConfig
from transformers.trainer_utils import (
    PREFIX_CHECKPOINT_DIR,
    rotate_checkpoints,
)

from mixer.config.recipe import Recipe, load_recipe
from mixer.integrations.common import (
    LOG_LINE_KEYS,
    STATE_FILE,
    flat_metrics,
    read_state,
    step_has_data,
    write_state,
)
from mixer.integrations.online_mixing import causal_token_loss, require_online_mixing
from mixer.pipeline.batch import is_padding_batch
from mixer.pipeline.flatten import FLASH_KEYS
from mixer.runtime.loader import Loader, build_loader

log = logging.getLogger(__name__)


def _mixer_args(args: TrainingArguments | None, recipe: Recipe) -> TrainingArguments:
    if args is None:
        raise TypeError("MixerTrainer needs TrainingArguments with max_steps > 0")
    if args.max_steps is None or args.max_steps <= 0:
        raise ValueError(
            "MixerTrainer: set TrainingArguments(max_steps=...): a mixer loader "
            "has no length, so epochs cannot bound the run"
        )
    args.per_device_train_batch_size = recipe.batch_size  # the recipe's (for the logs)
    args.ignore_data_skip = True  # the loader's state resumes the stream, not a replay
    # TrainingArguments declares the field `dict | str | None`; its __post_init__ makes it an
    # AcceleratorConfig (always, with accelerate installed, which Trainer requires).
    accelerator = args.accelerator_config
    if not isinstance(accelerator, AcceleratorConfig):
        raise TypeError("MixerTrainer needs accelerate (TrainingArguments.accelerator_config)")
    accelerator.dispatch_batches = False
    accelerator.split_batches = False
    return args


class MixerTrainer(Trainer):
    """A `transformers.Trainer` trained on `mixer.build_loader(recipe, num_workers=...)`."""

    def __init__(
        self,
        model: Any = None,
        args: TrainingArguments | None = None,
        *,
        recipe: Recipe | dict | str,
        num_workers: int = 0,
        online_mixing: bool = False,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("train_dataset") is not None:
            raise TypeError("MixerTrainer takes recipe=, not train_dataset=")
        recipe = load_recipe(recipe)
        super().__init__(model=model, args=_mixer_args(args, recipe), **kwargs)
        # The accelerator has initialized torch.distributed (if launched so): the loader
        # takes rank and world size from it, and its state_dict() is then global.
        self.mixer_loader: Loader = build_loader(recipe, num_workers=num_workers)
        if (self.mixer_loader.rank, self.mixer_loader.world_size) != (
            self.args.process_index,
            self.args.world_size,
        ):
            raise RuntimeError(
                f"MixerTrainer: torch.distributed says rank {self.mixer_loader.rank} of "
                f"{self.mixer_loader.world_size}, the Trainer {self.args.process_index} of "
                f"{self.args.world_size} (model parallelism is not supported)"
            )
        self._forward_keys = _accepted_keys(self.model)
        self.online_mixing = online_mixing  # report each training batch's per-token loss
        if online_mixing:
            require_online_mixing(self.mixer_loader, "MixerTrainer")
        self._padding_step = False  # the training batch being computed is padding
        self._mixer_batch: dict | None = None  # the whole training batch (online mixing)
        self.mixer_padding_steps = 0  # optimizer steps left out: padding on every rank
        _name_mixer_scalars_as_logged(self)

    # -- data ------------------------------------------------------------------------------
    def get_train_dataloader(self) -> Loader:
        return self.mixer_loader

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
        """The next optimizer step's batches, leaving out steps that are padding on every
        rank; none once the stream is spent, and training stops."""
        while True:
            batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
            if len(batches) < num_batches:
                self._stream_spent(len(batches))
                return [], None
            if not self.mixer_loader.recipe.finite or step_has_data(batches):
                return batches, num_items
            self.mixer_padding_steps += 1

    def _stream_spent(self, left_out: int) -> None:
        self.control.should_training_stop = True
        partial = (
            f"; the last {left_out} batches, fewer than a step's "
            f"{num_batches_per_step(self.args)}, are not trained on"
            if left_out
            else ""
        )
        log.info(
            "mixer: the recipe's data is exhausted after step %d (global batch %d): training "
            "ends before max_steps=%d (%d all-padding steps left out%s)",
            self.state.global_step,
            self.mixer_loader.next_global_batch,
            self.args.max_steps,
            self.mixer_padding_steps,
            partial,
        )

    def training_step(self, model: Any, inputs: dict, num_items_in_batch: Any = None) -> Any:
        # A mixer batch: only the keys the model takes (`source_ids` often is not one).
        self._padding_step = is_padding_batch(inputs)
        self._mixer_batch = inputs if self.online_mixing else None
        inputs = {k: v for k, v in inputs.items() if k in self._forward_keys}
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:
            self._padding_step = False

    def compute_loss(
        self, model: Any, inputs: dict, return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        batch = self._mixer_batch
        if batch is not None and not self._padding_step and model.training:
            loss, outputs = super().compute_loss(model, inputs, True, num_items_in_batch)
            logits = outputs["logits"] if isinstance(outputs, dict) else outputs[1]
            self.mixer_loader.report_loss(causal_token_loss(logits, batch["labels"]), batch)
            return (loss, outputs) if return_outputs else loss
        if not self._padding_step:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        outputs = model(**{k: v for k, v in inputs.items() if k != "labels"})
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        loss = logits.sum() * 0.0  # zero weight; backward still reaches every parameter
        return (loss, outputs) if return_outputs else loss

    # -- checkpoints -----------------------------------------------------------------------
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        # The Trainer's files, then ours, then the rotation: a crash in between leaves the
        # older checkpoints, and the one without `mixer_state.json` is passed over on resume.
        limit, self.args.save_total_limit = self.args.save_total_limit, None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        state = self.mixer_loader.state_dict()  # a collective under torch.distributed
        if self.args.should_save:
            run_dir = self._get_output_dir(trial=trial)
            folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            write_state(folder, state)
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )

    def train(
        self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir or ".")
            if resume_from_checkpoint is None:
                raise ValueError(f"no checkpoint in {self.args.output_dir} to resume from")
        if resume_from_checkpoint:
            self.mixer_loader.load_state_dict(read_state(resume_from_checkpoint))
            log.info(
                "mixer: resuming the stream at global batch %d from %s (state loaded: "
                "no batch skipped by replay)",
                self.mixer_loader.next_global_batch,
                resume_from_checkpoint,
            )
        return super().train(resume_from_checkpoint or None, *args, **kwargs)

    # -- logs ------------------------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:  # a training log: every rank logs it at the same step
            metrics = self.mixer_loader.metrics(all_ranks=True)
            logs = {**logs, **flat_metrics(metrics, LOG_LINE_KEYS)}
        super().log(logs, start_time)


def num_batches_per_step(args: TrainingArguments) -> int:
    return max(int(args.gradient_accumulation_steps), 1)


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest `checkpoint-<step>` folder in `output_dir` that holds `mixer_state.json`;
    newer ones without it (a save cut short) are passed over with a WARNING each."""
    if not os.path.isdir(output_dir):
        return None
    steps = sorted(
        (int(name[len(PREFIX_CHECKPOINT_DIR) + 1 :]), name)
        for name in os.listdir(output_dir)
        if name.startswith(f"{PREFIX_CHECKPOINT_DIR}-")
        and name[len(PREFIX_CHECKPOINT_DIR) + 1 :].isdigit()
        and os.path.isdir(os.path.join(output_dir, name))
    )
    for _, name in reversed(steps):
        folder = os.path.join(output_dir, name)
        if os.path.isfile(os.path.join(folder, STATE_FILE)):
            return folder
        log.warning(
            "mixer: %s has no %s (its save did not finish): resuming from an older checkpoint",
            folder,
            STATE_FILE,
        )
    return None


class MixerTensorBoardCallback(TensorBoardCallback):
    """transformers' TensorBoard callback, writing the `mixer/...` scalars under their own
    names (as `mixer.integrations.tensorboard.log_metrics` does), not as `train/mixer/...`."""

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        logs = dict(logs or {})
        ours = {k: logs.pop(k) for k in list(logs) if k.startswith("mixer/")}
        super().on_log(args, state, control, logs=logs, **kwargs)
        if ours and state.is_world_process_zero and self.tb_writer is not None:
            for tag, value in ours.items():
                self.tb_writer.add_scalar(tag, value, state.global_step)
            self.tb_writer.flush()


def _name_mixer_scalars_as_logged(trainer: Trainer) -> None:
    callbacks = trainer.callback_handler.callbacks
    for i, callback in enumerate(callbacks):
        if type(callback) is TensorBoardCallback:
            replacement = MixerTensorBoardCallback(tb_writer=callback.tb_writer)
            callbacks[i] = replacement


def _accepted_keys(model: Any) -> frozenset[str]:
    """The batch keys the model's forward takes (`source_ids` only if it names it; a
    flattened batch's `cu_seq_lens_q/k`, `max_length_q/k` where it takes `**kwargs`, as
    transformers' models do for their attention)."""
    params = inspect.signature(model.forward).parameters
    keys = {k for k in ("input_ids", "labels", "position_ids", "source_ids") if k in params}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        keys.update(FLASH_KEYS)
    return frozenset(keys)
