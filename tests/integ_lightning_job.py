"""A Lightning job on a MixerDataModule (tests/test_integrations.py).

    torchrun --nproc_per_node 2 integ_lightning_job.py RECIPE OUT STEPS SAVE_AT full
        fits STEPS steps with a ModelCheckpoint every SAVE_AT steps (OUT/ckpt), logging
        OUT/full.rank*; then a fresh Trainer fits from the step-SAVE_AT checkpoint
        (`ckpt_path`) to STEPS (OUT/resumed.rank*)
    python integ_lightning_job.py RECIPE OUT STEPS SAVE_AT elastic
        one process resumes the same checkpoint (OUT/elastic.rank0)
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
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.model = tiny_llama()
        self.prefix = prefix

    def on_fit_start(self) -> None:
        self.model.register_forward_pre_hook(DigestLog(self.prefix, self.global_rank).hook,
                                             with_kwargs=True)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self.model(input_ids=batch["input_ids"], labels=batch["labels"],
                          position_ids=batch["position_ids"]).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(recipe: str, out: str, steps: int, devices: int, name: str, save_at: int | None = None,
        ckpt_path: str | None = None) -> None:
    callbacks = [ModelCheckpoint(dirpath=f"{out}/ckpt", filename="ckpt-{step}", save_top_k=-1,
                                 every_n_train_steps=save_at)] if save_at else []
    trainer = Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                      max_steps=steps, callbacks=callbacks, enable_checkpointing=bool(save_at),
                      logger=CSVLogger(out, name=name), log_every_n_steps=2,
                      enable_progress_bar=False, enable_model_summary=False,
                      use_distributed_sampler=False)
    trainer.fit(TinyLM(f"{out}/{name}"), datamodule=MixerDataModule(recipe), ckpt_path=ckpt_path)


def main() -> None:
    recipe, out, steps, save_at, phase = sys.argv[1:6]
    steps, save_at = int(steps), int(save_at)
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.INFO)
    checkpoint = f"{out}/ckpt/ckpt-step={save_at}.ckpt"
    if phase == "full":
        fit(recipe, out, steps, 2, "full", save_at=save_at)
        fit(recipe, out, steps, 2, "resumed", ckpt_path=checkpoint)
    else:
        fit(recipe, out, steps, 1, "elastic", ckpt_path=checkpoint)
    state = torch.load(checkpoint, weights_only=False)["MixerDataModule"]["mixer"]
    print("CHECKPOINT_HOLDS_MIXER_STATE", sorted(state))


if __name__ == "__main__":
    main()
