"""Worker lifetimes: no DataLoader worker outlives the process that owns it.

torch skips its worker shutdown at interpreter exit, and a worker whose parent died leaves
its loop into multiprocessing's exit handlers, which join the result queue's feeder thread.
That thread may be blocked writing to a full pipe whose read end the sibling workers also
hold (inherited through fork), so it never returns: the worker lives on, holding its memory
and the owner's stdout/stderr. Hence two guards:

* in each worker (`worker_init`): the kernel kills it when its parent dies (Linux
  `PR_SET_PDEATHSIG`), and a watchdog thread `os._exit`s as soon as the parent changes —
  `os._exit` skips the exit handlers that hang;
* in the owner (`adopt`): an `atexit` hook stops every live worker of live loaders before
  torch's and multiprocessing's hooks run (SIGTERM, a short wait, then SIGKILL).

A main process that dies of a signal (SIGKILL, or SIGTERM/SIGINT left at their default
disposition) runs no Python code; the worker-side guards cover it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import functools
import gc
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.process import BaseProcess

from torch.utils.data import get_worker_info

from mixer.core.resources import PerProcess
from mixer.images.shared_pixels import make_in_shared_memory
from mixer.tokenize.encoding import tokenizer_thread_budget, use_worker_encoding_threads

POLL_S = 0.2  # how often a worker's watchdog looks at its parent
STOP_GRACE_S = 2.0  # how long the owner waits for SIGTERMed workers before SIGKILL
_PR_SET_PDEATHSIG = 1

_live: weakref.WeakSet[BaseProcess] = weakref.WeakSet()
_hooks: PerProcess[bool] = PerProcess()  # whether this process registered its exit hook


def adopt(processes: Iterable[BaseProcess]) -> None:
    """Register started worker processes to be stopped when this process exits."""
    _hooks.get("exit", _register_exit_hook)
    _live.update(processes)


def _register_exit_hook() -> bool:
    # Registered at the first worker start, after torch and multiprocessing registered
    # theirs: atexit runs hooks last-in first-out, so this one runs before them.
    _live.clear()  # a forked child inherits its parent's entries, not its children
    atexit.register(_stop_at_exit, os.getpid())
    return True


def _stop(processes: list[BaseProcess], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the processes (torch's worker handler exits at once when its parent sends
    it), wait up to `grace_s`, then SIGKILL what is left; reap them all."""
    for p in processes:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in processes:
        p.join(max(deadline - time.monotonic(), 0))
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join(1.0)


def _stop_at_exit(owner: int) -> None:
    if os.getpid() != owner:  # inherited through fork: not this process's workers
        return
    procs = [p for p in list(_live) if p.is_alive()]
    if not procs:
        return
    if threading.current_thread() is threading.main_thread():
        # torch's SIGCHLD handler would report a SIGKILLed worker as a crash; we are exiting.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _stop(procs)


def stop_reporting_worker_deaths() -> None:
    """This process is being stopped by a signal that its whole job got (a scheduler's or a
    terminal's SIGTERM or SIGINT to the process group): its DataLoader workers die of the same
    signal, and torch's SIGCHLD handler would raise that as a worker crash wherever the
    process is unwinding. From now on a worker's death is not reported (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, _child_ended)


def _child_ended(signum: int, frame: object) -> None:
    """A SIGCHLD while stopping: nothing to report (the workers are reaped by their owner)."""


@contextlib.contextmanager
def inherit_no_garbage() -> Iterator[None]:
    """Around forking workers: what this process holds then, garbage not yet collected
    included, is out of the workers' collector's reach (`gc.freeze`). A worker that collected
    its parent's garbage ran its finalizers there: an earlier loader's, say, whose resources
    (a shared mapping, its workers' stop event) are not the worker's.

    Young garbage is collected first (`gc.collect(1)`, well under a millisecond), so that
    unfreezing does not promote it to the oldest generation here. Objects held are inherited
    as before, and the workers' collections skip them (fewer pages copied); the price: a
    reference cycle inherited from the parent that a worker drops is never freed in that
    worker. Where the application has frozen objects itself, they stay frozen and a full
    collection runs instead (~60 ms with torch imported). Loaders starting workers in several
    threads at once freeze once, until the last has forked."""
    global _forking, _froze
    with _freeze_lock:
        if _forking == 0:
            gc.collect(1)
            _froze = gc.get_freeze_count() == 0
            if _froze:
                gc.freeze()
        _forking += 1
        if not _froze:
            gc.collect()
    try:
        yield
    finally:
        with _freeze_lock:
            _forking -= 1
            if _forking == 0 and _froze:
                gc.unfreeze()


def _forget_forking() -> None:
    global _forking, _froze, _freeze_lock
    _forking, _froze, _freeze_lock = 0, False, threading.Lock()


_forking = 0  # inherit_no_garbage blocks entered and not left, in all threads
_froze = False  # whether the first of them froze (the application had not)
_freeze_lock = threading.Lock()
os.register_at_fork(after_in_child=_forget_forking)  # (a worker's copy: not its own blocks)


def init_fn() -> Callable[[int], None]:
    """A DataLoader `worker_init_fn` for workers forked by the calling thread of this process.

    The parent-death signal is only asked for from the main thread: the kernel sends it when
    the forking *thread* exits, and any other thread may end while the workers are in use.
    """
    deathsig = threading.current_thread() is threading.main_thread()
    return functools.partial(
        worker_init,
        parent=os.getpid(),
        deathsig=deathsig,
        tokenizer_threads=tokenizer_thread_budget(),
    )


def worker_init(worker_id: int, *, parent: int, deathsig: bool, tokenizer_threads: int) -> None:
    """Inside a worker: die with the process `parent`; take this worker's share of the
    parent's `tokenizer_threads`; make batch pixels where they cross to the parent without a
    copy (`images.shared_pixels`)."""
    del worker_id
    _restore_faulthandler()
    # Ctrl-C reaches the whole process group; the owner decides when its workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if deathsig:
        _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the guards were in place
        os._exit(0)
    info = get_worker_info()
    use_worker_encoding_threads(info.num_workers if info is not None else 1, tokenizer_threads)
    make_in_shared_memory()
    threading.Thread(target=_watch, args=(parent,), name="mixer-watchdog", daemon=True).start()


def _restore_faulthandler() -> None:
    """Where the parent had faulthandler on (`python -X faulthandler`, pytest), a worker that
    crashes prints its Python stacks to its stderr: torch replaced the inherited handler with
    one that prints none (and enabling again while enabled would keep torch's). A file the
    parent gave faulthandler cannot be recovered: the stacks go to stderr; with a stderr that
    has no file descriptor torch's handler stays."""
    if not faulthandler.is_enabled():
        return
    try:
        sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):
        return
    faulthandler.disable()
    faulthandler.enable(all_threads=True)


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os._exit(0)


def _set_parent_death_signal(signum: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the watchdog thread still covers it
