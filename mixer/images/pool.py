"""A small thread pool that runs the most urgent job first.

Every lane prefetches the images of the documents it will need soon, so the queue holds work
for many future batches at once. A first-in-first-out queue would make the batch needed now
wait behind images needed many batches later; here each job carries the global batch at
which it is needed, and free threads take the smallest. Results do not depend on the order
(pixels are a pure function of the bytes and the plan); only waiting times do.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class PriorityPool:
    """`threads` daemon threads running submitted callables, lowest priority first."""

    def __init__(self, threads: int, name: str = "mixer-image") -> None:
        self._heap: list[tuple[int, int, Future, Callable[[], Any]]] = []
        self._order = itertools.count()  # ties: first submitted first
        self._ready = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, priority: int, fn: Callable[[], Any]) -> Future:
        """Run `fn` when no job of a lower priority waits; its result comes in the future.
        A future cancelled before a thread takes it never runs."""
        future: Future = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the pool is shut down")
            heapq.heappush(self._heap, (priority, next(self._order), future, fn))
            self._ready.notify()
        return future

    def queued(self) -> int:
        """Jobs submitted and not yet taken by a thread."""
        return len(self._heap)

    def shutdown(self) -> None:
        """Stop taking jobs; queued ones still run, then the threads end."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def stop(self, timeout: float) -> None:
        """Cancel the queued jobs, stop taking new ones, and wait up to `timeout` seconds for
        the running ones to end (at interpreter exit: a daemon thread still inside a C++
        library, torch's video resize for one, when the interpreter finalizes can abort the
        process with "terminate called without an active exception")."""
        with self._ready:
            for _, _, future, _ in self._heap:
                future.cancel()
            self._heap.clear()
        self.shutdown()
        end = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._heap and not self._closed:
                    self._ready.wait()
                if not self._heap:
                    return
                _, _, future, fn = heapq.heappop(self._heap)
            _run(future, fn)
            # An idle thread keeps no reference to its last job: the callable (a bound
            # method of an image handle, with its stored bytes) is freed with its owner.
            del future, fn


def _run(future: Future, fn: Callable[[], Any]) -> None:
    if not future.set_running_or_notify_cancel():
        return  # taken back by its owner (see LazyImage.pixels)
    try:
        future.set_result(fn())
    except BaseException as exc:  # handed to whoever waits on the future
        future.set_exception(exc)
