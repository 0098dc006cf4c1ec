"""A thread pool whose threads are replaced by fresh ones after a given amount of work.

A native library may keep state per calling thread that grows with what the thread has
done and that nothing else can clear: fastokens keeps a cache of the words each thread has
encoded, up to ~100 MB a thread (docs/benchmarks.md, "Issue 22, round 6"). A thread that
exits takes its thread-local state with it, so handing the work to a new thread now and then
bounds that state by what one thread does before it is replaced.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_Task = tuple[Future, Callable[..., Any], tuple[Any, ...], int]


class RotatingPool:
    """`threads` worker threads taking tasks in submission order, `urgent` ones first. A
    thread that has run `limit` units of work (a caller's measure, given with each task)
    starts its successor and exits; the successor takes tasks once it has exited, so the two
    never hold their state at once (None: threads are never replaced). Threads start at the
    first task; at interpreter exit they finish the task they run and stop, the others are
    cancelled (as `ThreadPoolExecutor`'s: a daemon thread would be killed inside native code).
    Not fork-safe by itself: keep it in a `PerProcess`."""

    def __init__(self, threads: int, name: str, limit: int | None = None) -> None:
        self.threads = threads
        self.name = name
        self.limit = limit
        self.replaced = 0            # threads that handed over to a successor so far
        self._cond = threading.Condition()
        self._urgent: deque[_Task] = deque()
        self._queue: deque[_Task] = deque()
        self._started = 0
        self._stopping = False
        self._pid = os.getpid()
        _LIVE.add(self)

    def submit(self, fn: Callable[..., Any], *args: Any, units: int = 0,
               urgent: bool = False) -> Future:
        """Run `fn(*args)` on a thread of the pool (`units` counted against its `limit`);
        `urgent`: before the tasks waiting."""
        future: Future = Future()
        with self._cond:
            if self._stopping:
                raise RuntimeError(f"{self.name}: cannot take tasks after interpreter exit")
            (self._urgent if urgent else self._queue).append((future, fn, args, units))
            if self._started < self.threads:
                self._start(None)
            self._cond.notify()
        return future

    def _start(self, predecessor: threading.Thread | None) -> None:
        self._started += 1
        threading.Thread(target=self._work, args=(predecessor,),
                         name=f"{self.name}_{self._started - 1}").start()

    def _take(self) -> _Task | None:
        with self._cond:
            while not (self._urgent or self._queue or self._stopping):
                self._cond.wait()
            return None if self._stopping else (self._urgent or self._queue).popleft()

    def _work(self, predecessor: threading.Thread | None) -> None:
        if predecessor is not None:
            predecessor.join()
        done = 0
        while self.limit is None or done < self.limit:
            task = self._take()
            if task is None:
                return
            done += _run(task)
            del task
        with self._cond:
            if not self._stopping:
                self.replaced += 1
                self._start(threading.current_thread())

    def _stop(self) -> None:
        with self._cond:
            self._stopping = True
            for future, *_ in [*self._urgent, *self._queue]:
                future.cancel()
            self._urgent.clear()
            self._queue.clear()
            self._cond.notify_all()


_LIVE: weakref.WeakSet[RotatingPool] = weakref.WeakSet()


def _stop_all() -> None:
    for pool in list(_LIVE):
        if pool._pid == os.getpid():   # (a forked child's copies are its parent's)
            pool._stop()


# Called before the interpreter joins its threads at exit (where `ThreadPoolExecutor` stops
# its own); a Python without it (none that mixer supports) would wait for the threads.
threading._register_atexit(_stop_all)   # type: ignore[attr-defined]


def _run(task: _Task) -> int:
    """Run a task into its future (unless it was cancelled); its units."""
    future, fn, args, units = task
    if future.set_running_or_notify_cancel():
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # (the caller's, raised where it takes the result)
            future.set_exception(exc)
    return units
