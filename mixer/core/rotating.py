"""A thread pool whose threads are replaced by fresh ones after a given amount of work.

A native library may keep state per calling thread that grows with what the thread has
done and that nothing else can clear: fastokens keeps a cache of the words each thread has
encoded, up to ~100 MB a thread (measured by benchmarks/memory.py). A thread that
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
    never run at once (None: threads are never replaced). Threads start at the first tasks;
    at interpreter exit they finish the task they run and stop, the others are cancelled (as
    `ThreadPoolExecutor`'s: a daemon thread would be killed inside native code). Not
    fork-safe by itself: keep it in a `PerProcess`."""

    def __init__(self, threads: int, name: str, limit: int | None = None) -> None:
        self.threads = threads
        self.name = name
        self.limit = limit
        self.replaced = 0  # threads that handed over to a successor so far
        self._cond = threading.Condition()
        self._urgent: deque[_Task] = deque()
        self._queue: deque[_Task] = deque()
        self._live = 0  # threads serving the queues (a successor replaces one)
        self._spawned = 0
        self._stopping = False
        self._pid = os.getpid()
        _LIVE.add(self)

    def submit(
        self, fn: Callable[..., Any], *args: Any, units: int = 0, urgent: bool = False
    ) -> Future:
        """Run `fn(*args)` on a thread of the pool (`units` counted against its `limit`);
        `urgent`: before the tasks waiting. Raises what starting a thread raises when the
        pool has no thread to run the task."""
        future: Future = Future()
        task = (future, fn, args, units)
        with self._cond:
            if self._stopping:
                raise RuntimeError(f"{self.name}: cannot take tasks after interpreter exit")
            (self._urgent if urgent else self._queue).append(task)
            if self._live < self.threads:
                try:
                    self._spawn(None)
                except Exception:
                    if self._live == 0:  # nothing would ever run it
                        (self._urgent if urgent else self._queue).remove(task)
                        raise
            self._cond.notify()
        return future

    def _spawn(self, predecessor: threading.Thread | None) -> None:
        """Start a thread (under the lock); it replaces `predecessor` where one is given."""
        thread = threading.Thread(
            target=self._work, args=(predecessor,), name=f"{self.name}_{self._spawned}"
        )
        thread.start()
        self._spawned += 1
        if predecessor is None:
            self._live += 1

    def _take(self) -> _Task | None:
        with self._cond:
            while not (self._urgent or self._queue or self._stopping):
                self._cond.wait()
            return None if self._stopping else (self._urgent or self._queue).popleft()

    def _work(self, predecessor: threading.Thread | None) -> None:
        if predecessor is not None:
            predecessor.join()
        done = 0
        while True:
            task = self._take()
            if task is None:
                break
            done += _run(task)
            del task
            if self.limit is not None and done >= self.limit:
                with self._cond:
                    if self._stopping:
                        break
                    try:
                        self._spawn(threading.current_thread())
                    except Exception:  # (no thread to be had now: this one goes on)
                        done = 0
                        continue
                    self.replaced += 1
                    return
        with self._cond:
            self._live -= 1

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
        if pool._pid == os.getpid():  # (a forked child's copies are its parent's)
            pool._stop()


# Called before the interpreter joins its threads at exit (where `ThreadPoolExecutor` stops
# its own); a Python without it (none that mixer supports) would wait for the threads.
threading._register_atexit(_stop_all)  # type: ignore[attr-defined]


def _run(task: _Task) -> int:
    """Run a task into its future unless it was cancelled; the units it ran (0 if not)."""
    future, fn, args, units = task
    del task
    if not future.set_running_or_notify_cancel():
        return 0
    try:
        future.set_result(fn(*args))
    except BaseException as exc:  # (the caller's, raised where it takes the result)
        future.set_exception(exc)
        # The exception's traceback holds this frame: drop the task's references, or they
        # would stay alive in a cycle with the future until the cycle collector runs.
        future = fn = args = None  # type: ignore[assignment]
    return units
