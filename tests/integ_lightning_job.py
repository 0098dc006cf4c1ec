"""A Lightning job on a MixerDataModule (tests/test_integrations.py).

torchrun --nproc_per_node 2 integ_lightning_job.py RECIPE OUT STEPS SAVE_AT KILL full
    fits STEPS steps with a ModelCheckpoint every SAVE_AT steps (OUT/ckpt), logging
    OUT/full.rank*; a fresh Trainer fits from the step-SAVE_AT checkpoint (`ckpt_path`)
    to STEPS (OUT/resumed.rank*); then a third fits saving every SAVE_AT steps
    (OUT/killed-ckpt, with `last.ckpt`) and every rank SIGKILLs itself in step KILL
    (OUT/killed.rank*)
python integ_lightning_job.py RECIPE OUT STEPS SAVE_AT KILL elastic
    one process resumes the killed job from its last checkpoint (`ckpt_path="last"`)
    to STEPS (OUT/elastic.rank0)
"""

from __future__ import annotations

import logging
import sys
import warnings

import torch
from integ_common import DigestLog, tiny_llama
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from mixer.integrations.lightning import MixerDataModule


class TinyLM(LightningModule):
    def __init__(self, prefix: str, kill: int | None) -> None:
        super().__init__()
        self.model = tiny_llama()
        self.prefix, self.kill = prefix, kill

    def on_fit_start(self) -> None:
        seen = DigestLog(self.prefix, self.global_rank, kill_after=self.kill)
        self.model.register_forward_pre_hook(seen.hook, with_kwargs=True)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self.model(
            input_ids=batch["input_ids"], labels=batch["labels"], position_ids=batch["position_ids"]
        ).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(
    recipe: str,
    out: str,
    steps: int,
    devices: int,
    name: str,
    *,
    folder: str = "ckpt",
    save_at: int | None = None,
    kill: int | None = None,
    ckpt_path: str | None = None,
) -> None:
    # save_last: `ckpt_path="last"` finds `last.ckpt` through this callback's dirpath
    callbacks = [
        ModelCheckpoint(
            dirpath=f"{out}/{folder}",
            filename="ckpt-{step}",
            save_top_k=-1,
            every_n_train_steps=save_at or steps,
            save_last=True,
        )
    ]
    trainer = Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_steps=steps,
        callbacks=callbacks,
        enable_checkpointing=True,
        logger=CSVLogger(out, name=name),
        log_every_n_steps=2,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    trainer.fit(
        TinyLM(f"{out}/{name}", kill), datamodule=MixerDataModule(recipe), ckpt_path=ckpt_path
    )


def main() -> None:
    recipe, out, steps, save_at, kill, phase = sys.argv[1:7]
    steps, save_at, kill = int(steps), int(save_at), int(kill)
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.INFO)
    checkpoint = f"{out}/ckpt/ckpt-step={save_at}.ckpt"
    if phase == "full":
        fit(recipe, out, steps, 2, "full", save_at=save_at)
        state = torch.load(checkpoint, weights_only=False)["MixerDataModule"]["mixer"]
        print("CHECKPOINT_HOLDS_MIXER_STATE", sorted(state), flush=True)
        fit(recipe, out, steps, 2, "resumed", folder="resumed-ckpt", ckpt_path=checkpoint)
        fit(recipe, out, steps, 2, "killed", folder="killed-ckpt", save_at=save_at, kill=kill)
        raise AssertionError("not killed")
    # the last checkpoint the killed job wrote
    fit(recipe, out, steps, 1, "elastic", folder="killed-ckpt", ckpt_path="last")


if __name__ == "__main__":
    main()
