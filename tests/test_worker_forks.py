"""What forked DataLoader workers take from their parent, and how they say they crashed."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import mixer
from mixer.runtime import worker_processes

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import ctypes
    import io
    import resource
    import sys

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))   # (the crash below writes no core file)
    from torch.utils.data import DataLoader, IterableDataset
    from mixer.runtime import worker_processes

    class Crashing(IterableDataset):
        def __iter__(self):
            ctypes.string_at(0)   # reads address 0: SIGSEGV
            yield 1

    if sys.argv[1:] == ["no-fd"]:
        sys.stderr = io.StringIO()   # (an application's own stderr, with no file descriptor)
    try:
        list(DataLoader(Crashing(), num_workers=1, multiprocessing_context="fork",
                        worker_init_fn=worker_processes.init_fn()))
    except RuntimeError as exc:
        print("parent saw:", exc)
""")


@pytest.mark.slow
def test_a_worker_crash_prints_its_python_stack_under_faulthandler():
    # torch puts its own SIGSEGV handler in each worker, which prints no stack; the workers
    # mixer starts put faulthandler's back where the parent had it on.
    run = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Fatal Python error: Segmentation fault" in run.stderr
    assert "in __iter__" in run.stderr and "string_at" in run.stderr
    assert "parent saw:" in run.stdout  # and the loader still reports the dead worker


@pytest.mark.slow
def test_a_worker_crash_is_still_reported_where_stderr_has_no_descriptor():
    # faulthandler cannot write to such a stderr: torch's handler stays, which says at
    # least that the worker crashed
    run = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", SCRIPT, "no-fd"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Unexpected segmentation fault encountered in worker" in run.stderr
    assert "parent saw:" in run.stdout


class _Witness:
    """Garbage in a reference cycle that notes in `path` which process finalized it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cycle = self

    def __del__(self) -> None:
        with open(self.path, "a") as out:
            out.write(f"{os.getpid()}\n")


@pytest.mark.slow
@pytest.mark.parametrize("app_froze", [False, True])
def test_workers_never_finalize_garbage_their_parent_had_not_collected(
    tmp_path, monkeypatch, app_froze
):
    """Garbage of the parent's, not yet collected when workers fork, is finalized in the
    parent alone: a worker that collected it ran its finalizers on resources that were
    not its own (an earlier loader's shared ring: the worker unmapped its own memory).
    Also where the application froze its objects itself (`gc.freeze` before forking, as
    Python's documentation advises) and garbage came after."""
    assert gc.get_freeze_count() == 0
    finalized = tmp_path / "finalized"
    real_init = worker_processes.worker_init

    def init_then_collect(*args, **kwargs):
        real_init(*args, **kwargs)
        gc.collect()  # (the worker's collector would get there some time)

    monkeypatch.setattr(worker_processes, "worker_init", init_then_collect)
    recipe = {
        **yaml.safe_load((ROOT / "recipes" / "demo.yaml").read_text()),
        "base_dir": str(ROOT / "recipes"),
    }
    enabled = gc.isenabled()
    gc.disable()  # the garbage must still be there when the workers fork
    try:
        if app_froze:
            gc.freeze()
        _Witness(finalized)
        loader = mixer.build_loader(recipe, num_workers=2)
        batches = [batch for _, batch in zip(range(4), loader)]
        loader.close()
        assert gc.get_freeze_count() > 0 if app_froze else gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()
    gc.collect()
    assert len(batches) == 4
    assert finalized.read_text().split() == [str(os.getpid())]


def test_young_garbage_is_collected_not_promoted_by_the_freeze(tmp_path):
    """Unfreezing puts every frozen object in the oldest generation, which only a full
    collection visits: garbage still young when workers fork is collected first."""
    finalized = tmp_path / "finalized"
    enabled = gc.isenabled()
    gc.disable()
    try:
        _Witness(finalized)
        with worker_processes.inherit_no_garbage():
            pass
        assert finalized.read_text().split() == [str(os.getpid())]
    finally:
        if enabled:
            gc.enable()


def test_loaders_forking_at_once_keep_the_freeze_until_the_last_has_forked():
    import threading

    first_in, first_may_leave = threading.Event(), threading.Event()

    def first() -> None:
        with worker_processes.inherit_no_garbage():
            first_in.set()
            first_may_leave.wait(30)

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(30)
    with worker_processes.inherit_no_garbage():
        assert gc.get_freeze_count() > 0
        first_may_leave.set()
        thread.join(30)
        assert gc.get_freeze_count() > 0, "unfrozen while a loader was still forking"
    assert gc.get_freeze_count() == 0
