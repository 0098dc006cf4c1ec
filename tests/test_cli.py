"""The `mixer` command line, run as a user would (a real subprocess for the console script)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import procs
import pytest
import yaml

from mixer.tools.cli import main


def write_recipe(tmp_path, recipe: dict):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_inspect_json_reports_every_source(three_sources, tmp_path, capsys):
    recipe, docs = three_sources
    path = write_recipe(tmp_path, recipe)
    assert main(["inspect", str(path), "--json", "--tokens", "1e6"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in report["sources"]}
    assert set(rows) == {"prose", "code", "web"}
    assert rows["code"]["est_documents"] == len(docs["code"])  # exact from parquet metadata
    assert abs(rows["prose"]["est_documents"] - len(docs["prose"])) <= 0.2 * len(docs["prose"])
    assert rows["web"]["files"] == 2 and rows["web"]["read_amplification"] == 2.0
    assert rows["web"]["worst_resume_bytes"] > 0
    assert rows["prose"]["repeats_per_training_tokens"] > 0
    assert abs(sum(r["weight"] for r in rows.values()) - 1) < 1e-6


def test_preview_and_bench(three_sources, tmp_path, capsys):
    recipe, _ = three_sources
    path = write_recipe(tmp_path, recipe)
    assert main(["preview", str(path), "-n", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- sequence") == 3 and "[" in out
    assert main(["bench", str(path), "--batches", "20", "--num-workers", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["batches"] == 20 and result["tokens_per_s"] > 0
    assert result["peak_rss_mb"] > 0 and result["time_to_first_batch_s"] > 0
    assert abs(sum(result["share"].values()) - 1) < 1e-6
    assert set(result["skipped"]) == {"prose", "code", "web"}


@pytest.mark.slow
def test_console_script_reports_errors_with_non_zero_exit(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("seq_len: 4\nbatch_size: 1\nsources: []\n")
    result = procs.run([sys.executable, "-m", "mixer", "validate", str(path)], timeout=120)
    assert result.returncode != 0 and "tokenizer" in result.stderr
    help_text = procs.run([sys.executable, "-m", "mixer", "--help"], timeout=120).stdout
    for command in ("validate", "inspect", "preview", "bench"):
        assert command in help_text


@pytest.mark.slow
def test_the_cli_and_import_mixer_start_without_torch():
    """`mixer --help`, `validate` and `plan` start without importing torch (it is imported
    where a batch is built): a fresh interpreter, so nothing else imported it first."""
    code = (
        "import sys; import mixer; from mixer.tools.cli import main; "
        "main(['validate', 'recipes/demo.yaml']); main(['plan', 'recipes/demo.yaml', "
        "'--tokens', '1e6']); print('torch' in sys.modules)"
    )
    result = procs.run(
        [sys.executable, "-c", code], timeout=120, cwd=str(Path(__file__).resolve().parent.parent)
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False", result.stdout


def test_version_is_the_installed_distributions(capsys):
    import importlib.metadata

    import pytest

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"mixer {importlib.metadata.version('mixer')}"
