"""A time limit on a block of a test that holds even where the code under test is careless.

A single SIGALRM is not enough: its handler runs wherever the main thread is, and an
exception raised while Python runs a finalizer (`__del__`, a weakref callback) is printed and
dropped, so a one-shot alarm can be lost and the block spin on for ever (it did, in CI: the
loader's known spin below a far schedule point ran past every limit). `deadline` raises
`Hang`, a BaseException that no `except Exception`/`except OSError` swallows, and raises it
again every half second until the block ends. It restores the timer it replaced, so
pytest-timeout's own alarm for the test still fires.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator

REPEAT_S = 0.5


class Hang(BaseException):
    """The block ran past its `deadline`."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise `Hang` in the main thread once `seconds` have passed in the block."""

    def fire(*_: object) -> None:
        raise Hang(f"still running after {seconds} s")

    start = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, fire)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds, REPEAT_S)
    try:
        yield
    finally:
        while True:  # an alarm may land here too: stop the timer before anything else
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                break
            except Hang:
                continue
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:
            left = old_delay - (time.monotonic() - start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.01), old_interval)
