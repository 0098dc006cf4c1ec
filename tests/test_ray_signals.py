"""A signal to the whole process group of a driver using Ray actors (what a batch scheduler
sends to every process of a job step, or a terminal's Ctrl-C) ends it quietly: SIGTERM with
status 143 (-15 here), SIGINT as a KeyboardInterrupt the driver's loop catches, no traceback
from the actors' death, and the actors and the local cluster's processes (its agents too)
stopped. The local cluster's processes are outside the driver's process group, so the
signal reaches the driver alone. Real processes, a real local cluster the driver starts
(tests/ray_signal_driver.py), real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import corpus, make_tokenizer, write_docs

pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

DRIVER = Path(__file__).with_name("ray_signal_driver.py")


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("signals")
    for part in range(2):
        write_docs(root / f"d{part}.jsonl", corpus(part * 100, 400, max_len=20), "jsonl")
    return {
        "seed": 5,
        "tokenizer": str(make_tokenizer(root / "tokenizer.json")),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 2,
        "shuffle_window": 4,
        "sources": [{"name": "docs", "path": str(root / "*.jsonl"), "weight": 1}],
    }


def session_processes(session: int) -> dict[int, tuple[int, str]]:
    """pid → (process group, command) of the processes of a session."""
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,sid=,args="], capture_output=True, text=True)
    found = {}
    for line in out.stdout.splitlines():
        pid, pgid, sid, *args = line.split(None, 3)
        if int(sid) == session and int(pid) != os.getpid():
            found[int(pid)] = (int(pgid), args[0] if args else "")
    return found


@pytest.mark.parametrize(
    ("sig", "status", "said"), [(signal.SIGTERM, -15, ""), (signal.SIGINT, 130, "interrupted")]
)
def test_a_signal_to_the_process_group_ends_the_driver_quietly(recipe, sig, status, said):
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    driver = subprocess.Popen(
        [sys.executable, str(DRIVER), json.dumps(recipe)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        ready = driver.stdout.readline().split() if driver.stdout else []
        assert ready[:1] == ["ready"], driver.communicate(timeout=60)
        actors = [int(pid) for pid in ready[2:]]
        # Only the driver is in the group the signal goes to: a raylet dying of it would end
        # the driver (Ray's core worker exits with status 1) before the driver's handler runs.
        cluster = {p: seen for p, seen in session_processes(driver.pid).items() if p != driver.pid}
        assert cluster, "the local cluster runs in the driver's session"
        in_group = {pid: cmd for pid, (group, cmd) in cluster.items() if group == driver.pid}
        assert not in_group, f"the local cluster's processes in the driver's group: {in_group}"
        time.sleep(0.3)  # the actors busy making batches
        os.killpg(driver.pid, sig)
        out, err = driver.communicate(timeout=60)
        assert driver.returncode == status, err
        assert out.strip() == said
        for word in ("Traceback", "Error", "died", "replacing"):
            assert word not in err, err
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and session_processes(driver.pid):
            time.sleep(0.2)
        left = session_processes(driver.pid)
        assert not set(actors) & set(left), f"actors outlived the driver: {left}"
        assert not left, f"the local cluster's processes outlived the driver: {left}"
    finally:
        if driver.poll() is None:
            driver.kill()
        for pid in session_processes(driver.pid):  # Ray's own daemons left behind, if any
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
