"""The autoscaler's rule on the profile's own clock of the consumer's waits (one
measurement: the figures `metrics()["wait"]` reports are the ones it decides on), with time
stepped by the test."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mixer.runtime import profile
from mixer.runtime.autoscale import Autoscaler
from mixer.runtime.profile import WaitClock


class Time:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def time(monkeypatch) -> Time:
    clock = Time()
    monkeypatch.setattr(profile, "perf_counter", clock)
    return clock


def run(scaler: Autoscaler, time: Time, count: int, wait: float, step: float, busy: float, n: int):
    """`n` batches, each waited `wait` s then consumed for `step` s; the actors busy `busy`
    s a batch. The first change decided, with the batch it came after."""
    clock, busy_s = scaler.clock, 0.0
    for i in range(n):
        clock.called()
        time.now += wait
        clock.handed()
        busy_s += busy
        change = scaler.decide(count, busy_s)
        if change is not None:
            return i, change
        time.now += step
    return n, None


def test_grows_on_the_profiles_wait_share_after_a_window(time):
    clock = WaitClock()
    scaler = Autoscaler([1, 2, 4], in_flight=2, clock=clock)
    scaler.restart(1)
    at, change = run(scaler, time, 1, wait=0.02, step=0.08, busy=0.1, n=100)
    assert change is not None and change.to == 2
    assert change.wait_share == pytest.approx(0.2) and change.window_s >= 2.0
    assert at == 21  # opened at the first batch; 2 s later (20 batches of 0.1 s) it decides
    figures = profile.wait_figures(clock.raw())
    assert figures["share"] == pytest.approx(0.2)  # the same clock metrics() reports


def test_shrinks_when_the_consumer_keeps_up_and_the_actors_idle(time):
    scaler = Autoscaler([1, 2], in_flight=1, clock=WaitClock())
    scaler.restart(2)
    at, change = run(scaler, time, 2, wait=0.001, step=0.1, busy=0.05, n=100)
    assert (
        change is not None and change.to == 1 and change.idle_share == pytest.approx(0.75, abs=0.01)
    )
    assert at == 21  # the second batch (the actors' first calls done) opens a 2 s window
    busy = Autoscaler([1, 2], in_flight=1, clock=WaitClock())  # the actors work: stay
    busy.restart(2)
    assert run(busy, time, 2, wait=0.0, step=0.1, busy=0.15, n=60)[1] is None
    start = Autoscaler([2, 4], in_flight=1, clock=WaitClock())  # never below the start
    start.restart(2)
    assert run(start, time, 2, wait=0.0, step=0.1, busy=0.0, n=60)[1] is None


def test_autoscale_imports_neither_torch_nor_ray():
    code = (
        "import sys, mixer.runtime.autoscale; print('torch' in sys.modules, 'ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
