"""`mixer bench` reports where the loader's time goes: the stage table, the verdict line, the
JSON keys, and `--step-time` with `workers_needed` by its documented formula."""

from __future__ import annotations

import json

import pytest
from helpers import corpus, make_tokenizer, write_docs

from mixer.tools.bench_profile import workers_needed
from mixer.tools.cli import main


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    tokenizer = make_tokenizer(root / "tokenizer.json")
    for i in range(4):
        write_docs(root / "docs" / f"part-{i}.jsonl", corpus(i * 20, 20), "jsonl")
    path = root / "recipe.yaml"
    path.write_text(
        f"seed: 1\ntokenizer: {tokenizer}\ntokenizer_backend: hf\nseq_len: 32\n"
        f"batch_size: 2\nlanes: 4\nsources:\n  - name: docs\n"
        f"    path: {root / 'docs' / '*.jsonl'}\n    weight: 1\n"
    )
    return str(path)


@pytest.mark.slow
def test_bench_prints_the_stage_table_and_the_verdict(recipe, capsys):
    # A step of 0.25 s leaves the loader (a few ms a batch) slack even on a loaded machine.
    args = ["bench", recipe, "--batches", "8", "--no-progress", "--step-time", "0.25"]
    assert main(args) == 0
    out = capsys.readouterr().out
    for stage in ("read", "decode", "encode", "pack", "media", "transfer"):
        assert any(line.split()[:1] == [stage] for line in out.splitlines())
    assert "batches/s per process" in out
    verdicts = [line for line in out.splitlines() if line.startswith("bottleneck: ")]
    assert len(verdicts) == 1 and verdicts[0].startswith("bottleneck: trainer")
    assert "the loader keeps up" in verdicts[0]


@pytest.mark.slow
def test_bench_json_has_the_profile_and_the_size_of_the_data_tier(recipe, capsys):
    args = ["bench", recipe, "--batches", "8", "--json", "--step-time", "0.25"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["stages"]["encode"]) == {"busy_s", "share"}
    assert result["wait"]["batches"] == 7 and result["wait"]["share"] <= 0.05
    assert result["bottleneck"] == "trainer"
    cpu = result["cpu_s_per_batch"]
    assert cpu > 0 and result["step_time_s"] == 0.25
    assert result["workers_needed"] == workers_needed(cpu, 0.25, 4)
    assert main(["bench", recipe, "--batches", "4", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "workers_needed" not in plain and "stages" in plain


def test_workers_needed_is_the_smallest_valid_count_that_keeps_the_wait_under_5_percent():
    # 12 lanes: 1, 2, 3, 4, 6, 12 workers are valid. wait(n) = max(0, c/n - S) <= S/19.
    assert workers_needed(0.001, 0.1, 12) == 0  # c <= S/19: in-process keeps up
    assert workers_needed(0.1, 0.1, 12) == 1
    assert workers_needed(0.25, 0.1, 12) == 3  # 0.25/2 - 0.1 > 0.1/19; 0.25/3 < 0.1
    assert workers_needed(0.5, 0.1, 12) == 6  # 5 is not valid
    assert workers_needed(2.0, 0.1, 12) is None  # 12 workers: 0.167 - 0.1 > 0.1/19
    assert workers_needed(None, 0.1, 12) is None
