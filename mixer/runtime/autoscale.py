"""When to add or remove Ray actors (`Autoscaler`), from the consumer's wait inside `next()`
as the loader's profile measures it (`profile.WaitClock`) and the actors' busy seconds.

Growth: while the consumer waits more than `GROW_ABOVE` of its time over a window, the next
count the lanes rule allows. Shrinking: while it waits under `SHRINK_BELOW` and the actors are
idle more than `IDLE_ABOVE` of the window, the next allowed count down, never below the
starting count. A window is at least `WINDOW_S` seconds and at least 2 × `in_flight` batches
per actor; it starts again at every change, after each actor's first call of batches (the
lanes' restart is not the steady wait), so no change comes within a window of the last one.

Torch- and Ray-free; the clock is the process's monotonic one, never a stream input."""

from __future__ import annotations

from dataclasses import dataclass

from mixer.runtime.profile import WaitClock

WINDOW_S = 2.0
GROW_ABOVE = 0.05
SHRINK_BELOW = 0.01
IDLE_ABOVE = 0.5


@dataclass(frozen=True)
class Change:
    """A decided change of the actor count, and the figures that caused it."""

    to: int
    wait_share: float
    idle_share: float
    window_s: float


class Autoscaler:
    """Decides the actor count among `counts` (the allowed ones from the starting count to
    `max_actors`, ascending) from the consumer's waits on `clock` and the actors' busy
    seconds. A window runs from one handed batch to a later one: the waits of the batches
    after its first, over the seconds between them."""

    def __init__(self, counts: list[int], in_flight: int, clock: WaitClock) -> None:
        self.counts = counts
        self.in_flight = in_flight
        self.clock = clock
        self._opens_at = 0  # the handed batch (count) that opens the window
        self._origin: tuple[int, float, float] | None = None  # batches, wait_s, at
        self._busy_start = 0.0  # the actors' busy seconds at the window's opening

    def restart(self, count: int) -> None:
        """A new window once each of `count` actors has delivered its first call of batches
        (after the lanes start on them)."""
        self._open(count * max(1, self.in_flight // 2))

    def _open(self, after: int) -> None:
        self._opens_at = self.clock.handed_count + after
        self._origin = None

    def decide(self, count: int, busy_s: float) -> Change | None:
        """After a batch was handed over: a change of `count`, or None. `busy_s`: the
        seconds the actors have spent making batches so far, all together."""
        clock = self.clock
        if self._origin is None:
            if clock.handed_count >= self._opens_at:
                self._origin = (clock.batches, clock.wait_s, clock.latest_at)
                self._busy_start = busy_s
            return None
        batches0, wait0, at0 = self._origin
        wall = clock.latest_at - at0
        if wall < WINDOW_S or clock.batches - batches0 < 2 * self.in_flight * count:
            return None
        share = (clock.wait_s - wait0) / wall
        idle = max(0.0, 1.0 - (busy_s - self._busy_start) / (count * wall))
        self._open(0)
        self.decide(count, busy_s)  # this batch opens the next window
        above = [c for c in self.counts if c > count]
        below = [c for c in self.counts if c < count]
        if share > GROW_ABOVE and above:
            return Change(above[0], share, idle, wall)
        if share < SHRINK_BELOW and idle > IDLE_ABOVE and below:
            return Change(below[-1], share, idle, wall)
        return None
