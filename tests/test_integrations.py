"""The framework adapters (mixer.integrations) under the real frameworks, on CPU.

Each test trains a tiny random-weight Llama (tests/integ_common.py) on a small recipe, saves a
checkpoint at step SAVE_AT through the framework, resumes through the framework's own resume
path and checks the batches the model saw (digests logged by its forward, a file per rank)
against the uninterrupted run and against the global stream computed here: rank r's j-th
batch of a W-rank job is global batch j·W + r. The jobs live in tests/integ_*_job.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import procs
import pytest
import yaml
from integ_common import digest, read_digests, recipe_dict

import mixer

TESTS = Path(__file__).resolve().parent
JOB_TIMEOUT_S = 120
STEPS, SAVE_AT = 6, 3     # optimizer steps; the checkpoint step


def job(*cmd: str, nproc: int = 0) -> subprocess.CompletedProcess:
    """Run a job script (under torchrun with `nproc` processes), failing with its output."""
    launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}"] if nproc else [sys.executable])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "TOKENIZERS_PARALLELISM": "false"}
    result = procs.run([*launch, *cmd], timeout=JOB_TIMEOUT_S, env=env, cwd=TESTS)
    if result.returncode != 0:
        raise AssertionError(result.stdout[-3000:] + result.stderr[-10000:])
    return result


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("integrations") / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_dict()))
    return path


@pytest.fixture(scope="module")
def reference(recipe) -> list[str]:
    """The global stream's first batches (any world size yields it: the lanes rule)."""
    with mixer.build_loader(str(recipe), rank=0, world_size=1) as loader:
        return [digest(b) for _, b in zip(range(2 * STEPS + 4), loader)]


def check_two_ranks(out: Path, reference: list[str], first: str, resumed: str) -> None:
    """`first` saw steps 0..STEPS, `resumed` SAVE_AT..STEPS, on 2 ranks."""
    for rank in (0, 1):
        assert read_digests(out / first, rank) == reference[rank:2 * STEPS:2]
        after = read_digests(out / resumed, rank)
        assert after == reference[2 * SAVE_AT + rank:2 * STEPS:2], f"rank {rank}"
        # equal to the uninterrupted run's batches after the checkpoint
        assert after == read_digests(out / first, rank)[SAVE_AT:]


def test_hf_trainer_resumes_the_stream_on_2_and_1_processes(recipe, reference, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    args = [str(recipe), str(out), str(STEPS), str(SAVE_AT)]
    two = job("integ_hf_job.py", *args, "full", nproc=2)
    check_two_ranks(out, reference, "full", "resumed")
    for step in (SAVE_AT, STEPS):
        assert (out / "run" / f"checkpoint-{step}" / "mixer_state.json").is_file()
    log = two.stdout + two.stderr
    assert "resuming the stream at global batch 6 " in log
    assert "resuming the stream at global batch 7 " in log
    assert "Fast-forwarding" not in log                  # the Trainer replayed nothing
    assert "'mixer/realized_share/prose'" in log and "'mixer/epochs/changelog'" in log
    assert "'mixer/skipped/prose'" in log
    # 2 -> 1: the checkpoint's global state resumes the global stream on one process
    one = job("integ_hf_job.py", *args, "elastic")
    elastic = read_digests(out / "elastic", 0)
    assert elastic[:STEPS - SAVE_AT] == reference[2 * SAVE_AT:2 * SAVE_AT + STEPS - SAVE_AT]
    assert "resuming the stream at global batch 6 " in one.stdout + one.stderr
    assert "PADDING_LOSS 0.0 zero grads: True" in one.stdout


def test_lightning_datamodule_resumes_the_stream_on_2_and_1_processes(recipe, reference,
                                                                       tmp_path):
    """DDP on CPU (gloo) under torchrun: Lightning takes the environment from it."""
    out = tmp_path / "lightning"
    out.mkdir()
    args = [str(recipe), str(out), str(STEPS), str(SAVE_AT)]
    two = job("integ_lightning_job.py", *args, "full", nproc=2)
    check_two_ranks(out, reference, "full", "resumed")
    log = two.stdout + two.stderr
    assert "resuming the stream at global batch 6 " in log
    assert "resuming the stream at global batch 7 " in log
    assert "CHECKPOINT_HOLDS_MIXER_STATE" in two.stdout
    metrics = (out / "full" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert "mixer/realized_share/prose" in metrics and "mixer/skipped/changelog" in metrics
    one = job("integ_lightning_job.py", *args, "elastic")
    elastic = read_digests(out / "elastic", 0)
    assert elastic == reference[2 * SAVE_AT:2 * SAVE_AT + STEPS - SAVE_AT]
    assert "resuming the stream at global batch 6 " in one.stdout + one.stderr
