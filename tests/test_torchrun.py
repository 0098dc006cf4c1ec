"""Real torchrun jobs (gloo, CPU): crash and resume, elastic resume, finite end without hangs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import procs
import pytest
import yaml
from helpers import corpus, expected_counts, make_tokenizer, write_docs

import mixer

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
JOB_TIMEOUT_S = 180  # the longest job takes ~25 s on two busy cores
TRAIN = ROOT / "examples" / "train.py"
STEPS = 12


def torchrun(nproc: int, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = procs.run(cmd, timeout=JOB_TIMEOUT_S, env=env)
    if check and result.returncode != 0:
        raise AssertionError(result.stdout[-3000:] + result.stderr[-10000:])
    return result


def read_logs(prefix: Path) -> dict[int, str]:
    """global batch index -> batch hash, over every rank's log."""
    out: dict[int, str] = {}
    for path in prefix.parent.glob(prefix.name + ".rank*"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            assert out.setdefault(record["global"], record["hash"]) == record["hash"]
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("torchrun")
    tok = make_tokenizer(root / "tok.json")
    docs = {"a": corpus(0, 300, max_len=30), "b": corpus(1000, 60, min_len=40, max_len=120)}
    write_docs(root / "a" / "a0.jsonl", docs["a"][:150], "jsonl")
    write_docs(root / "a" / "a1.jsonl", docs["a"][150:], "jsonl")
    write_docs(root / "b" / "b0.parquet", docs["b"], "parquet", row_group_size=10)
    recipe = {
        "seed": 3,
        "tokenizer": str(tok),
        "seq_len": 16,
        "batch_size": 2,
        "lanes": 4,
        "shuffle_window": 16,
        "split_bytes": 2000,
        "sources": [
            {"name": "a", "path": str(root / "a" / "*.jsonl"), "weight": 0.6},
            {"name": "b", "path": str(root / "b" / "*.parquet"), "weight": 0.4},
        ],
    }
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    finite = {**recipe, "sources": [{**s, "epochs": 1} for s in recipe["sources"]]}
    (root / "finite.yaml").write_text(yaml.safe_dump(finite))
    # A run killed with SIGKILL after its step-4 checkpoint.
    crashed = torchrun(
        2,
        str(TRAIN),
        "--recipe",
        str(root / "recipe.yaml"),
        "--steps",
        str(STEPS),
        "--ckpt-every",
        "4",
        "--ckpt-dir",
        str(root / "ckpt"),
        "--crash-at-step",
        "6",
        "--step-log",
        str(root / "crash"),
        check=False,
    )
    assert crashed.returncode != 0, "rank 0 must have been killed"
    return root, docs, reference_stream(recipe, 2 * STEPS)


def reference_stream(recipe: dict, batches: int) -> dict[int, str]:
    """The global stream, computed in this process: global batch g is rank g mod W's batch
    g // W for any W (here W = 1), so it is what an uninterrupted torchrun job logs."""
    sys.path.insert(0, str(TRAIN.parent))
    from train import batch_hash

    with mixer.build_loader(recipe, rank=0, world_size=1) as loader:
        return {g: batch_hash(b) for g, b in zip(range(batches), loader)}


def test_a_torchrun_job_logs_the_global_stream(job):
    root, _, reference = job
    crashed = read_logs(root / "crash")  # the batches both ranks logged before the kill
    assert set(range(10)) <= set(crashed)
    assert crashed == {g: reference[g] for g in crashed}


# a job of 2 ranks resumed on fewer ranks with workers, and on more ranks
@pytest.mark.parametrize("nproc,workers", [(1, 2), (4, 0)])
def test_resume_after_sigkill_continues_the_global_stream(job, nproc, workers, tmp_path):
    root, _, reference = job
    ckpt = tmp_path / "ckpt"
    shutil.copytree(root / "ckpt", ckpt)
    assert {p.name for p in ckpt.iterdir()} == {"step-4"}, "killed before the next checkpoint"
    crashed = read_logs(root / "crash")
    assert max(crashed) >= 10, "the crashed run went past its last checkpoint"
    steps = 4 + (2 * STEPS - 8) // nproc  # cover the reference's remaining global batches
    result = torchrun(
        nproc,
        str(TRAIN),
        "--recipe",
        str(root / "recipe.yaml"),
        "--steps",
        str(steps),
        "--ckpt-every",
        "0",
        "--ckpt-dir",
        str(ckpt),
        "--resume",
        "--num-workers",
        str(workers),
        "--step-log",
        str(tmp_path / "resumed"),
    )
    assert "resumed from" in result.stdout
    resumed = read_logs(tmp_path / "resumed")
    assert sorted(resumed) == list(range(8, 2 * STEPS))
    assert resumed == {g: h for g, h in reference.items() if g >= 8}


def test_finite_recipe_ends_on_the_same_step_on_every_rank(job, tmp_path):
    root, docs, _ = job
    torchrun(
        2,
        str(ROOT / "tests" / "dist_finite_worker.py"),
        str(root / "finite.yaml"),
        str(tmp_path / "out"),
        "2",
    )
    ranks = [json.loads((tmp_path / f"out.rank{r}").read_text()) for r in range(2)]
    assert ranks[0]["batches"] == ranks[1]["batches"] > 3
    assert all(r["state_kind"] == "global" for r in ranks)
    total: Counter = Counter()
    for r in ranks:
        total.update({int(k): v for k, v in r["counts"].items()})
    assert total == expected_counts(docs["a"]) + expected_counts(docs["b"])


def test_state_dict_on_one_rank_only_fails_loudly_instead_of_hanging(job, tmp_path):
    root, _, _ = job
    os.environ["MIXER_COLLECTIVE_TIMEOUT_S"] = "2"
    try:
        result = torchrun(
            2,
            str(ROOT / "tests" / "dist_lonely_state.py"),
            str(root / "recipe.yaml"),
            str(tmp_path / "answered"),
            check=False,
        )
    finally:
        del os.environ["MIXER_COLLECTIVE_TIMEOUT_S"]
    assert "RAISED" in result.stdout and "collective" in result.stdout, result.stdout
