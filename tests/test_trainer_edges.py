"""The trainer adapters at the edges of the data, in each framework's own loop (in process, CPU,
the tiny Llama of tests/integ_common.py): a finite recipe whose four lanes run out at different
times, so its tail has padding batches (an exhausted lane's placeholders) and then ends."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
import yaml
from integ_common import ROOT, tiny_llama

import mixer

pytestmark = pytest.mark.slow
CHANGELOG = ROOT / "data" / "sample" / "changelog" / "changelog.jsonl"


@pytest.fixture(scope="module")
def finite_recipe(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("edges")
    data = folder / "small.jsonl"
    data.write_text("".join(CHANGELOG.read_text().splitlines(keepends=True)[:60]))
    recipe = {
        "seed": 5,
        "tokenizer": str(ROOT / "data" / "tokenizer.json"),
        "seq_len": 32,
        "batch_size": 2,
        "lanes": 4,
        "shuffle_window": 16,
        "sources": [{"name": "changelog", "path": str(data), "weight": 1.0, "epochs": 1}],
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def padding_flags(finite_recipe) -> list[bool]:
    with mixer.build_loader(str(finite_recipe), rank=0, world_size=1) as loader:
        flags = [mixer.is_padding_batch(b) for b in loader]
    assert sum(flags) >= 5 and not flags[-1]
    return flags


def hf_args(out: Path, **kw):
    from transformers import TrainingArguments

    base = dict(
        output_dir=str(out),
        max_steps=1000,
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        learning_rate=1e-3,
        report_to=[],
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    return TrainingArguments(**{**base, **kw})


def test_hf_leaves_out_all_padding_steps_and_ends_on_the_spent_stream(
    finite_recipe, padding_flags, tmp_path, caplog
):
    from transformers import TrainerCallback

    from mixer.integrations.hf import MixerTrainer

    class Steps(TrainerCallback):
        optimizer_steps = 0

        def on_optimizer_step(self, args, state, control, **kwargs):
            Steps.optimizer_steps += 1

    trainer = MixerTrainer(
        model=tiny_llama(), args=hf_args(tmp_path), recipe=str(finite_recipe), callbacks=[Steps()]
    )
    with caplog.at_level(logging.INFO, logger="mixer.integrations.hf"):
        trainer.train()
    real = padding_flags.count(False)
    assert Steps.optimizer_steps == real == trainer.state.global_step  # max_steps was 1000
    schedule = getattr(trainer.lr_scheduler, "scheduler", trainer.lr_scheduler)
    assert schedule.last_epoch == real  # the scheduler, too
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == real and min(losses) > 0  # no zero of a padding step in the loss
    spent = [r.message for r in caplog.records if "exhausted" in r.message]
    assert len(spent) == 1 and f"after step {real} " in spent[0]
    assert f"{padding_flags.count(True)} all-padding steps left out" in spent[0]


def test_hf_checkpoint_cut_short_before_its_mixer_state_leaves_the_previous_one(
    finite_recipe, tmp_path, caplog, monkeypatch
):
    import mixer.integrations.hf as hf

    args = dict(max_steps=4, save_strategy="steps", save_steps=2, save_total_limit=1)
    trainer = hf.MixerTrainer(
        model=tiny_llama(), args=hf_args(tmp_path, **args), recipe=str(finite_recipe)
    )
    written = hf.write_state

    def crash_on_the_second(folder, state):
        if str(folder).endswith("checkpoint-4"):
            raise KeyboardInterrupt("killed between the Trainer's files and mixer_state.json")
        return written(folder, state)

    monkeypatch.setattr(hf, "write_state", crash_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    monkeypatch.setattr(hf, "write_state", written)
    assert (tmp_path / "checkpoint-4" / "trainer_state.json").is_file()
    assert not (tmp_path / "checkpoint-4" / "mixer_state.json").exists()
    assert (tmp_path / "checkpoint-2" / "mixer_state.json").is_file()  # not rotated away
    resumed = hf.MixerTrainer(
        model=tiny_llama(), args=hf_args(tmp_path, **args), recipe=str(finite_recipe)
    )
    with caplog.at_level(logging.INFO):
        resumed.train(resume_from_checkpoint=True)
    warned = [
        r for r in caplog.records if r.levelno == logging.WARNING and "checkpoint-4" in r.message
    ]
    assert warned and "mixer_state.json" in warned[0].message
    assert any("resuming the stream at global batch 2 " in r.message for r in caplog.records)


def test_hf_evaluate_keeps_the_eval_sets_attention_mask(finite_recipe, tmp_path):
    from transformers import Trainer

    from mixer.integrations.hf import MixerTrainer

    torch.manual_seed(1)
    rows = []
    for length in (9, 16, 5, 12):
        ids = torch.randint(0, 8000, (16,))
        mask = (torch.arange(16) >= 16 - length).long()  # left padding: pads are attended
        rows.append(
            {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
        )
    model = tiny_llama()
    args = hf_args(tmp_path, per_device_eval_batch_size=4)
    theirs = Trainer(model=model, args=args).evaluate(eval_dataset=rows)["eval_loss"]
    ours = MixerTrainer(model=model, args=args, recipe=str(finite_recipe)).evaluate(
        eval_dataset=rows
    )["eval_loss"]
    assert ours == pytest.approx(theirs, rel=1e-6)


def test_hf_tensorboard_names_the_mixer_scalars_as_log_metrics_does(finite_recipe, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mixer.integrations.hf import MixerTrainer

    args = hf_args(tmp_path, max_steps=2, report_to=["tensorboard"])
    MixerTrainer(model=tiny_llama(), args=args, recipe=str(finite_recipe)).train()
    events = EventAccumulator(str(next(tmp_path.rglob("events.*")).parent))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert "mixer/realized_share/changelog" in tags and "mixer/wait/share" in tags
    assert not any(t.startswith("train/mixer/") for t in tags)
    assert "mixer/epochs/changelog" not in tags  # each log line: shares, skips, profile


def lightning_fit(recipe: Path, tmp_path: Path, module, **kw):
    from lightning.pytorch import Trainer

    from mixer.integrations.lightning import MixerDataModule

    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        **kw,
    )
    trainer.fit(module, datamodule=MixerDataModule(str(recipe)))
    return trainer


def tiny_lightning_module():
    from lightning.pytorch import LightningModule

    class TinyLM(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_llama()
            self.hooked = 0
            self.batches = 0

        def on_before_batch_transfer(self, batch, dataloader_idx):
            self.hooked += 1
            return batch

        def training_step(self, batch, batch_idx):
            self.batches += 1
            out = self.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
            logits = out.logits[:, :-1].flatten(0, 1)
            labels = batch["labels"][:, 1:].flatten()
            loss = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
            return loss / max(int((labels != -100).sum()), 1)

        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
            return [optimizer], [{"scheduler": schedule, "interval": "step"}]

    return TinyLM()


def test_lightning_ends_fit_on_the_spent_stream_without_padding_steps(
    finite_recipe, padding_flags, tmp_path, caplog
):
    module = tiny_lightning_module()
    with caplog.at_level(logging.INFO, logger="mixer.integrations.lightning"):
        trainer = lightning_fit(finite_recipe, tmp_path, module, max_steps=10_000)
    real = padding_flags.count(False)
    assert trainer.global_step == real and module.batches == real
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == real
    assert trainer.current_epoch <= 1  # not thousands of empty epochs
    spent = [r.message for r in caplog.records if "exhausted" in r.message]
    assert len(spent) == 1 and f"after step {real} " in spent[0]
    assert module.hooked == real  # the LightningModule's own batch hook runs


@pytest.mark.distributed
def test_ddp_keeps_steps_where_only_some_ranks_pad_and_leaves_out_the_rest(finite_recipe, tmp_path):
    """2 gloo processes, 8 lanes: lanes run out at different times on the two ranks."""
    import os

    import procs

    recipe = yaml.safe_load(finite_recipe.read_text())
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**recipe, "lanes": 8}))
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = procs.run(
        [*launch, "integ_padding_job.py", str(path)],
        timeout=120,
        env=env,
        cwd=Path(__file__).parent,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    lines = sorted(line.split() for line in result.stdout.splitlines() if line.startswith("RANK"))
    (_, _, zero, weights0), (_, _, one, weights1) = lines
    assert len(zero) == len(one) and weights0 == weights1  # in step, the same weights
    steps = list(zip(zero, one))
    assert ("P", "P") not in steps  # padding on every rank: left out
    assert ("P", ".") in steps or (".", "P") in steps  # padding on some: a normal DDP step


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
