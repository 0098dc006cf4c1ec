"""The image pool runs the most urgent job first, and a job taken back never runs."""

from __future__ import annotations

import threading

from mixer.images.pool import PriorityPool


def test_free_threads_take_the_lowest_priority_first_and_cancelled_jobs_never_run():
    pool = PriorityPool(1)
    gate = threading.Event()
    ran: list[int] = []
    blocker = pool.submit(-1, gate.wait)  # holds the only thread while jobs queue up
    futures = {p: pool.submit(p, lambda p=p: ran.append(p) or p) for p in (5, 3, 9, 1, 7)}
    assert futures[7].cancel()  # taken back before a thread took it
    gate.set()
    blocker.result(timeout=10)
    assert [futures[p].result(timeout=10) for p in (1, 3, 5, 9)] == [1, 3, 5, 9]
    assert ran == [1, 3, 5, 9]
    assert futures[7].cancelled()
    pool.shutdown()


def test_errors_reach_whoever_waits():
    pool = PriorityPool(2)
    future = pool.submit(0, lambda: 1 / 0)
    try:
        future.result(timeout=10)
    except ZeroDivisionError:
        pass
    else:
        raise AssertionError("the job's exception was lost")
    pool.shutdown()
