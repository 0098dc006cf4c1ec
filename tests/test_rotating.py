"""Threads that call fastokens are replaced now and then (`RotatingPool`): the words cache
fastokens keeps per calling thread is then bounded by what one thread encodes, the packing
thread never calls it, and the stream is the same."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from helpers import take_digests
from hypothesis import given, settings
from hypothesis import strategies as st

import mixer
from mixer.core.rotating import RotatingPool
from mixer.tokenize import backends, encoding, verify

ROOT = Path(__file__).resolve().parent.parent
DEMO_TOKENIZER = ROOT / "data" / "tokenizer.json"


@settings(max_examples=25, deadline=None)
@given(units=st.lists(st.integers(0, 5), min_size=1, max_size=40), limit=st.integers(1, 12))
def test_a_rotating_thread_runs_tasks_in_order_one_thread_at_a_time_with_fresh_state(units, limit):
    """Tasks run in submission order; a replaced thread's successor starts only after it has
    exited (never two at once); thread-local state starts fresh in each, so it never holds
    more than `limit` units (less one, plus the task that crossed it)."""
    pool = RotatingPool(1, "test-rotating", limit)
    local = threading.local()
    done: list[int] = []
    running = []
    peak = []

    def task(i: int, weight: int) -> None:
        running.append(i)
        assert len(running) == 1, "two threads of the pool ran at once"
        local.units = getattr(local, "units", 0) + weight
        peak.append(local.units)
        done.append(i)
        running.remove(i)

    futures = [pool.submit(task, i, u, units=u) for i, u in enumerate(units)]
    for future in futures:
        future.result(timeout=30)
    assert done == list(range(len(units)))
    assert max(peak) <= limit + max(units)
    crossings, ran = 0, 0
    for u in units:  # a thread hands over once what it ran reaches the limit
        ran += u
        if ran >= limit:
            crossings, ran = crossings + 1, 0
    assert _settles(lambda: pool.replaced == crossings), (pool.replaced, crossings)


def _settles(condition, seconds: float = 10.0) -> bool:
    """(A thread hands over after its task's result is set: wait for it.)"""
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def test_a_pool_without_limit_is_never_replaced():
    pool = RotatingPool(2, "test-rotating")
    idents = {pool.submit(threading.get_ident, units=10**9).result() for _ in range(20)}
    assert pool.replaced == 0 and len(idents) <= 2


@pytest.fixture
def recipe(tmp_path: Path, monkeypatch) -> dict:
    monkeypatch.setattr(verify, "_verdicts", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    words = "the quick brown fox jumps over a lazy dog naïve café 東京 Ölgemälde 😀 3.14".split()
    lines = [
        json.dumps(
            {
                "text": " ".join(
                    words[(d * 7 + i * 3) % len(words)] + str(i % (d + 2))
                    for i in range(20 + d % 50)
                )
            }
        )
        for d in range(400)
    ]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    return {
        "seed": 5,
        "tokenizer": str(DEMO_TOKENIZER),
        "seq_len": 64,
        "batch_size": 2,
        "lanes": 4,
        "shuffle_window": 16,
        "sources": [{"name": "a", "path": str(tmp_path / "a.jsonl"), "weight": 1}],
    }


def _digests(recipe: dict, n: int = 150) -> list[str]:
    return take_digests(mixer.build_loader(recipe), n)


def test_threads_calling_fastokens_are_replaced_and_the_packing_thread_never_calls_it(
    recipe, monkeypatch
):
    """With fastokens the encoding thread is replaced every few kilobytes here (every
    `FASTOKENS_THREAD_TEXT` characters in use), chunks needed at once are encoded there and
    the verification on a thread of its own, never on the packing thread (whose words cache
    nothing would clear), and the batches are those of `tokenizers`."""
    expected = _digests({**recipe, "tokenizer_backend": "hf"})
    callers: set[str] = set()
    real_docs = backends.FastokensBackend.encode_docs
    real_batch = backends.FastokensBackend.encode_batch

    def spying_docs(self, texts, bos, eos):
        callers.add(threading.current_thread().name)
        return real_docs(self, texts, bos, eos)

    def spying_batch(self, texts):  # (the verification's calls)
        callers.add(threading.current_thread().name)
        return real_batch(self, texts)

    monkeypatch.setattr(backends.FastokensBackend, "encode_docs", spying_docs)
    monkeypatch.setattr(backends.FastokensBackend, "encode_batch", spying_batch)
    monkeypatch.setattr(encoding, "FASTOKENS_THREAD_TEXT", 2000)
    monkeypatch.setattr(encoding, "_rotate_after", None)
    monkeypatch.setattr(encoding, "_pools", type(encoding._pools)())  # (none made before)
    got = _digests({**recipe, "tokenizer_backend": "fastokens"})
    assert got == expected
    assert callers and "MainThread" not in callers, callers
    assert {name.rsplit("_", 1)[0] for name in callers} == {"mixer-tokenize", "mixer-verify"}
    replaced = sum(pool.replaced for pool in encoding._pools._own().values())
    assert replaced >= 3, replaced


def test_urgent_tasks_run_before_those_waiting_and_a_cancelled_one_not_at_all():
    pool = RotatingPool(1, "test-rotating")
    gate = threading.Event()
    order: list[str] = []
    first = pool.submit(gate.wait, 30)
    later = [pool.submit(order.append, name) for name in ("a", "b", "c")]
    later[1].cancel()
    urgent = pool.submit(order.append, "urgent", urgent=True)
    gate.set()
    for future in [first, urgent, later[0], later[2]]:
        future.result(timeout=30)
    assert order == ["urgent", "a", "c"]


def test_an_exception_reaches_the_caller_and_the_thread_goes_on():
    pool = RotatingPool(1, "test-rotating", limit=2)
    failing = pool.submit(int, "not a number", units=1)
    with pytest.raises(ValueError):
        failing.result(timeout=30)
    assert [pool.submit(len, "abc", units=1).result(timeout=30) for _ in range(5)] == [3] * 5
    assert _settles(lambda: pool.replaced == 3)


def test_a_process_exits_cleanly_with_a_task_running_and_others_queued(tmp_path):
    """At exit the running task finishes, the queued ones are cancelled, the process ends
    at once and cleanly (daemon threads would be killed inside native code)."""
    import subprocess
    import sys

    script = tmp_path / "exit.py"
    script.write_text(
        "import time\n"
        "from mixer.core.rotating import RotatingPool\n"
        "pool = RotatingPool(1, 'exiting', limit=3)\n"
        "pool.submit(time.sleep, 0.3, units=1)\n"
        "queued = [pool.submit(time.sleep, 5, units=1) for _ in range(20)]\n"
        "print('submitted', flush=True)\n"
    )
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "submitted\n", done
    assert done.stderr == ""
    assert time.monotonic() - start < 20  # (not the 100 s of the queued tasks)


def test_a_successor_starts_once_its_predecessors_thread_state_is_gone():
    """A thread's thread-local state (here one that takes a while to free, as a native cache
    may) is gone before its successor runs a task: never two threads' state at once."""
    import weakref

    pool = RotatingPool(1, "test-rotating", limit=1)
    local = threading.local()
    alive: list[int] = []
    seen: list[int] = []

    class State:
        pass

    def slowly_freed() -> None:
        time.sleep(0.05)
        alive.remove(1)

    def task() -> None:
        if not hasattr(local, "state"):
            seen.append(len(alive))  # other threads' states alive when this one begins
            local.state = State()
            alive.append(1)
            weakref.finalize(local.state, slowly_freed)

    for _ in range(6):
        pool.submit(task, units=1).result(timeout=30)
    assert _settles(lambda: pool.replaced == 6)
    assert seen == [0] * 6


def test_a_thread_that_cannot_start_leaves_no_task_unrun(monkeypatch):
    """A successor that cannot start: its predecessor goes on. No thread at all: `submit`
    raises (the task is not left queued), and the pool works once threads start again."""
    real = threading.Thread.start
    failing = {"next": False}

    def start(self):
        if self.name.startswith("test-failing") and failing["next"]:
            failing["next"] = False
            raise RuntimeError("can't start new thread")
        return real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    pool = RotatingPool(1, "test-failing", limit=1)
    failing["next"] = True
    with pytest.raises(RuntimeError):
        pool.submit(len, "ab", units=1)
    assert pool.submit(len, "abc", units=0).result(timeout=10) == 3
    failing["next"] = True  # the handover after the next task fails: the thread goes on
    assert [pool.submit(len, "abcd", units=1).result(timeout=10) for _ in range(4)] == [4] * 4
    assert _settles(lambda: pool.replaced == 3)


def test_a_pool_of_two_threads_keeps_two_after_replacements():
    pool = RotatingPool(2, "test-rotating", limit=1)
    for _ in range(5):
        pool.submit(time.sleep, 0, units=1).result(timeout=10)
    gate = threading.Event()
    blocked = pool.submit(gate.wait, 30)
    assert pool.submit(len, "ab").result(timeout=10) == 2  # (the other thread runs it)
    gate.set()
    blocked.result(timeout=10)


def test_a_cancelled_task_counts_no_work():
    pool = RotatingPool(1, "test-rotating", limit=10)
    gate = threading.Event()
    first = pool.submit(gate.wait, 30)
    cancelled = pool.submit(len, "x" * 10, units=10)
    assert cancelled.cancel()
    gate.set()
    first.result(timeout=10)
    assert pool.submit(len, "abc", units=9).result(timeout=10) == 3
    time.sleep(0.05)
    assert pool.replaced == 0


def test_an_interrupted_verification_stops_at_once(tmp_path, monkeypatch):
    """Ctrl-C during a cold verification (on a thread of its own) reaches the caller at once,
    and the verification's thread stops at its next chunk."""
    import os
    import signal

    monkeypatch.setattr(verify, "_verdicts", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    words = "the quick brown fox jumps over a lazy dog naïve café 東京 Ölgemälde".split()
    sources = []
    for k in range(12):  # 12 × 256 KB sampled: seconds of `tokenizers` one text at a time
        lines = [
            json.dumps(
                {"text": " ".join(words[(d + i * k) % len(words)] + str(d) for i in range(300))}
            )
            for d in range(400)
        ]
        (tmp_path / f"s{k}.jsonl").write_text("\n".join(lines) + "\n")
        sources.append({"name": f"s{k}", "path": str(tmp_path / f"s{k}.jsonl"), "weight": 1})
    recipe = {
        "tokenizer": str(DEMO_TOKENIZER),
        "seq_len": 64,
        "batch_size": 2,
        "tokenizer_backend": "fastokens",
        "sources": sources,
    }
    sent: list[float] = []

    def interrupt() -> None:  # once the verification runs (and has samples to encode)
        _settles(
            lambda: any(t.name.startswith("mixer-verify") for t in threading.enumerate()), 60.0
        )
        time.sleep(0.3)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt).start()
    with pytest.raises(KeyboardInterrupt):
        mixer.build_loader(recipe)
        time.sleep(30)  # (built before the interrupt came: wait for it here)
    waited = time.monotonic() - sent[0]
    assert waited < 0.5, waited
    assert not verify._verdicts  # (it came during the verification, which gave up)
    assert _settles(
        lambda: not any(t.name.startswith("mixer-verify") for t in threading.enumerate()), 2.0
    )
