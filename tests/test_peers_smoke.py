"""benchmarks/peers.py runs end to end on a tiny corpus and prints a sane table."""

from __future__ import annotations

import sys
from pathlib import Path

import procs
import pytest

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "benchmarks" / "peers.py"


def _table(output: str) -> dict[str, list[str]]:
    rows = {}
    for line in output.splitlines():
        if line.startswith("| ") and not line.startswith("| loader"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def test_peers_table_on_a_tiny_corpus(tmp_path):
    # The peer libraries (datasets, torchdata) are optional extras: only mixer and the
    # hand-written generator run here, next to the tokenizer bound.
    out = procs.run(
        [
            sys.executable,
            str(PEERS),
            "--mb",
            "1",
            "--vocab",
            "4096",
            "--batches",
            "4",
            "--loaders",
            "generator,mixer",
            "--workers",
            "0",
            "--workdir",
            str(tmp_path),
        ],
        timeout=240,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = _table(out.stdout)
    mixer_rows = ["mixer num_workers=0, cache cold", "mixer num_workers=0, cache warm"]
    assert {"tokenizer alone", "hand-written generator", *mixer_rows} <= set(rows)
    for name in ("tokenizer alone", "hand-written generator", *mixer_rows):
        tokens_per_s, ratio = rows[name][0], rows[name][1]
        assert float(tokens_per_s.replace(",", "")) > 0, rows[name]
        assert float(ratio) > 0, rows[name]
    assert float(rows["tokenizer alone"][1]) == 1.0
    # mixer's resume row restarts from the saved state and gets the very batch that followed
    for name in mixer_rows:
        assert rows[name][3].endswith("(same batch)"), rows[name]
        shares = rows[name][5]
        assert shares.startswith("prose ") and " / code " in shares and " / web " in shares


def test_missing_peer_library_becomes_a_skipped_row(monkeypatch, tmp_path):
    sys.path.insert(0, str(PEERS.parent))
    import peers

    real = peers.importlib.util.find_spec
    monkeypatch.setattr(
        peers.importlib.util,
        "find_spec",
        lambda name: None if name in ("datasets", "torchdata") else real(name),
    )
    args = peers.argparse.Namespace(workdir=tmp_path, workers=[0], loaders=None)
    notes = {label: skip for label, _, _, skip in peers.plan_rows(args)}
    assert notes["HF datasets streaming"] == "datasets not installed"
    assert notes["torchdata.nodes"] == "torchdata not installed"
    assert notes["hand-written generator"] is None


def test_paired_harness_on_a_tiny_corpus(tmp_path):
    """benchmarks/paired.py alternates mixer (with and without workers) and the tokenizer
    alone in one process and reports both sides' rates and CPU."""
    for workers in ("0", "2"):
        out = procs.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "paired.py"),
                "--mb",
                "1",
                "--vocab",
                "4096",
                "--rounds",
                "2",
                "--phase",
                "3",
                "--workers",
                workers,
                "--workdir",
                str(tmp_path),
            ],
            timeout=240,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        rounds = [
            line
            for line in out.stdout.splitlines()
            if line.startswith("| 1 |") or line.startswith("| 2 |")
        ]
        assert len(rounds) == 2, out.stdout
        for line in rounds:
            mixer_rate, bound_rate, ratio = (
                float(c.strip().replace(",", "")) for c in line.strip("|").split("|")[1:]
            )
            assert mixer_rate > 0 and bound_rate > 0 and ratio > 0
        assert f"mixer num_workers={workers}" in out.stdout
        assert "| tokenizer alone |" in out.stdout and "| mixer |" in out.stdout
