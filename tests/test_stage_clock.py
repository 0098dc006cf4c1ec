"""The stage clock under threads that come and go: pools replace their threads after an amount
of work (core/rotating.py), so a long run sees thousands of them; their seconds must keep
counting while the clock's records, and the cost of a snapshot, stay those of the live ones."""

from __future__ import annotations

import os
import threading
import time

import pytest

from mixer.core.stages import DECODE, ENCODE, StageClock, timed


def _busy(clock: StageClock, stage: int, seconds: float) -> None:
    token = clock.enter(stage)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    clock.leave(token)


def test_ended_threads_keep_their_seconds_and_leave_no_record():
    clock = StageClock()
    for _ in range(200):
        worker = threading.Thread(target=_busy, args=(clock, ENCODE, 0.0005))
        worker.start()
        worker.join()
    assert len(clock._threads) <= 1  # each new thread retired the one before it
    before = clock.snapshot()
    assert before[ENCODE] >= 200 * 0.0005
    last = threading.Thread(target=_busy, args=(clock, DECODE, 0.0))
    last.start()
    last.join()
    after = clock.snapshot()
    assert len(clock._threads) <= 1
    assert after[ENCODE] == pytest.approx(before[ENCODE], rel=1e-12)  # moved, not added


def test_a_thread_ending_between_snapshots_is_counted_once():
    clock = StageClock()
    go, done = threading.Event(), threading.Event()

    def work() -> None:
        _busy(clock, ENCODE, 0.002)
        go.set()
        done.wait()

    worker = threading.Thread(target=work)
    worker.start()
    go.wait()
    before = clock.snapshot()[ENCODE]
    done.set()
    worker.join()
    last = threading.Thread(target=_busy, args=(clock, DECODE, 0.0))  # retires the ended one
    last.start()
    last.join()
    assert clock.snapshot()[ENCODE] == before


def test_a_forked_child_can_time_and_snapshot_while_a_parent_thread_held_the_lock():
    from mixer.core.stages import CLOCK

    CLOCK.snapshot()
    with timed(ENCODE):
        pass
    holder_in, release = threading.Event(), threading.Event()

    def hold() -> None:
        with CLOCK._lock:
            holder_in.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    holder_in.wait()

    def check() -> bool:  # the lock was held by a thread that does not exist here
        child_thread = threading.Thread(target=_busy, args=(CLOCK, DECODE, 0.001))
        child_thread.start()
        child_thread.join(5)
        CLOCK.snapshot()
        return not child_thread.is_alive()

    try:
        assert _in_child(check) == 0, "the forked child hung on the stage clock's lock"
    finally:
        release.set()
        holder.join()


def _in_child(check) -> int:
    """Fork, run `check` in the child; the child's exit status (0: it passed)."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if check() else 3)
        except BaseException:
            os._exit(4)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return -9


def test_a_thread_python_did_not_start_is_timed_in_the_parent_and_after_a_fork():
    """Threads of C libraries (pyarrow's readers) call into Python as threading's stand-ins,
    which raise from `is_alive` in a forked child: the clock must work there all the same."""
    import _thread

    from mixer.core.stages import CLOCK

    entered = threading.Event()

    def foreign() -> None:
        with timed(DECODE):
            pass
        entered.set()
        time.sleep(0.5)

    _thread.start_new_thread(foreign, ())
    assert entered.wait(5)

    def check() -> bool:
        errors: list[BaseException] = []

        def work() -> None:
            try:
                with timed(ENCODE):
                    pass
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=work)
        thread.start()
        thread.join(5)
        CLOCK.snapshot()
        return not errors and not thread.is_alive()

    assert _in_child(check) == 0
