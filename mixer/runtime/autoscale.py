"""Sizing the Ray actors from the consumer's side: how long the caller waits inside `next()`
(`ConsumerWait`), and when to add or remove actors (`Autoscaler`).

Growth: while the consumer waits more than `GROW_ABOVE` of its time over a window, the next
count the lanes rule allows. Shrinking: while it waits under `SHRINK_BELOW` and the actors are
idle more than `IDLE_ABOVE` of the window, the next allowed count down, never below the
starting count. A window is at least `WINDOW_S` seconds and at least 2 × `in_flight` batches
per actor; it starts again at every change, after each actor's first call of batches (the
lanes' restart is not the steady wait), so no change comes within a window of the last one.

Torch- and Ray-free; the clock is the process's monotonic one, never a stream input."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 2.0
GROW_ABOVE = 0.05
SHRINK_BELOW = 0.01
IDLE_ABOVE = 0.5


class ConsumerWait:
    """The time spent inside `next()` over the wall time of a window of batches. The waits for
    the first `skip` batches after a `restart` are left out (the last of them starts the
    window)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._asked = 0.0
        self.start: float | None = None  # when the window's first batch arrived
        self.wait_s = 0.0
        self.batches = 0  # after the first
        self._skip = 1

    def asked(self) -> None:
        """The consumer called `next()`."""
        self._asked = self.clock()

    def got(self) -> None:
        """`next()` has its batch."""
        now = self.clock()
        if self.start is None:
            self._skip -= 1
            if self._skip <= 0:
                self.start = now
            return
        self.wait_s += now - self._asked
        self.batches += 1

    def wall_s(self) -> float:
        return 0.0 if self.start is None else self.clock() - self.start

    def share(self) -> float:
        wall = self.wall_s()
        return self.wait_s / wall if wall > 0 else 0.0

    def restart(self, skip: int = 0) -> None:
        """A new window: now, or (`skip` > 0) when the `skip`-th batch from now arrives."""
        self.wait_s, self.batches, self._skip = 0.0, 0, skip
        self.start = None if skip > 0 else self.clock()


@dataclass(frozen=True)
class Change:
    """A decided change of the actor count, and the figures that caused it."""

    to: int
    wait_share: float
    idle_share: float
    window_s: float


class Autoscaler:
    """Decides the actor count among `counts` (the allowed ones from the starting count to
    `max_actors`, ascending) from the consumer's wait and the actors' busy seconds."""

    def __init__(
        self, counts: list[int], in_flight: int, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.counts = counts
        self.in_flight = in_flight
        self.wait = ConsumerWait(clock)
        self._busy_start: float | None = None  # the actors' busy seconds at the window start

    def restart(self, count: int) -> None:
        """A new window once each of `count` actors has delivered its first call of batches
        (after the lanes start on them)."""
        self.wait.restart(count * max(1, self.in_flight // 2))
        self._busy_start = None

    def decide(self, count: int, busy_s: float) -> Change | None:
        """After a batch arrived (`wait.got()`): a change of `count`, or None. `busy_s`: the
        seconds the actors have spent making batches so far, all together."""
        if self._busy_start is None or self.wait.batches == 0:
            self._busy_start = busy_s  # the window's start
        wall = self.wait.wall_s()
        if wall < WINDOW_S or self.wait.batches < 2 * self.in_flight * count:
            return None
        share = self.wait.share()
        idle = max(0.0, 1.0 - (busy_s - self._busy_start) / (count * wall))
        self.wait.restart()
        above = [c for c in self.counts if c > count]
        below = [c for c in self.counts if c < count]
        if share > GROW_ABOVE and above:
            return Change(above[0], share, idle, wall)
        if share < SHRINK_BELOW and idle > IDLE_ABOVE and below:
            return Change(below[-1], share, idle, wall)
        return None
