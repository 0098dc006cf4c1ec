"""Lightning fits with online mixing (tests/test_online_mixing_adapters.py): the model reports
its logits from `training_step` through `MixerDataModule.report_logits`.

torchrun --nproc_per_node 2 integ_mixing_lightning_job.py RECIPE OUT STEPS SAVE_AT
    fits STEPS steps under DDP with a checkpoint at step SAVE_AT (OUT/a), then a fresh fit
    resumes from it to STEPS; each rank writes what both saw to OUT/rank<r>.json
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
from integ_common import digest, tiny_llama


def lightning_fit(
    recipe: str, root, steps: int, save_at: int | None, ckpt: str | None, devices: int = 1
) -> tuple[list[str], dict]:
    """(digests of the batches the training steps received, the loader's mixing metrics)."""
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    from mixer.integrations.lightning import MixerDataModule

    class TinyLM(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_llama()
            self.seen: list[str] = []

        def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
            self.seen.append(digest(batch))
            out = self.model(
                input_ids=batch["input_ids"],
                labels=batch["labels"],
                position_ids=batch["position_ids"],
            )
            self.trainer.datamodule.report_logits(out.logits, batch)  # the one line
            return out.loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    callbacks = (
        [
            ModelCheckpoint(
                dirpath=str(root),
                filename="ckpt-{step}",
                save_top_k=-1,
                every_n_train_steps=save_at,
            )
        ]
        if save_at
        else []
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        use_distributed_sampler=False,
        max_steps=steps,
        callbacks=callbacks,
        enable_checkpointing=bool(save_at),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module, data = TinyLM(), MixerDataModule(recipe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=data, ckpt_path=ckpt)
    assert data.loader is not None
    return module.seen, data.loader.metrics()["mixing"]


def main() -> None:
    recipe, out, steps, save_at = sys.argv[1:5]
    steps, save_at = int(steps), int(save_at)
    full, full_mixing = lightning_fit(recipe, f"{out}/a", steps, save_at, None, devices=2)
    ckpt = f"{out}/a/ckpt-step={save_at}.ckpt"
    late = torch.load(ckpt, weights_only=False)["MixerDataModule"]["mixer_late_losses"]
    resumed, resumed_mixing = lightning_fit(recipe, f"{out}/b", steps, None, ckpt, devices=2)
    rank = torch.distributed.get_rank()
    result = {"full": full, "full_mixing": full_mixing, "late": late}
    result.update(resumed=resumed, resumed_mixing=resumed_mixing)
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
