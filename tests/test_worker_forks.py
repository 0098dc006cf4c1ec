"""What forked DataLoader workers take from their parent, and how they say they crashed."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

import mixer
from mixer.runtime import workers

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import ctypes
    from torch.utils.data import DataLoader, IterableDataset
    from mixer.runtime import workers

    class Crashing(IterableDataset):
        def __iter__(self):
            ctypes.string_at(0)   # reads address 0: SIGSEGV
            yield 1

    try:
        list(DataLoader(Crashing(), num_workers=1, multiprocessing_context="fork",
                        worker_init_fn=workers.init_fn()))
    except RuntimeError as exc:
        print("parent saw:", exc)
""")


def test_a_worker_crash_prints_its_python_stack_under_faulthandler():
    # torch puts its own SIGSEGV handler in each worker, which prints no stack; the workers
    # mixer starts put faulthandler's back where the parent had it on.
    run = subprocess.run([sys.executable, "-X", "faulthandler", "-c", SCRIPT],
                         capture_output=True, text=True, timeout=120)
    assert "Fatal Python error: Segmentation fault" in run.stderr
    assert "in __iter__" in run.stderr and "string_at" in run.stderr
    assert "parent saw:" in run.stdout   # and the loader still reports the dead worker


class _Witness:
    """Garbage in a reference cycle that notes in `path` which process finalized it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cycle = self

    def __del__(self) -> None:
        with open(self.path, "a") as out:
            out.write(f"{os.getpid()}\n")


def test_workers_never_finalize_garbage_their_parent_had_not_collected(tmp_path, monkeypatch):
    """Garbage of the parent's, not yet collected when workers fork, is finalized in the
    parent alone: a worker that collected it ran its finalizers on resources that were
    not its own (an earlier loader's shared ring: the worker unmapped its own memory)."""
    finalized = tmp_path / "finalized"
    real_init = workers.worker_init

    def init_then_collect(*args, **kwargs):
        real_init(*args, **kwargs)
        gc.collect()   # (the worker's collector would get there some time)

    monkeypatch.setattr(workers, "worker_init", init_then_collect)
    recipe = {**yaml.safe_load((ROOT / "recipes" / "demo.yaml").read_text()),
              "base_dir": str(ROOT / "recipes")}
    enabled = gc.isenabled()
    gc.disable()   # the garbage must still be there when the workers fork
    try:
        _Witness(finalized)
        loader = mixer.build_loader(recipe, num_workers=2)
        batches = [batch for _, batch in zip(range(4), loader)]
        loader.close()
    finally:
        if enabled:
            gc.enable()
    gc.collect()
    assert len(batches) == 4
    assert finalized.read_text().split() == [str(os.getpid())]
