"""`tokenizer_backend: auto` with no verdict kept: the first batches never wait for the
fastokens verification. `tokenizers` encodes until its verdict is in, on a thread of its own,
and fastokens from then on (in the loader's process and in DataLoader workers forked before
it): the same ids, so the same stream wherever the switch falls. A refusal, an exception or a
hang there leaves `tokenizers`; `close()` and an interrupt stop it.

The verification is slowed through its seam, `mixer.tokenize.verify.verify` (the background
thread calls it through its module): the assertions are on the stream and on the order of
batches and verdict, not on times."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import procs
import pytest
from helpers import batch_digest, take_digests

import mixer
from mixer.tokenize import background, verify
from mixer.tokenize.backends import FastokensBackend

ROOT = Path(__file__).resolve().parent.parent
DEMO_TOKENIZER = ROOT / "data" / "tokenizer.json"
MARKER = "ZEBRAMARKER"
BATCHES = 40
_WORDS = "the quick brown fox jumps over a lazy dog naïve café 東京 Ölgemälde 😀 3.14".split()


def _text(seed: int, words: int) -> str:
    return " ".join(_WORDS[(seed * 7 + i * 13) % len(_WORDS)] + str(i % 9) for i in range(words))


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> dict:
    """Two jsonl sources of a few hundred documents (a stream's first chunks are a few
    dozen of them: the switch comes before the 40th batch's); source b's sixth holds MARKER."""
    root = tmp_path_factory.mktemp("corpus")
    for name, seed in (("a", 0), ("b", 1000)):
        texts = [_text(seed + d, 100 + d % 200) for d in range(300)]
        if name == "b":
            texts[5] += f" and {MARKER} here"
        for f in range(4):
            lines = [json.dumps({"text": t}) for t in texts[f::4]]
            (root / f"{name}{f}.jsonl").write_text("\n".join(lines) + "\n")
    return {
        "seed": 5,
        "tokenizer": str(DEMO_TOKENIZER),
        "seq_len": 256,
        "batch_size": 4,
        "lanes": 2,
        "shuffle_window": 16,
        "sources": [
            {"name": "a", "path": str(root / "a*.jsonl"), "weight": 0.5},
            {"name": "b", "path": str(root / "b*.jsonl"), "weight": 0.5},
        ],
    }


@pytest.fixture(scope="module")
def reference(recipe, tmp_path_factory) -> list[str]:
    """The stream with `tokenizers` alone, which fastokens alone makes too."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))
        mp.setattr(verify, "_verdicts", {})
        hf = take_digests(mixer.build_loader({**recipe, "tokenizer_backend": "hf"}), BATCHES)
        fast = mixer.build_loader({**recipe, "tokenizer_backend": "fastokens"})
        assert take_digests(fast, BATCHES) == hf
    return hf


@pytest.fixture(autouse=True)
def fresh_verdicts(monkeypatch, tmp_path):
    """No verdict in memory or kept: every loader of a test verifies (in the background)."""
    monkeypatch.setattr(verify, "_verdicts", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def fastokens_calls(monkeypatch, tmp_path: Path):
    """Record each process that encodes stream documents with fastokens (forked workers
    inherit the patch); returns a function giving the pids recorded so far."""
    log = tmp_path / "fastokens-pids"
    real = FastokensBackend.encode_docs

    def encode_docs(self, texts, bos, eos):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(self, texts, bos, eos)

    monkeypatch.setattr(FastokensBackend, "encode_docs", encode_docs)
    return lambda: set(log.read_text().split()) if log.exists() else set()


def held_verification(monkeypatch, order: list[str]) -> threading.Event:
    """The verification waits (10 s at most) until the event is set, stepping meanwhile (it
    may be stopped there), then verifies as it would; `order` gets "verified" when it has."""
    release = threading.Event()
    real = verify.verify

    def held(recipe, info, tables, steps=None):
        deadline = time.monotonic() + 10
        while not release.wait(0.01) and time.monotonic() < deadline:
            if steps is not None:
                with steps:
                    pass
        try:  # (steps are given on the background thread)
            return real(recipe, info, tables, *([] if steps is None else [steps]))
        finally:
            order.append("verified")

    monkeypatch.setattr(verify, "verify", held)
    return release


def digests_after_the_verdict(loader) -> list[str]:
    """BATCHES batch digests, the background verification awaited after the first; then the
    loader is closed."""
    got = []
    for batch in loader:
        got.append(batch_digest(batch))
        if len(got) == 1:
            assert loader.backend.background.wait(30)
        if len(got) == BATCHES:
            break
    loader.close()
    return got


def threads_verifying() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("mixer-verify")]


@pytest.mark.parametrize(("workers", "switch_after"), [(0, 1), (0, 7), (2, 1)])
def test_the_first_batches_come_before_the_verdict_and_the_switch_keeps_the_stream(
    recipe, reference, monkeypatch, tmp_path, workers, switch_after
):
    order: list[str] = []
    used = fastokens_calls(monkeypatch, tmp_path)
    release = held_verification(monkeypatch, order)
    loader = mixer.build_loader(recipe, num_workers=workers)
    assert loader.backend.describe() == (
        "tokenizers until fastokens is verified (verifying in the background)"
    )
    got = []
    for batch in loader:
        got.append(batch_digest(batch))
        order.append("batch")
        if len(got) == switch_after:
            assert loader.backend.encoding == "hf" and not used()  # (no verdict yet)
            release.set()
            assert loader.backend.background.wait(30)
            assert loader.backend.encoding == "fastokens"
        if len(got) == BATCHES:
            break
    loader.close()
    assert got == reference
    assert order[: switch_after + 1] == ["batch"] * switch_after + ["verified"]
    # fastokens encoded the rest: in this process, or in the workers forked before the verdict
    pids = used()
    assert pids and (str(os.getpid()) in pids) == (workers == 0), pids
    assert loader.backend.describe() == (
        "fastokens (verified in the background on 436 documents, 0.5 MB; tokenizers until then)"
    )
    assert list((tmp_path / "xdg").rglob("backend-*.json"))  # kept for the next start
    warm = mixer.build_loader(recipe, num_workers=workers)
    assert warm.backend.background is None and warm.backend.encoding == "fastokens"
    warm.close()


def test_a_refusal_found_in_the_background_keeps_tokenizers_and_warns(
    recipe, reference, monkeypatch, tmp_path, caplog
):
    real = FastokensBackend.encode_batch  # (what the verification compares; the stream
    # encodes through encode_docs, which is left alone)

    def altered(self, texts):
        out = real(self, texts)
        return [[i + 1 for i in ids] if MARKER in t else ids for t, ids in zip(texts, out)]

    monkeypatch.setattr(FastokensBackend, "encode_batch", altered)
    used = fastokens_calls(monkeypatch, tmp_path)
    caplog.set_level(logging.INFO, logger="mixer.tokenizer")
    loader = mixer.build_loader(recipe, num_workers=2)
    got = digests_after_the_verdict(loader)
    assert got == reference and not used()
    lines = [r for r in caplog.records if r.name == "mixer.tokenizer" and r.levelno >= logging.INFO]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    message = lines[0].getMessage()
    assert message.startswith("tokenizer backend: tokenizers (fastokens: differs on source 'b'")
    assert message == f"tokenizer backend: {loader.backend.describe()}"
    assert loader.backend.encoding == "hf"


def test_a_verification_that_raises_leaves_tokenizers(recipe, reference, monkeypatch, caplog):
    def raising(*args):
        raise RuntimeError("no verdict today")

    monkeypatch.setattr(verify, "verify", raising)
    caplog.set_level(logging.WARNING, logger="mixer.tokenizer")
    loader = mixer.build_loader(recipe)
    got = digests_after_the_verdict(loader)
    assert got == reference
    why = "the fastokens verification raised RuntimeError: no verdict today"
    assert loader.backend.describe() == f"tokenizers ({why})"
    assert [r.getMessage() for r in caplog.records] == [
        f"tokenizer backend: tokenizers ({why}; the same ids)"
    ]


def test_a_verification_that_hangs_never_stalls_the_stream(recipe, reference, monkeypatch):
    """Hung between steps: the stream goes on. Hung inside a step when workers fork: the
    fork waits `FORK_WAIT_S`, then the verification is abandoned and the workers keep
    `tokenizers` (they never touch the library the hung step is inside)."""
    hang, inside = threading.Event(), threading.Event()

    def hung(recipe, info, tables, steps=None):
        with steps:
            inside.set()
            hang.wait(60)
        raise AssertionError("released")

    monkeypatch.setattr(verify, "verify", hung)
    monkeypatch.setattr(background, "FORK_WAIT_S", 0.2)
    monkeypatch.setattr(background, "STOP_WAIT_S", 0.2)
    loader = mixer.build_loader(recipe, num_workers=2)
    try:
        got = []
        for batch in loader:  # (workers forked before the verification began)
            got.append(batch_digest(batch))
            if len(got) == 3:
                break
        assert inside.wait(30)
        # a new iteration forks new workers while the step hangs (from the states handed out)
        got += take_digests(loader, BATCHES - 3)
        assert got == reference
        assert loader.backend.describe() == (
            "tokenizers (the fastokens verification abandoned: a step ran over 0.2 s while "
            "processes forked)"
        )
    finally:
        hang.set()
        loader.close()
    assert not threads_verifying()


def test_close_during_the_verification_stops_it_and_leaves_no_thread(recipe, monkeypatch):
    order: list[str] = []
    held_verification(monkeypatch, order)
    loader = mixer.build_loader(recipe, num_workers=0)
    assert len(take_digests(loader, 2)) == 2  # (closes the loader: its verification began)
    assert not threads_verifying()
    assert order == [] and loader.backend.encoding == "hf"
    assert loader.backend.describe() == "tokenizers (the fastokens verification stopped)"
    assert not verify._verdicts
    unused = mixer.build_loader(recipe)  # never iterated: no thread (it begins at a batch)
    assert not threads_verifying()
    unused.close()
    assert unused.backend.describe() == "tokenizers (the fastokens verification stopped)"


def test_a_required_fastokens_is_verified_before_the_loader_is_built(recipe, monkeypatch):
    """`tokenizer_backend: fastokens` refuses at build time where it is not verified."""
    order: list[str] = []
    release = held_verification(monkeypatch, order)
    release.set()
    loader = mixer.build_loader({**recipe, "tokenizer_backend": "fastokens"})
    assert order == ["verified"] and loader.backend.background is None
    assert loader.backend.encoding == "fastokens"


INTERRUPTED_SCRIPT = """
import contextlib, sys, time
import mixer
from mixer.tokenize import verify

def slow(recipe, info, tables, steps=None):  # a minute of steps
    for _ in range(6000):
        with steps or contextlib.nullcontext():
            time.sleep(0.01)
    return verify._verify(recipe, info, tables, steps)

verify.verify = slow
loader = mixer.build_loader(sys.argv[1])
next(iter(loader))  # (the verification begins)
print("first batch", flush=True)
raise KeyboardInterrupt
"""


@pytest.mark.slow
def test_an_interrupt_ends_the_process_without_waiting_for_the_verification(recipe, tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(recipe))
    start = time.monotonic()
    out = procs.run(
        [sys.executable, "-c", INTERRUPTED_SCRIPT, str(tmp_path / "r.json")],
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "xdg")},
    )
    assert "first batch" in out.stdout and "KeyboardInterrupt" in out.stderr, out.stderr[-2000:]
    assert time.monotonic() - start < 40  # (the verification alone would take 60 s)
