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
from integ_common import ROOT, digest, read_digests, recipe_dict, titan_view

import mixer

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TESTS = Path(__file__).resolve().parent
JOB_TIMEOUT_S = 120
STEPS, SAVE_AT, KILL = 6, 3, 5  # optimizer steps; the checkpoint step; the step killed in


def job(*cmd: str, nproc: int = 0, killed: bool = False) -> subprocess.CompletedProcess:
    """Run a job script (under torchrun with `nproc` processes), failing with its output;
    `killed`: the job must end by its ranks' SIGKILL."""
    launch = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        if nproc
        else [sys.executable]
    )
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "TOKENIZERS_PARALLELISM": "false",
    }
    result = procs.run([*launch, *cmd], timeout=JOB_TIMEOUT_S, env=env, cwd=TESTS)
    sigkilled = "exitcode  : -9" in result.stderr  # torchrun's summary of a SIGKILLed rank
    if (result.returncode != 0, sigkilled) != (killed, killed):
        raise AssertionError(result.stdout[-3000:] + result.stderr[-10000:])
    return result


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("integrations") / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_dict()))
    return path


@pytest.fixture(scope="module")
def batches(recipe) -> list[dict]:
    """The global stream's first batches (any world size yields it: the lanes rule)."""
    with mixer.build_loader(str(recipe), rank=0, world_size=1) as loader:
        return [b for _, b in zip(range(2 * STEPS + 4), loader)]


@pytest.fixture(scope="module")
def reference(batches) -> list[str]:
    return [digest(b) for b in batches]


def check_two_ranks(out: Path, reference: list[str], first: str, resumed: str) -> None:
    """`first` saw steps 0..STEPS, `resumed` SAVE_AT..STEPS, on 2 ranks; `killed` steps
    0..KILL before its SIGKILL."""
    for rank in (0, 1):
        assert read_digests(out / first, rank) == reference[rank : 2 * STEPS : 2]
        after = read_digests(out / resumed, rank)
        assert after == reference[2 * SAVE_AT + rank : 2 * STEPS : 2], f"rank {rank}"
        # equal to the uninterrupted run's batches after the checkpoint
        assert after == read_digests(out / first, rank)[SAVE_AT:]
        assert read_digests(out / "killed", rank) == reference[rank : 2 * KILL : 2]


def check_killed_and_resumed_on_one(out: Path, reference: list[str], first: str) -> None:
    """The SIGKILLed job resumed on one process from its checkpoint at SAVE_AT: the global
    batches after it, in order, are the uninterrupted 2-rank run's (interleaved by rank)."""
    elastic = read_digests(out / "elastic", 0)
    uninterrupted = [
        read_digests(out / first, step % 2)[step // 2] for step in range(2 * SAVE_AT, 2 * STEPS)
    ]
    assert elastic[: STEPS - SAVE_AT] == uninterrupted[: STEPS - SAVE_AT]
    assert elastic == reference[2 * SAVE_AT : 2 * SAVE_AT + len(elastic)]


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
    assert "Fast-forwarding" not in log  # the Trainer replayed nothing
    assert "'mixer/realized_share/prose'" in log and "'mixer/target_share/changelog'" in log
    assert "'mixer/skipped/prose'" in log and "'mixer/wait/share'" in log
    assert "'mixer/epochs/" not in log and "'mixer/tokens/" not in log  # left to metrics()
    assert not (out / "killed-run" / f"checkpoint-{STEPS}").exists()
    # SIGKILLed after checkpoint-3; 2 -> 1: its global state resumes the stream on 1 process
    one = job("integ_hf_job.py", *args, "elastic")
    check_killed_and_resumed_on_one(out, reference, "full")
    assert f"killed-run/checkpoint-{SAVE_AT}" in one.stdout + one.stderr
    assert "resuming the stream at global batch 6 " in one.stdout + one.stderr
    assert "Fast-forwarding" not in one.stdout + one.stderr
    assert "PADDING_LOSS 0.0 zero grads: True" in one.stdout


def test_lightning_datamodule_resumes_the_stream_on_2_and_1_processes(recipe, reference, tmp_path):
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


def test_torchtitan_batches_are_next_token_aligned_and_the_builder_checks_the_training(
    recipe, batches
):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from mixer.integrations.torchtitan import MixerDataLoader, titan_batch

    inputs, labels = titan_batch(batches[0])
    assert inputs["input"].equal(batches[0]["input_ids"])
    assert inputs["positions"].equal(batches[0]["position_ids"])
    assert labels[:, :-1].equal(batches[0]["labels"][:, 1:])  # torchtitan's loss never shifts
    assert (labels[:, -1] == -100).all()
    config = MixerDataLoader.Config(recipe=str(recipe))
    with pytest.raises(
        mixer.RecipeError, match=r"training.seq_len is 64 but .* has seq_len: 32 \(tokens per row\)"
    ):
        config.build(dp_world_size=1, dp_rank=0, seq_len=64, local_batch_size=2)
    with pytest.raises(
        mixer.RecipeError, match=r"training.local_batch_size is 8 but .* has batch_size: 2 \(rows"
    ):
        config.build(dp_world_size=1, dp_rank=0, seq_len=32, local_batch_size=8)
    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(ROOT / "data"))  # the recipe's
    loader = config.build(
        dp_world_size=2, dp_rank=1, tokenizer=tokenizer, seq_len=32, local_batch_size=2
    )
    inputs, labels = next(iter(loader))  # DP rank 1 of 2: global batch 1
    assert digest(titan_view(inputs, labels)) == digest(titan_view(*titan_batch(batches[1])))
    loader.close()


def test_torchtitan_checkpoint_manager_resumes_the_stream_after_sigkill_on_2_and_1_ranks(
    recipe, batches, tmp_path
):
    """torchtitan's CheckpointManager (DCP) in a torchtitan loop on 2 gloo ranks: SIGKILLed in
    step KILL, resumed from its latest checkpoint on 2 ranks and on one DP rank."""
    from mixer.integrations.torchtitan import titan_batch

    stream = [digest(titan_view(*titan_batch(b))) for b in batches]
    out = tmp_path / "titan"
    out.mkdir()
    args = [str(recipe), str(out), str(STEPS), str(SAVE_AT), str(KILL)]
    job("integ_titan_job.py", *args, "killed", nproc=2, killed=True)
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == [f"step-{SAVE_AT}"]
    resumed = job("integ_titan_job.py", *args, "resume", nproc=2)
    for rank in (0, 1):
        killed = read_digests(out / "killed", rank)
        after = read_digests(out / "resumed", rank)
        assert killed == stream[rank : 2 * KILL : 2]
        assert after == stream[2 * SAVE_AT + rank : 2 * STEPS : 2]
        assert after[: KILL - SAVE_AT] == killed[SAVE_AT:]  # what the killed job saw past it
    assert read_digests(out / "elastic", 0) == stream[2 * SAVE_AT : 2 * SAVE_AT + STEPS - SAVE_AT]
    log = resumed.stdout + resumed.stderr
    sums = [b["input_ids"].sum().item() for b in batches[:2]]
    for rank in (0, 1):  # two processes of one DP rank: the same batches, a global state
        assert f"ONE_DP_RANK {rank} {sums} 2" in resumed.stdout
    for line in (
        "resumed: rank 0 of 2 starts after step 3",
        "elastic: rank 0 of 1 starts after step 3",
        "resuming the stream at global batch 6 ",
        "resuming the stream at global batch 7 ",
    ):
        assert line in log


def test_tensorboard_log_metrics_writes_the_loaders_metrics_as_scalars(recipe, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from mixer.integrations.common import BOTTLENECKS
    from mixer.integrations.tensorboard import log_metrics

    writer = SummaryWriter(str(tmp_path / "tb"))
    with mixer.build_loader(str(recipe), rank=0, world_size=1) as loader:
        for step, _ in zip((1, 2), loader):
            written = log_metrics(writer, loader, step)
        metrics = loader.metrics()
    writer.close()
    events = EventAccumulator(str(tmp_path / "tb"))  # TensorBoard's own reader
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert tags == set(written) and "mixer/global_tokens" in tags
    for key in ("realized_share", "target_share", "epochs", "skipped", "tokens"):
        for source in ("prose", "changelog"):
            scalars = events.Scalars(f"mixer/{key}/{source}")
            assert [s.step for s in scalars] == [1, 2]
            assert scalars[-1].value == pytest.approx(metrics[key][source], rel=1e-6)
    assert events.Scalars("mixer/global_tokens")[-1].value == 2 * 2 * 32
    # The profile: the caller's wait and the bottleneck (an index, and its name as text).
    assert {"mixer/wait/share", "mixer/wait/p99_ms", "mixer/bottleneck"} <= tags
    assert events.Scalars("mixer/wait/share")[-1].value == pytest.approx(
        metrics["wait"]["share"], rel=1e-6
    )
    index = int(events.Scalars("mixer/bottleneck")[-1].value)
    assert BOTTLENECKS[index] == metrics["bottleneck"]
    texts = events.Tensors("mixer/bottleneck/text_summary")
    assert texts[-1].tensor_proto.string_val[0].decode() == metrics["bottleneck"]
    assert log_metrics(None, loader, 3) == written  # a rank without a writer: nothing written
