"""`MixerTrainer`: a `transformers.Trainer` whose training data is a mixer loader.

Constructed like a Trainer, with `recipe=` and `num_workers=` instead of `train_dataset`. Each
process builds its own loader (rank and world size from torch.distributed, which the Trainer's
accelerator has initialized); accelerate neither dispatches nor splits it (`dispatch_batches`
and `split_batches` off, and `get_train_dataloader` returns the loader itself, never
`accelerator.prepare`d). Every checkpoint folder the Trainer writes holds `mixer_state.json`,
the loader's global state; `train(resume_from_checkpoint=...)` loads it, so no batch is skipped
by replay nor read twice (`ignore_data_skip` is forced on) and the folder resumes on any world
size the recipe's lanes allow. `args.max_steps` bounds the run (the loader has no length).

Padding batches (an exhausted rank's placeholders, `mixer.is_padding_batch`) still run forward
and backward, so DDP stays in step, but with a loss of 0 · Σ logits: zero weight, never NaN.
Training logs carry `loader.metrics(all_ranks=True)` as `mixer/<key>/<source>`.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any

from transformers import Trainer, TrainingArguments
from transformers.trainer_pt_utils import AcceleratorConfig
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from mixer.config.recipe import Recipe, load_recipe
from mixer.integrations.common import flat_metrics, read_state, write_state
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

    # -- data ------------------------------------------------------------------------------
    def get_train_dataloader(self) -> Loader:
        return self.mixer_loader

    def compute_loss(
        self, model: Any, inputs: dict, return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        padding = is_padding_batch(inputs)
        batch, inputs = inputs, {k: v for k, v in inputs.items() if k in self._forward_keys}
        if not padding and self.online_mixing and model.training:
            loss, outputs = super().compute_loss(model, inputs, True, num_items_in_batch)
            logits = outputs["logits"] if isinstance(outputs, dict) else outputs[1]
            self.mixer_loader.report_loss(causal_token_loss(logits, batch["labels"]), batch)
            return (loss, outputs) if return_outputs else loss
        if not padding:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs.pop("labels", None)
        outputs = model(**inputs)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        loss = logits.sum() * 0.0  # zero weight; backward still reaches every parameter
        return (loss, outputs) if return_outputs else loss

    # -- checkpoints -----------------------------------------------------------------------
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        state = self.mixer_loader.state_dict()  # a collective under torch.distributed
        if self.args.should_save:
            folder = os.path.join(
                self._get_output_dir(trial=trial),
                f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}",
            )
            write_state(folder, state)

    def train(
        self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
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
            logs = {**logs, **flat_metrics(self.mixer_loader.metrics(all_ranks=True))}
        super().log(logs, start_time)


def _accepted_keys(model: Any) -> frozenset[str]:
    """The batch keys the model's forward takes (`source_ids` only if it names it; a
    flattened batch's `cu_seq_lens_q/k`, `max_length_q/k` where it takes `**kwargs`, as
    transformers' models do for their attention)."""
    params = inspect.signature(model.forward).parameters
    keys = {k for k in ("input_ids", "labels", "position_ids", "source_ids") if k in params}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        keys.update(FLASH_KEYS)
    return frozenset(keys)
