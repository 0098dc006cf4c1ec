"""Subprocesses for tests that stop in bounded time and say where they stuck.

`subprocess.run(..., timeout=...)` kills only its child: a torchrun job's ranks (each in its
own session) or a DataLoader's workers live on, and the failure says nothing of where they
were. `run` here, on a timeout, sends SIGABRT to the whole job (with PYTHONFAULTHANDLER=1 each
Python process prints all its threads' stacks), then SIGKILL, and fails with that output.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence

import psutil

ABORT_GRACE_S = 5.0


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def run(
    cmd: Sequence[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> subprocess.CompletedProcess:
    """Like `subprocess.run(cmd, capture_output=True, text=True)`, bounded by `timeout`.

    On a timeout raises `TimeoutError` carrying the tail of stdout and stderr, which then
    holds the stacks of every process that was still running."""
    return finish(spawn(cmd, env=env, cwd=cwd), timeout=timeout)


def spawn(
    cmd: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    new_session: bool = False,
) -> subprocess.Popen:
    """Start `cmd` with its output captured and faulthandler on (see `finish`);
    `new_session`: in a process group of its own (a job, as a scheduler starts it)."""
    env = {**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=new_session,
    )


def finish(proc: subprocess.Popen, *, timeout: float) -> subprocess.CompletedProcess:
    """Wait for a `spawn`ed process, at most `timeout` seconds (see `run`)."""
    cmd = proc.args
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stuck = _job(proc)
        summary = ", ".join(f"{p.pid} {_cmdline(p)}" for p in stuck)
        # Frozen first, so that none moves on (or starts exiting) when another one dies;
        # then resumed one at a time, each printing the stack it was stuck in before the
        # next starts (all at once, their dumps interleave on the shared stderr).
        _signal_all(stuck, signal.SIGSTOP)
        _signal_all(stuck, signal.SIGABRT)
        for one in stuck:
            _signal_all([one], signal.SIGCONT)
            if one.pid == proc.pid:
                try:
                    proc.wait(timeout=ABORT_GRACE_S)
                except subprocess.TimeoutExpired:
                    pass
            else:  # never psutil-wait the Popen child: that would reap it behind Popen
                psutil.wait_procs([one], timeout=ABORT_GRACE_S)
        _signal_all([p for p in stuck + _job(proc) if p.pid != proc.pid], signal.SIGKILL)
        proc.kill()
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a process that escaped both signals
            out, err = "", "(output lost: a process outside the job still holds its pipes)"
        raise TimeoutError(
            f"{cmd[:6]} still running after {timeout:.0f} s; processes: "
            f"{summary}\n--- stdout ---\n{(out or '')[-3000:]}\n"
            f"--- stderr (stacks) ---\n{(err or '')[-20000:]}"
        ) from None
    except BaseException:  # e.g. pytest-timeout's alarm: leave nothing of the job running
        _signal_all([p for p in _job(proc) if p.pid != proc.pid], signal.SIGKILL)
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _job(proc: subprocess.Popen) -> list[psutil.Process]:
    """The child, its descendants, and any other process holding its output pipes (a rank
    orphaned when its launcher exited is no longer anyone's descendant)."""
    pipes = {
        f"pipe:[{os.fstat(f.fileno()).st_ino}]"
        for f in (proc.stdout, proc.stderr)
        if f is not None and not f.closed
    }
    found: dict[int, psutil.Process] = {}
    try:
        found[proc.pid] = psutil.Process(proc.pid)
    except psutil.NoSuchProcess:
        pass
    for child in descendants(proc.pid):
        found[child.pid] = child
    me = os.getpid()
    for pid in psutil.pids():
        if pid in found or pid == me:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            if _writes_to(pid, fd, pipes):
                try:
                    found[pid] = psutil.Process(pid)
                except psutil.Error:
                    pass
                break
    return list(found.values())


def _writes_to(pid: int, fd: str, pipes: set[str]) -> bool:
    """Whether `pid`'s `fd` is the write end of one of `pipes` (a process forked from this
    one holds only the read ends, and is not the job's)."""
    try:
        if os.readlink(f"/proc/{pid}/fd/{fd}") not in pipes:
            return False
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            flags = int(f.read().split("flags:")[1].split()[0], 8)
    except (OSError, IndexError, ValueError):
        return False
    return flags & os.O_ACCMODE == os.O_WRONLY


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:160]
    except psutil.Error:
        return "?"
