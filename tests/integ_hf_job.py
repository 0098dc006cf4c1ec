"""A transformers.Trainer job on mixer batches (tests/test_integrations.py).

torchrun --nproc_per_node 2 integ_hf_job.py RECIPE OUT STEPS SAVE_AT KILL full
    trains STEPS steps saving every SAVE_AT (OUT/run/checkpoint-*), logging OUT/full.rank*;
    a fresh MixerTrainer resumes OUT/run/checkpoint-SAVE_AT to STEPS (OUT/resumed.rank*);
    then a third trains saving every SAVE_AT (OUT/killed-run) and every rank SIGKILLs
    itself in step KILL (OUT/killed.rank*)
python integ_hf_job.py RECIPE OUT STEPS SAVE_AT KILL elastic
    one process resumes the killed job from its last checkpoint
    (`train(resume_from_checkpoint=True)`) to STEPS (OUT/elastic.rank0)
"""

from __future__ import annotations

import gc
import logging
import os
import sys

import torch.distributed as dist
from integ_common import DigestLog, tiny_llama
from transformers import TrainingArguments

from mixer.integrations.hf import MixerTrainer


def trainer(
    recipe: str,
    out: str,
    steps: int,
    name: str,
    run: str,
    save_at: int | None = None,
    kill: int | None = None,
) -> MixerTrainer:
    args = TrainingArguments(
        output_dir=f"{out}/{run}",
        max_steps=steps,
        use_cpu=True,
        # ddp_backend on a single process makes accelerate ask for a process group
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
        save_strategy="steps" if save_at else "no",
        save_steps=save_at or 1,
        logging_steps=2,
        learning_rate=1e-3,
        report_to=[],
        disable_tqdm=True,
        dataloader_pin_memory=False,
        log_level="info",
        log_level_replica="info",
    )
    model = tiny_llama()
    t = MixerTrainer(model=model, args=args, recipe=recipe, num_workers=0)
    seen = DigestLog(f"{out}/{name}", t.args.process_index, kill_after=kill)
    model.register_forward_pre_hook(seen.hook, with_kwargs=True)
    return t


def padding_loss(t: MixerTrainer) -> None:
    """An exhausted rank's placeholder batch (labels all -100): a finite loss, zero grads."""
    batch = next(iter(t.mixer_loader))
    batch["labels"].fill_(-100)
    t.model.zero_grad()
    t.current_gradient_accumulation_steps = 1
    loss = t.training_step(t.model, batch, None)  # forward and backward
    grads = [p.grad for p in t.model.parameters() if p.grad is not None]
    finite = all(bool(g.isfinite().all()) and not g.any() for g in grads)
    print("PADDING_LOSS", abs(float(loss)), "zero grads:", finite and len(grads) > 0)


def main() -> None:
    recipe, out, steps, save_at, kill, phase = sys.argv[1:7]
    steps, save_at, kill = int(steps), int(save_at), int(kill)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    checkpoint = f"{out}/run/checkpoint-{save_at}"
    if phase == "full":
        first = trainer(recipe, out, steps, "full", "run", save_at)
        first.train()
        print("MIXER_LOGS", [k for k in first.state.log_history[0] if k.startswith("mixer/")])
        del first
        trainer(recipe, out, steps, "resumed", "resumed").train(resume_from_checkpoint=checkpoint)
        trainer(recipe, out, steps, "killed", "killed-run", save_at, kill).train()
        raise AssertionError("not killed")
    elastic = trainer(recipe, out, steps, "elastic", "killed-run")
    elastic.train(resume_from_checkpoint=True)  # the last checkpoint the killed job wrote
    padding_loss(elastic)
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
