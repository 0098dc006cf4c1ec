"""A DataLoader worker that crashes in native code says where, when faulthandler is on."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
