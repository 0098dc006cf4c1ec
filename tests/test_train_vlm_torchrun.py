"""examples/train_vlm.py under torchrun (2 ranks, gloo): a job resumed from a mid-run
checkpoint sees the same image+text batches, and computes the same losses, as the
uninterrupted job."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import write_docs
from image_data import Sample, make_vlm_tokenizer, write_tar
from test_torchrun import torchrun as run_torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train_vlm.py"


def torchrun(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run_torchrun(2, str(TRAIN), *args, check=check)


def logs(prefix: Path) -> dict[int, tuple[str, float | None]]:
    out: dict[int, tuple[str, float | None]] = {}
    for path in prefix.parent.glob(prefix.name + ".rank*"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            out[record["global"]] = (record["hash"], record["loss"])
    return out


def test_resumed_vlm_training_sees_the_same_batches_and_losses(tmp_path):
    rng = np.random.default_rng(3)
    tok = make_vlm_tokenizer(tmp_path / "tok.json")
    for shard in range(2):
        samples = [
            Sample(d, int(rng.integers(3, 15)), [(56, 56)] * int(rng.integers(0, 3)), fmt="png")
            for d in range(shard * 30, shard * 30 + 30)
        ]
        write_tar(tmp_path / "pics" / f"{shard}.tar", samples)
    write_docs(
        tmp_path / "prose.jsonl", [(500 + i, int(rng.integers(5, 40))) for i in range(60)], "jsonl"
    )
    recipe = {
        "seed": 1,
        "tokenizer": str(tok),
        "seq_len": 64,
        "batch_size": 2,
        "lanes": 4,
        "images": {"layout": "qwen2_vl", "min_pixels": 784, "max_pixels": 56 * 56},
        "sources": [
            {"name": "pics", "path": str(tmp_path / "pics" / "*.tar"), "weight": 0.6},
            {"name": "prose", "path": str(tmp_path / "prose.jsonl"), "weight": 0.4},
        ],
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    common = ["--recipe", str(tmp_path / "recipe.yaml"), "--num-workers", "1"]
    # The reference job checkpoints at steps 3 and 6; a job killed with SIGKILL at step 5
    # would leave the same step-3 checkpoint (test_torchrun kills one), so the resume
    # starts from a copy of it.
    torchrun(
        *common,
        "--steps",
        "6",
        "--ckpt-every",
        "3",
        "--ckpt-dir",
        str(tmp_path / "ref"),
        "--step-log",
        str(tmp_path / "reference"),
    )
    shutil.copytree(tmp_path / "ref" / "step-3", tmp_path / "ckpt" / "step-3")
    result = torchrun(
        *common,
        "--steps",
        "6",
        "--ckpt-every",
        "0",
        "--ckpt-dir",
        str(tmp_path / "ckpt"),
        "--resume",
        "--step-log",
        str(tmp_path / "resumed"),
    )
    assert "resumed from" in result.stdout
    reference, resumed = logs(tmp_path / "reference"), logs(tmp_path / "resumed")
    assert sorted(reference) == list(range(12)) and sorted(resumed) == list(range(6, 12))
    assert resumed == {g: v for g, v in reference.items() if g >= 6}
