"""Where a process's loader time goes: busy seconds per stage, timed per chunk of work.

Six fixed stages: `read` (waiting on storage), `decode` (decompression, record parsing),
`encode` (the tokenizer), `pack` (packing, batch assembly), `media` (image, video and audio
decoding and processing) and `transfer` (handing batches across a process boundary).

A `with timed(stage):` block around a chunk (a window of records, a tokenizer call, an image,
a batch) costs two `perf_counter` calls. Blocks nest without double counting: each thread
keeps the stage it is in, and entering an inner stage charges the outer one the time so far,
so a read inside a decode counts as `read` only. `idle()` marks a wait on another thread
(an encoding or image future) that the stage running there already counts.

The seconds of every thread of the process add up in `CLOCK`; a worker attaches
`CLOCK.snapshot()` minus its start's to the batches it sends (see runtime/lane_dataset.py).
"""

from __future__ import annotations

import os
import threading
from time import perf_counter

STAGES = ("read", "decode", "encode", "pack", "media", "transfer")
READ, DECODE, ENCODE, PACK, MEDIA, TRANSFER = range(len(STAGES))
_IDLE = len(STAGES)  # waiting on another thread: charged to no stage
_NONE = -1


class _Thread:
    """One thread's stage and its busy seconds (only that thread writes them)."""

    __slots__ = ("busy", "stage", "since", "owner")

    def __init__(self, owner: threading.Thread | None = None) -> None:
        self.busy = [0.0] * (len(STAGES) + 1)
        self.stage = _NONE
        self.since = 0.0
        self.owner = owner


class StageClock:
    """Busy seconds per stage of this process, summed over its threads.

    A thread that has ended adds no more: its seconds move into one total when a new thread
    first enters a stage, so pools that replace their threads (core/rotating.py) grow neither
    the records kept nor the cost of a snapshot."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._threads: list[_Thread] = []
        self._ended = [0.0] * len(STAGES)  # the seconds of threads that have ended
        self._lock = threading.Lock()

    def _mine(self) -> _Thread:
        try:
            return self._local.t
        except AttributeError:
            t = self._local.t = _Thread(threading.current_thread())
            with self._lock:
                self._retire_ended()
                self._threads.append(t)
            return t

    def _retire_ended(self) -> None:
        # (threading.enumerate, not is_alive: a foreign thread's stand-in, after a fork, raises
        # from is_alive)
        alive = {id(thread) for thread in threading.enumerate()}
        ended = [t for t in self._threads if t.owner is not None and id(t.owner) not in alive]
        if ended:
            self._ended = [sum(column) for column in zip(self._ended, *(t.busy for t in ended))]
            for t in ended:
                t.owner = None  # (nor is its Thread object kept)
            self._threads = [t for t in self._threads if t.owner is not None]

    def enter(self, stage: int) -> tuple[_Thread, int]:
        """Start charging `stage` (the stage this thread was in pauses); give the result to
        `leave`."""
        t = self._mine()
        now = perf_counter()
        outer = t.stage
        if outer != _NONE:
            t.busy[outer] += now - t.since
        t.stage, t.since = stage, now
        return t, outer

    def leave(self, token: tuple[_Thread, int]) -> None:
        """Stop charging the stage `enter` started; the outer one (if any) resumes."""
        t, outer = token
        now = perf_counter()
        t.busy[t.stage] += now - t.since
        t.stage, t.since = outer, now

    def snapshot(self) -> list[float]:
        """Busy seconds per stage (`STAGES` order) of all threads, finished blocks only."""
        with self._lock:
            ended, threads = self._ended, self._threads
        # (zip stops at the stages: a thread's idle seconds are left out)
        return [sum(column) for column in zip(ended, *(t.busy for t in threads))]

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # (another thread may have held it at the fork)
        self._retire_ended()  # the parent's other threads do not exist here


CLOCK = StageClock()
os.register_at_fork(after_in_child=CLOCK.after_fork_in_child)
_UNSTARTED = (_Thread(), _NONE)  # a `timed` not entered yet


class timed:
    """`with timed(stage):` charges the block's time to `stage` (an index into `STAGES`)."""

    __slots__ = ("stage", "token")

    def __init__(self, stage: int) -> None:
        self.stage = stage
        self.token = _UNSTARTED

    def __enter__(self) -> None:
        self.token = CLOCK.enter(self.stage)

    def __exit__(self, *exc: object) -> None:
        CLOCK.leave(self.token)


def idle() -> timed:
    """A block that waits on another thread's work (charged to no stage here)."""
    return timed(_IDLE)


def since(start: list[float]) -> list[float]:
    """The busy seconds per stage added since `start` (a `CLOCK.snapshot()`)."""
    return [now - then for now, then in zip(CLOCK.snapshot(), start)]
