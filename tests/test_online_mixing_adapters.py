"""Online mixing in the adapters, under each framework's own loop with a tiny Llama on CPU:
the per-token loss reported from the logits agrees with the framework's own loss, the updates
happen, and Lightning's checkpoint (taken with the next batch fetched already) resumes the
batches and the weights exactly."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from integ_common import digest, recipe_dict, tiny_llama
from integ_mixing_lightning_job import lightning_fit

import mixer
from mixer.runtime.mixing_state import FIXED_POINT

EVERY = 2


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("mixing_adapters") / "recipe.yaml"
    path.write_text(
        yaml.safe_dump({**recipe_dict(), "online_mixing": {"algorithm": "odm", "every": EVERY}})
    )
    return str(path)


def mean_loss(model, batches: list[dict]) -> float:
    """The model's own (transformers') loss over these batches, token-weighted."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for b in batches:
            out = model(
                input_ids=b["input_ids"], labels=b["labels"], position_ids=b["position_ids"]
            )
            n = int((b["labels"][:, 1:] != -100).sum())
            total, tokens = total + float(out.loss) * n, tokens + n
    return total / tokens


def reported_mean(losses: dict[str, float], batches: list[dict], names: tuple) -> float:
    """Token-weighted mean of the per-source means an update used."""
    total, tokens = 0.0, 0
    for i, name in enumerate(names):
        n = sum(
            int(((b["source_ids"][:, 1:] == i) & (b["labels"][:, 1:] != -100)).sum())
            for b in batches
        )
        total, tokens = total + losses.get(name, 0.0) * n, tokens + n
    return total / tokens


@pytest.mark.slow
def test_mixer_trainer_reports_the_models_per_token_loss(recipe, tmp_path):
    from transformers import TrainingArguments

    from mixer.integrations.hf import MixerTrainer

    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=EVERY + 1,  # fetches 0..every: the update at `every` uses batches 0..every-1
        use_cpu=True,
        learning_rate=0.0,  # (the model the reference loss is computed with)
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    model = tiny_llama()
    seen: list[dict] = []
    model.register_forward_pre_hook(
        lambda m, a, kw: seen.append(
            {k: kw[k].clone() for k in ("input_ids", "labels", "position_ids")}
        ),
        with_kwargs=True,
    )
    trainer = MixerTrainer(model=model, args=args, recipe=recipe, online_mixing=True)
    trainer.train()
    mixing = trainer.mixer_loader.metrics()["mixing"]
    assert mixing["updates"] == 1
    assert mixing["weights"] != {"prose": 0.6, "changelog": 0.4}
    stream = mixer.build_loader(recipe)
    batches = [b for b, _ in zip(stream, range(EVERY))]
    assert [digest(b) for b in batches] == [digest(b) for b in seen[:EVERY]]
    model.eval()
    want = mean_loss(model, batches)
    assert math.isclose(
        reported_mean(mixing["losses"], batches, ("prose", "changelog")), want, rel_tol=1e-5
    )


def test_mixer_trainer_refuses_online_mixing_without_the_recipe_block(tmp_path):
    from transformers import TrainingArguments

    from mixer.integrations.hf import MixerTrainer

    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, use_cpu=True, report_to=[])
    with pytest.raises(mixer.RecipeError, match="online_mixing"):
        MixerTrainer(model=tiny_llama(), args=args, recipe=recipe_dict(), online_mixing=True)


@pytest.mark.slow
def test_lightning_checkpoint_between_updates_resumes_batches_and_weights(recipe, tmp_path):
    """Lightning fetches batch k+1 before step k reports its loss: the checkpoint keeps that
    loss beside the loader's state, and the resumed fit mixes as the uninterrupted one."""
    steps, save_at = 4 * EVERY + 1, EVERY + 1
    full, full_mixing = lightning_fit(recipe, tmp_path / "a", steps, save_at, None)
    assert full_mixing["updates"] == steps // EVERY
    ckpt = str(tmp_path / "a" / f"ckpt-step={save_at}.ckpt")
    saved = torch.load(ckpt, weights_only=False)["MixerDataModule"]
    assert saved["mixer_late_losses"][0][1] + saved["mixer_late_losses"][1][1] > 0
    resumed, resumed_mixing = lightning_fit(recipe, tmp_path / "b", steps, None, ckpt)
    assert resumed == full[save_at:]
    assert resumed_mixing == full_mixing


def test_torchtitan_mixing_loss_reports_what_its_own_loss_adds_up(recipe):
    """torchtitan's trainer fetches every microbatch of a step, then computes each loss: the
    wrapped loss function reports each batch in fetch order, the sums equal to its own."""
    from torchtitan.components.loss import CrossEntropyLoss

    from mixer.integrations.online_mixing import causal_token_loss
    from mixer.integrations.torchtitan import MixerDataLoader

    data = MixerDataLoader(recipe, dp_rank=0, dp_world_size=1)
    loss_fn = data.mixing_loss(CrossEntropyLoss(CrossEntropyLoss.Config()))
    reference = mixer.build_loader(recipe)
    model, it, ref = tiny_llama(), iter(data), iter(reference)
    own_total = 0.0
    with torch.no_grad():
        microbatches = [next(it) for _ in range(EVERY)]  # one step, gradient accumulation 2
        for inputs, labels in microbatches:
            logits = model(input_ids=inputs["input"], position_ids=inputs["positions"]).logits
            loss, _ = loss_fn(logits, labels)
            own_total += float(loss)  # (sum reduction without global_valid_tokens)
            batch = next(ref)
            reference.report_loss(causal_token_loss(logits, batch["labels"]), batch)
    pending = data.loader._mixture.mixing.pending
    assert pending == reference._mixture.mixing.pending
    assert math.isclose(sum(p[0] for p in pending) / FIXED_POINT, own_total, rel_tol=1e-5)
    with pytest.raises(RuntimeError, match="no batch fetched"):
        loss_fn(logits, labels)
    data.close()


def test_the_per_token_loss_from_logits_is_the_same_in_chunks(monkeypatch):
    """The logits are upcast a chunk of positions at a time: the same losses as in one piece,
    shifted as a causal LM shifts, -100 counted as 0."""
    import torch.nn.functional as F

    from mixer.integrations import online_mixing

    logits = torch.randn(3, 17, 50, dtype=torch.bfloat16)
    labels = torch.randint(0, 50, (3, 17))
    labels[0, 3] = -100
    whole = F.cross_entropy(
        logits[:, :-1].float().reshape(-1, 50), labels[:, 1:].reshape(-1), reduction="none"
    ).view(3, 16)
    whole[0, 2] = 0.0
    monkeypatch.setattr(online_mixing, "CHUNK_ELEMENTS", 7 * 50)
    assert torch.equal(online_mixing.causal_token_loss(logits, labels), whole)


@pytest.mark.slow
@pytest.mark.distributed
def test_lightning_ddp_checkpoint_between_updates_resumes_batches_and_weights(recipe, tmp_path):
    """Two DDP ranks: the losses reported after the saved states are summed over the ranks
    into the checkpoint, and the resumed 2-rank fit mixes as the uninterrupted one."""
    import json
    import os
    import sys
    from pathlib import Path

    import procs

    steps, save_at = 2 * EVERY + 1, EVERY // 2 + 1
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["integ_mixing_lightning_job.py", recipe, str(tmp_path), str(steps), str(save_at)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = procs.run(cmd, timeout=120, env=env, cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for got in ranks:
        assert got["full_mixing"]["updates"] == 2 * steps // EVERY
        assert sum(tokens for _, tokens in got["late"]) > 0
        assert got["resumed"] == got["full"][save_at:]
        assert got["resumed_mixing"] == got["full_mixing"]
    assert ranks[0]["full_mixing"] == ranks[1]["full_mixing"]
