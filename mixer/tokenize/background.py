"""A fastokens verification on a thread of its own, while the stream encodes with `tokenizers`.

`tokenizer_backend: auto` with no verdict kept for the corpus verifies fastokens (about a
second: the stress text and the sources' samples, encoded by both libraries) off the first
batch's path, from the moment the loader has made its first batch (before it, the two would
share the cores): encoders built on a `TokenizerInfo` whose `verifying` names a `Verification`
encode with `tokenizers` until its verdict is in, then with fastokens from their next call on
(`Encoder.backend`). Both give the same ids, so the stream is the same wherever the switch
falls.

Processes forked while it runs (DataLoader workers) learn the verdict through one byte of
memory mapped before the fork; the verification runs in steps (each a library call: loading
fastokens, encoding a chunk, reading the samples) and a fork waits for the step under way to
end (`FORK_WAIT_S` at most: past it the verification is abandoned and the children keep
`tokenizers`), so no child inherits a lock a verifying thread holds inside a library. A
verification stops at its next step when it is stopped (`stop`: `Loader.close`) or when the
interpreter exits; one that raises or is stopped leaves `tokenizers` encoding.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

PENDING, FASTOKENS, TOKENIZERS = 0, 1, 2  # the shared byte: no verdict yet, and the two
FORK_WAIT_S = 5.0  # a fork waits this long at most for the step under way (then abandons it)
STOP_WAIT_S = 5.0  # `stop` waits this long at most for the thread to end
log = logging.getLogger("mixer.tokenizer")


class Stopped(Exception):
    """The verification was stopped (or the interpreter is exiting): it gives up."""


class Steps:
    """The steps of one verification: `with steps:` around each library call. Entering
    raises `Stopped` once the verification is stopped or the interpreter exits; a fork
    happens only between steps (see the module docstring)."""

    def __init__(self, stop: threading.Event | None = None) -> None:
        self.stop = stop if stop is not None else threading.Event()
        self.lock = threading.Lock()  # held through a step

    def stopped(self) -> bool:
        return self.stop.is_set() or not threading.main_thread().is_alive()

    def __enter__(self) -> Steps:
        if self.stopped():
            raise Stopped
        self.lock.acquire()
        if self.stopped():
            self.lock.release()
            raise Stopped
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


_keys = itertools.count()
_by_key: weakref.WeakValueDictionary[str, Verification] = weakref.WeakValueDictionary()


class Verification:
    """`run(steps)` on a thread of its own, once `begin` is called: it returns (ok,
    verdict); the shared byte then says FASTOKENS or TOKENIZERS (`verified`) and
    `settle(ok, verdict)` is called, inside a step. An exception out of `run` (or `settle`)
    leaves TOKENIZERS, with one WARNING; `verdict` stays None and `why` says what happened."""

    def __init__(
        self,
        run: Callable[[Steps], tuple[bool, Any]],
        settle: Callable[[bool, Any], None],
    ) -> None:
        self.key = f"{os.getpid()}-{next(_keys)}"
        self.verdict: Any = None
        self.why = ""  # where the verification ended without a verdict: why
        self.steps = Steps()
        self._run, self._settle = run, settle
        self._byte = mmap.mmap(-1, 1)  # (anonymous, shared with the processes forked later)
        self._owner = os.getpid()
        _by_key[self.key] = self
        # Not a daemon: one killed at exit inside a library call aborts the process; it
        # stops at its next step instead (`Steps.stopped`).
        self._thread = threading.Thread(target=self._main, name="mixer-verify", daemon=False)
        self._started = threading.Lock()
        self._transition = threading.Lock()  # (PENDING is left once)

    @property
    def state(self) -> int:
        """PENDING, FASTOKENS or TOKENIZERS, as this process (or the one it was forked from)
        knows it."""
        return self._byte[0]

    def begin(self) -> None:
        """Start the thread (once; the loader does when its first batch is made), unless the
        verification was stopped first."""
        if os.getpid() != self._owner or self._thread.ident is not None:
            return  # (a forked copy has no thread of its own; started already)
        with self._started:
            if self._thread.ident is None and self.state == PENDING:
                self._thread.start()

    def _main(self) -> None:
        try:
            ok, verdict = self._run(self.steps)
            with self.steps:
                if self._settle_on(FASTOKENS if ok else TOKENIZERS, verdict=verdict):
                    self._settle(ok, verdict)
        except Stopped:
            self._end("stopped")
        except BaseException as exc:  # (pyo3's PanicException is no Exception)
            if self._end(f"raised {type(exc).__name__}: {str(exc)[:200]}"):
                self._warn_ended()

    def _settle_on(self, state: int, *, verdict: Any = None, why: str = "") -> bool:
        """Leave PENDING for `state` with `verdict` (or, without one, `why`); False where a
        verdict or an end came first (a fork abandoning the verification meanwhile)."""
        with self._transition:
            if self._byte[0] != PENDING:
                return False
            self.verdict, self.why = verdict, why
            self._byte[0] = state
            return True

    def _end(self, why: str) -> bool:
        """No verdict: `tokenizers` for good (unless a verdict or an end came first)."""
        return self._settle_on(TOKENIZERS, why=why)

    def _warn_ended(self) -> None:
        log.warning(
            "tokenizer backend: tokenizers (the fastokens verification %s; the same ids)",
            self.why,
        )

    def stop(self, wait: float | None = None) -> None:
        """Stop the verification at its next step (no verdict: `tokenizers` goes on) and wait
        for its thread to end, `wait` seconds at most (default `STOP_WAIT_S`)."""
        wait = STOP_WAIT_S if wait is None else wait
        if os.getpid() != self._owner:
            return
        self.steps.stop.set()
        with self._started:
            if self._thread.ident is None:  # never begun: no verdict
                self._end("stopped")
                return
        if self._thread.is_alive():
            self._thread.join(wait)
            if self._thread.is_alive():
                log.debug("the fastokens verification is still inside a step after %s s", wait)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the verification to end (`begin` it first); whether it has."""
        if os.getpid() == self._owner and self._thread.ident is not None:
            self._thread.join(timeout)
        return self.state != PENDING

    def alive(self) -> bool:
        """Whether its thread still runs (in the process that started it)."""
        return os.getpid() == self._owner and self._thread.is_alive()


def verified(key: str) -> int:
    """The state of verification `key` in this process: TOKENIZERS where it is unknown here
    (a spawned process or a Ray actor: it never learns the verdict)."""
    found = _by_key.get(key)
    return TOKENIZERS if found is None else found.state


# -- forks wait for the step under way --------------------------------------------------------
_paused: list[Verification] = []


def _before_fork() -> None:
    for job in list(_by_key.values()):
        if not job.alive() or job.state != PENDING:  # (past its last library call)
            continue
        if job.steps.lock.acquire(timeout=FORK_WAIT_S):
            _paused.append(job)
        elif job._end(f"abandoned: a step ran over {FORK_WAIT_S:g} s while processes forked"):
            # (a step that does not end: the children must not touch its library)
            job.steps.stop.set()
            job._warn_ended()


def _after_fork_in_parent() -> None:
    while _paused:
        _paused.pop().steps.lock.release()


def _after_fork_in_child() -> None:
    _paused.clear()
    for job in list(_by_key.values()):  # (its thread does not run here)
        job.steps.lock, job._transition = threading.Lock(), threading.Lock()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
