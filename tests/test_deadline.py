"""The tests' own time limit (tests/deadline.py) holds where a single alarm would be lost."""

from __future__ import annotations

import signal
import time

import pytest
from deadline import Hang, deadline


class SlowFinalizer:
    def __del__(self) -> None:
        time.sleep(0.5)  # the first alarm lands here; Python prints it and drops it


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_alarm_dropped_in_a_finalizer_is_raised_again():
    start = time.monotonic()
    with pytest.raises(Hang), deadline(0.2):
        SlowFinalizer()  # dropped at once: its __del__ runs here, past the deadline
        while True:  # a spin that only an alarm can end
            pass
    assert time.monotonic() - start < 3


def test_the_replaced_timer_and_handler_come_back():
    before_handler = signal.getsignal(signal.SIGALRM)
    before_left, _ = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's, in `make test`
    if before_left == 0:
        signal.setitimer(signal.ITIMER_REAL, 60)
        before_left = 60
    with deadline(5):
        time.sleep(0.2)
    left, _ = signal.getitimer(signal.ITIMER_REAL)
    try:
        assert signal.getsignal(signal.SIGALRM) is before_handler
        assert before_left - 1 < left < before_left
    finally:
        if before_left == 60:
            signal.setitimer(signal.ITIMER_REAL, 0)
