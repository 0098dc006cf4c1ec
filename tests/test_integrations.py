"""The framework adapters (mixer.integrations) under the real frameworks, on CPU.

Each test trains a tiny random-weight Llama (tests/integ_common.py) on a small recipe, saves a
checkpoint at step SAVE_AT through the framework, resumes through the framework's own resume
path and checks the batches the model saw (digests logged by its forward, a file per rank)
against the uninterrupted run and against the global stream computed here: rank r's j-th
batch of a W-rank job is global batch j·W + r. A job whose every rank SIGKILLs itself in step
KILL (after the checkpoint, with batches past it consumed) is resumed from the last checkpoint
it wrote, found by the framework, on one process (2 -> 1). The jobs are tests/integ_*_job.py.
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
STEPS, SAVE_AT, KILL = 6, 3, 5     # optimizer steps; the checkpoint step; the step killed in


def job(*cmd: str, nproc: int = 0, killed: bool = False) -> subprocess.CompletedProcess:
    """Run a job script (under torchrun with `nproc` processes), failing with its output;
    `killed`: the job must end by its ranks' SIGKILL."""
    launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}"] if nproc else [sys.executable])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "TOKENIZERS_PARALLELISM": "false"}
    result = procs.run([*launch, *cmd], timeout=JOB_TIMEOUT_S, env=env, cwd=TESTS)
    sigkilled = "exitcode  : -9" in result.stderr and "not killed" not in result.stderr
    if (result.returncode != 0, sigkilled) != (killed, killed):
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
    """`first` saw steps 0..STEPS, `resumed` SAVE_AT..STEPS, on 2 ranks; `killed` steps
    0..KILL before its SIGKILL."""
    for rank in (0, 1):
        assert read_digests(out / first, rank) == reference[rank:2 * STEPS:2]
        after = read_digests(out / resumed, rank)
        assert after == reference[2 * SAVE_AT + rank:2 * STEPS:2], f"rank {rank}"
        # equal to the uninterrupted run's batches after the checkpoint
        assert after == read_digests(out / first, rank)[SAVE_AT:]
        assert read_digests(out / "killed", rank) == reference[rank:2 * KILL:2]


def check_killed_and_resumed_on_one(out: Path, reference: list[str], first: str) -> None:
    """The SIGKILLed job resumed on one process from its checkpoint at SAVE_AT: the global
    batches after it, in order, are the uninterrupted 2-rank run's (interleaved by rank)."""
    elastic = read_digests(out / "elastic", 0)
    uninterrupted = [read_digests(out / first, step % 2)[step // 2]
                     for step in range(2 * SAVE_AT, 2 * STEPS)]
    assert elastic[:STEPS - SAVE_AT] == uninterrupted[:STEPS - SAVE_AT]
    assert elastic == reference[2 * SAVE_AT:2 * SAVE_AT + len(elastic)]


def test_hf_trainer_resumes_the_stream_on_2_and_1_processes(recipe, reference, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    args = [str(recipe), str(out), str(STEPS), str(SAVE_AT), str(KILL)]
    two = job("integ_hf_job.py", *args, "full", nproc=2, killed=True)
    check_two_ranks(out, reference, "full", "resumed")
    for step in (SAVE_AT, STEPS):
        assert (out / "run" / f"checkpoint-{step}" / "mixer_state.json").is_file()
    log = two.stdout + two.stderr
    assert "resuming the stream at global batch 6 " in log
    assert "resuming the stream at global batch 7 " in log
    assert "Fast-forwarding" not in log                  # the Trainer replayed nothing
    assert "'mixer/realized_share/prose'" in log and "'mixer/epochs/changelog'" in log
    assert "'mixer/skipped/prose'" in log
    assert not (out / "killed-run" / f"checkpoint-{STEPS}").exists()
    # SIGKILLed after checkpoint-3; 2 -> 1: its global state resumes the stream on 1 process
    one = job("integ_hf_job.py", *args, "elastic")
    check_killed_and_resumed_on_one(out, reference, "full")
    assert f"killed-run/checkpoint-{SAVE_AT}" in one.stdout + one.stderr
    assert "resuming the stream at global batch 6 " in one.stdout + one.stderr
    assert "Fast-forwarding" not in one.stdout + one.stderr
    assert "PADDING_LOSS 0.0 zero grads: True" in one.stdout


def test_lightning_datamodule_resumes_the_stream_on_2_and_1_processes(recipe, reference,
                                                                       tmp_path):
    """DDP on CPU (gloo) under torchrun: Lightning takes the environment from it."""
    out = tmp_path / "lightning"
    out.mkdir()
    args = [str(recipe), str(out), str(STEPS), str(SAVE_AT), str(KILL)]
    two = job("integ_lightning_job.py", *args, "full", nproc=2, killed=True)
    check_two_ranks(out, reference, "full", "resumed")
    log = two.stdout + two.stderr
    assert "resuming the stream at global batch 6 " in log
    assert "resuming the stream at global batch 7 " in log
    assert "CHECKPOINT_HOLDS_MIXER_STATE" in two.stdout
    metrics = (out / "full" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert "mixer/realized_share/prose" in metrics and "mixer/skipped/changelog" in metrics
    # SIGKILLed after the step-3 checkpoint (last.ckpt); 2 -> 1 through ckpt_path="last"
    one = job("integ_lightning_job.py", *args, "elastic")
    check_killed_and_resumed_on_one(out, reference, "full")
    assert len(read_digests(out / "elastic", 0)) == STEPS - SAVE_AT
    assert "resuming the stream at global batch 6 " in one.stdout + one.stderr
