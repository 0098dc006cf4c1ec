"""Online reweighting under real torchrun jobs: examples/train.py --online-mixing resumes
exactly from a mid-run checkpoint; set_weights and metrics(all_ranks=True) behave as collectives."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from helpers import corpus, make_tokenizer, write_docs
from test_torchrun import ROOT, TRAIN, read_logs, torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

DRIVER = ROOT / "tests" / "dist_set_weights.py"
STEPS = 16


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("online")
    tok = make_tokenizer(root / "tok.json")
    write_docs(root / "a.jsonl", corpus(0, 300, max_len=30), "jsonl")
    write_docs(root / "b.jsonl", corpus(1000, 200, min_len=20, max_len=80, seed=4), "jsonl")
    recipe = {
        "seed": 5,
        "tokenizer": str(tok),
        "seq_len": 16,
        "batch_size": 2,
        "lanes": 4,
        "shuffle_window": 16,
        "split_bytes": 2000,
        "sources": [
            {"name": "a", "path": str(root / "a.jsonl"), "weight": 0.5},
            {"name": "b", "path": str(root / "b.jsonl"), "weight": 0.5},
        ],
    }
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    common = [
        str(TRAIN),
        "--recipe",
        str(root / "recipe.yaml"),
        "--steps",
        str(STEPS),
        "--online-mixing",
        "--mix-every",
        "3",
        "--mix-lr",
        "2.0",
    ]
    # One uninterrupted job, checkpointed half way (a resume after SIGKILL, checkpoints
    # being all-or-nothing, is test_torchrun's subject).
    torchrun(
        2,
        *common,
        "--ckpt-every",
        "8",
        "--ckpt-dir",
        str(root / "ckpt"),
        "--step-log",
        str(root / "ref"),
        "--metrics-out",
        str(root / "metrics.jsonl"),
    )
    return root, common, read_logs(root / "ref")


def test_online_mixing_changes_the_targets_and_logs_metrics(job):
    root, _, _ = job
    lines = [json.loads(x) for x in (root / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, STEPS + 1))
    targets = {tuple(round(v, 6) for v in x["target_share"].values()) for x in lines}
    assert len(targets) > 2, "the exponentiated-gradient updates moved the weights"
    assert all(set(x["loss_by_source"]) <= {"a", "b"} for x in lines)
    assert lines[-1]["global_tokens"] == 2 * STEPS * 2 * 16


def test_resume_from_a_mid_run_checkpoint_with_online_mixing_reproduces_the_stream(job, tmp_path):
    root, common, reference = job
    ckpt = tmp_path / "ckpt"
    shutil.copytree(root / "ckpt" / "step-8", ckpt / "step-8")
    torchrun(
        2,
        *common,
        "--ckpt-every",
        "0",
        "--ckpt-dir",
        str(ckpt),
        "--resume",
        "--step-log",
        str(tmp_path / "resumed"),
    )
    resumed = read_logs(tmp_path / "resumed")
    assert sorted(resumed) == list(range(16, 2 * STEPS))
    assert resumed == {g: h for g, h in reference.items() if g >= 16}


@pytest.fixture(scope="module")
def collectives(job, tmp_path_factory) -> dict[str, list[dict]]:
    """One torchrun job of dist_set_weights.py: mode -> each rank's result."""
    root, _, _ = job
    out = tmp_path_factory.mktemp("collectives") / "out"
    torchrun(2, str(DRIVER), str(root / "recipe.yaml"), str(out))
    return {
        mode: [json.loads(out.with_name(f"out.{mode}.rank{r}").read_text()) for r in range(2)]
        for mode in ("metrics", "mismatch")
    }


def test_set_weights_mismatch_across_ranks_raises_on_every_rank(collectives):
    for result in collectives["mismatch"]:
        assert result["error"] and "same weights" in result["error"]


def test_metrics_all_ranks_sums_the_ranks(collectives):
    results = collectives["metrics"]
    for r in results:
        assert sum(r["mine"].values()) == r["delivered"]
    summed = {n: sum(r["mine"][n] for r in results) for n in ("a", "b")}
    assert results[0]["summed"] == results[1]["summed"] == summed
