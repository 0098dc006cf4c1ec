"""SIGINT and SIGTERM during `mixer bench` with workers, to the command alone or to its whole
process group (a batch scheduler's or a terminal's signal, which the workers get too): status
130 / 143, no traceback, and no process of the command left running."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import procs
import psutil
import pytest
import yaml

pytestmark = [pytest.mark.slow]

START_S = 120  # for the console script to import torch, fork its workers and log batches


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("group", [False, True], ids=["command", "group"])
@pytest.mark.parametrize(
    "signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_bench_with_workers_stops_on_a_signal(tmp_path, three_sources, signum, status, group):
    recipe, _ = three_sources
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    log = tmp_path / "metrics.jsonl"
    mixer = str(Path(sys.executable).with_name("mixer"))
    proc = procs.spawn(
        [
            mixer,
            "bench",
            str(path),
            "--batches",
            str(10**9),
            "--num-workers",
            "2",
            "--no-progress",
            "--metrics-out",
            str(log),
        ],
        new_session=group,
    )
    try:
        deadline = time.monotonic() + START_S
        # the log's first buffered lines reach the file once batches are flowing
        while not (log.exists() and log.stat().st_size) and proc.poll() is None:
            assert time.monotonic() < deadline, "bench produced no batches"
            time.sleep(0.05)
        workers = procs.descendants(proc.pid)
        assert proc.poll() is None and len(workers) >= 2, "bench is not running its workers"
        if group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
    finally:
        done = procs.finish(proc, timeout=60)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert "killed by signal" not in done.stderr, done.stderr
    assert done.returncode == status, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"error: stopped by {signum.name}"
    psutil.wait_procs(workers, timeout=5)
    assert not [w.pid for w in workers if _alive(w)], "a worker outlived `mixer bench`"
