"""Joining a Ray cluster, and what signals do to the driver of a local one.

Without an address (and no `RAY_ADDRESS`) the loader starts a cluster of this machine alone,
on the loopback address. Its processes (GCS, raylet, agents, and the actors the raylet
starts) get a process group of their own: a signal to the driver's group, which is what a
batch scheduler sends to a job step and a terminal's Ctrl-C, then reaches the driver alone,
and the driver ends the cluster. Were the raylet in the driver's group it would die of the
same SIGTERM first, and Ray's core worker ends a driver whose raylet died with exit status 1
before the driver's own handler runs. The cluster's processes still die with the driver when
it is killed outright (Ray binds them to their parent).

A loader keeps the process's own SIGTERM handling (Ray's would turn the signal into
`SystemExit(15)` in the middle of a batch); a process with the default handling that starts a
local cluster ends that cluster on SIGTERM and then dies of the signal (status 143).

`ray` is imported here only inside functions: `import mixer` never imports it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_END_S = 20.0  # the longest a SIGTERM waits for the local cluster to end


def connect(address: str | None) -> Any:
    """The `ray` module, joined to the cluster at `address`, to `RAY_ADDRESS`'s, or to a new
    local one (see the module's docstring); a process already joined stays joined."""
    local = address is None and not os.environ.get("RAY_ADDRESS")
    if local and "ray" not in sys.modules:
        # A cluster of this machine alone stays on the loopback address: Ray otherwise binds
        # the machine's outward address (it reads this before `import ray`).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return ray
    main = threading.current_thread() is threading.main_thread()
    on_term = signal.getsignal(signal.SIGTERM) if main else None
    if not local:
        ray.init(address=address)
    else:
        with _own_process_group():
            ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1")
        if on_term == signal.SIG_DFL:
            on_term = _ending_local_cluster(ray)
    if on_term is not None:
        # ray.init makes SIGTERM raise SystemExit(15) wherever the driver is: a job
        # scheduler's SIGTERM would end in tracebacks instead of exit status 143.
        signal.signal(signal.SIGTERM, on_term)
    return ray


@contextmanager
def _own_process_group() -> Iterator[None]:
    """The processes Ray starts meanwhile each lead a process group of their own (the
    raylet's workers join the raylet's)."""
    from ray._private import services

    popen = getattr(services, "ConsolePopen", None)
    if popen is None:  # a Ray that starts its processes otherwise: they keep the driver's group
        yield
        return

    class GroupLeader(popen):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("process_group", 0)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = GroupLeader
    try:
        yield
    finally:
        services.ConsolePopen = popen


def _ending_local_cluster(ray: Any) -> Any:
    """A SIGTERM handler for a driver that started its own cluster: end it, then die of the
    signal as by default (status 143, no traceback); at most `_END_S` seconds."""

    def on_term(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        stuck = threading.Timer(_END_S, os._exit, (128 + signal.SIGTERM,))
        stuck.daemon = True
        stuck.start()
        try:
            ray.shutdown()
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    return on_term
