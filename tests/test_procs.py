"""The test suite's own subprocess bound (tests/procs.py): a stuck job ends the test with the
stacks of every process in it, even when a grandchild in its own session holds the pipes."""

from __future__ import annotations

import sys
import time

import procs
import psutil
import pytest

pytestmark = [pytest.mark.distributed]

# The child starts a grandchild in a new session (as torchrun starts its ranks) that inherits
# stdout/stderr and waits forever in a named function, then waits on it.
JOB = """
import subprocess, sys
code = "def stuck_in_grandchild():\\n    import time\\n    while True: time.sleep(1)\\n" \\
       "print('ready', flush=True)\\nstuck_in_grandchild()"
child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
child.wait()
"""


@pytest.mark.slow
def test_a_stuck_job_fails_in_time_with_every_process_stack():
    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        procs.run([sys.executable, "-c", JOB], timeout=3)
    assert time.monotonic() - started < 20
    message = str(info.value)
    assert "still running after 3 s" in message
    assert "in stuck_in_grandchild\n" in message  # the grandchild's stack, via faulthandler
    assert " in wait\n" in message  # the child's own stack
    grandchildren = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "stuck_in_grandchild" in " ".join(p.info["cmdline"] or [])
    ]
    assert not grandchildren, "the grandchild was left running"


def test_a_quick_job_returns_its_output_and_status():
    done = procs.run([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], timeout=60)
    assert (done.returncode, done.stdout.strip()) == (3, "out")


# The child starts the grandchild in a new session and exits at once: the grandchild, an
# orphan holding the pipes, is no longer anyone's descendant (as a rank whose torchrun died).
ORPHANING_JOB = JOB.replace("child.wait()", "")


@pytest.mark.slow
def test_an_orphan_holding_the_pipes_is_found_and_ended():
    with pytest.raises(TimeoutError) as info:
        procs.run([sys.executable, "-c", ORPHANING_JOB], timeout=3)
    assert "in stuck_in_grandchild\n" in str(info.value)
    time.sleep(0.5)
    left = [
        p
        for p in psutil.process_iter(["cmdline", "status"])
        if "stuck_in_grandchild" in " ".join(p.info["cmdline"] or [])
        and p.info["status"] != psutil.STATUS_ZOMBIE
    ]
    assert not left, "the orphan was left running"
