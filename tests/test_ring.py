"""The shared-memory ring through which DataLoader workers hand batches to the loader."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixer.pipeline.batch import Batch, BatchLayout, Wire
from mixer.runtime.ring import BatchRing, InRing

LAYOUT = BatchLayout(seq_len=64, pad_id=0)


def _batch(seed: int, rows: int = 4) -> Batch:
    rng = np.random.default_rng(seed)
    return Batch({key: rng.integers(-100, 50_000, (rows, 64)) for key in LAYOUT.keys}, False)


def _read(ring: BatchRing, item: InRing | Wire) -> Batch:
    if isinstance(item, InRing):
        return ring.take(item, lambda wire: LAYOUT.from_wire(wire, False))
    return LAYOUT.from_wire(item, False)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=20))
def test_every_batch_arrives_equal_whether_in_a_slot_or_through_the_pipe(reads_now):
    """Whatever the order of puts and takes, each batch is read back exactly; a put whose
    slot is still filled crosses as the wire itself instead of overwriting it."""
    ring = BatchRing.for_layout(LAYOUT, 4, workers=1, slots=2)
    pending: list[tuple[int, InRing | Wire]] = []
    for seed, read_now in enumerate(reads_now):
        pending.append((seed, ring.send(0, LAYOUT, _batch(seed))))
        if read_now:
            while pending:
                got_seed, item = pending.pop(0)
                got = _read(ring, item)
                for key in LAYOUT.keys:
                    np.testing.assert_array_equal(got[key], _batch(got_seed)[key])
    filled = [item for _, item in pending if isinstance(item, InRing)]
    assert len({item.slot for item in filled}) == len(filled)  # no slot holds two batches


def test_a_batch_larger_than_a_slot_crosses_through_the_pipe():
    ring = BatchRing(workers=1, slots=2, slot_bytes=4096)
    item = ring.send(0, LAYOUT, _batch(0, rows=32))
    assert isinstance(item, Wire) and isinstance(item.data, bytes)
    assert len(item.data) > ring.slot_bytes


def test_a_forked_worker_writes_where_the_parent_reads():
    ring = BatchRing.for_layout(LAYOUT, 4, workers=2, slots=3)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: put a batch, send only where it is
        item = ring.send(1, LAYOUT, _batch(7))
        os.write(write_end, f"{item.slot} {item.size}".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    slot, size = map(int, os.read(read_end, 64).split())
    assert slot == 1 * 3  # worker 1's first slot
    wire = LAYOUT.to_wire(_batch(7))
    got = ring.take(
        InRing(slot, size, Wire(b"", wire.shapes, {})), lambda w: LAYOUT.from_wire(w, False)
    )
    for key in LAYOUT.keys:
        np.testing.assert_array_equal(got[key], _batch(7)[key])
    assert not ring._flags.any()  # read: the slot is free again


class _NoCanary(Exception):
    pass


def _mapped(address: int) -> bool:
    with open("/proc/self/maps") as maps:
        for line in maps:
            start, end = (int(part, 16) for part in line.split()[0].split("-"))
            if start <= address < end:
                return True
    return False


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_DONTFORK"), reason="Linux only")
@pytest.mark.parametrize("keep", [True, False])
def test_a_ring_dropped_in_a_later_fork_leaves_that_process_memory_alone(keep):
    """A ring kept from later forks is not in a process forked afterwards, which may put its
    own memory at that address (it did: thread stacks); dropping the ring object it inherited
    must not unmap that memory (it did: the worker died of SIGSEGV). A ring a fork inherits is
    that process's to drop."""
    import ctypes
    import gc
    import mmap

    ring = BatchRing(workers=2, slots=3, slot_bytes=64 * 1024)
    address = ring._flags.ctypes.data  # (the mapping: flags, then slots)
    size = ring._data.ctypes.data + ring._data.nbytes - address
    if keep:
        ring.keep_from_later_forks()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        verdict = "ok"
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [
                ctypes.c_void_p,
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_long,
            ]
            if keep:
                assert not _mapped(address), "the ring was inherited"
                fixed_noreplace = 0x100000
                mine = libc.mmap(
                    address,
                    size,
                    mmap.PROT_READ | mmap.PROT_WRITE,
                    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | fixed_noreplace,
                    -1,
                    0,
                )
                if mine != address:  # (kernels before 4.17 ignore MAP_FIXED_NOREPLACE)
                    raise _NoCanary
            else:
                assert _mapped(address)
            del ring
            gc.collect()
            if keep:
                assert _mapped(address), "dropping the inherited ring unmapped the fork's memory"
            else:
                assert not _mapped(address), "an inherited ring was never unmapped"
        except _NoCanary:
            verdict = "no canary"
        except BaseException as exc:  # (reported to the parent: pytest does not run here)
            verdict = repr(exc)
        os.write(write_end, verdict.encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    verdict = os.read(read_end, 4096).decode()
    if verdict == "no canary":
        pytest.skip("this kernel will not map at a chosen free address (MAP_FIXED_NOREPLACE)")
    assert verdict == "ok"
    assert _mapped(address)  # the parent's ring is untouched
    ring._flags[:] = 1
    del ring
    import gc

    gc.collect()
    assert not _mapped(address)  # and unmapped when the parent drops it


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_DONTFORK"), reason="Linux only")
def test_a_fork_while_the_ring_is_kept_from_forks_never_owns_pages_it_lacks(monkeypatch):
    """Another thread may fork while `keep_from_later_forks` is in madvise (which releases
    the GIL): whether or not that child got the pages, it must not take them for its own to
    unmap (it would unmap whatever it later put at that address)."""
    from mixer.runtime import ring as ring_module

    ring = BatchRing(workers=1, slots=2, slot_bytes=4096)
    mapping = ring._memory._mapping
    real = ring_module._libc

    class ForkInsideMadvise:
        def __getattr__(self, name):
            return getattr(real, name)

        def madvise(self, *args):
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.write(write_end, b"owns" if mapping.owner == os.getpid() else b"not")
                os._exit(0)
            os.waitpid(pid, 0)
            os.close(write_end)
            seen.append(os.read(read_end, 16).decode())
            return real.madvise(*args)

    seen: list[str] = []
    monkeypatch.setattr(ring_module, "_libc", ForkInsideMadvise())
    ring.keep_from_later_forks()
    assert seen == ["not"]
    assert mapping.owner == os.getpid() and not mapping.forked


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 6))
def test_a_wire_written_in_place_holds_the_bytes_of_the_piped_one(seed, rows):
    """`to_wire(batch, into)` casts each array straight into the slot: the same bytes as the
    buffer it sends through the pipe."""
    batch = _batch(seed, rows)
    into = np.zeros(1 << 20, dtype=np.uint8)
    in_place = LAYOUT.to_wire(batch, into)
    piped = LAYOUT.to_wire(batch)
    assert isinstance(in_place.data, memoryview) and bytes(in_place.data) == piped.data
    assert in_place.shapes == piped.shapes


# -- the loader: every batch through the ring ----------------------------------------------------
ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def _recipe(name: str, **changes) -> dict:
    import yaml

    data = yaml.safe_load((ROOT / "recipes" / name).read_text())
    return {**data, "base_dir": str(ROOT / "recipes"), **changes}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("demo.yaml", {}),
        ("multimodal_demo.yaml", {"images": {"layout": "llava", "max_patches_per_batch": None}}),
        # qwen2_vl's positions are [4, B, L]: four tokens' worth of wire each; at B·L = 2^18 they
        # no longer fit in slack sized for [B, L] arrays
        ("multimodal_demo.yaml", {"seq_len": 32768, "batch_size": 8}),
        ("video_demo.yaml", {"images": {"layout": "qwen2_5_vl", "video": {}}}),
    ],
)
def test_the_loader_receives_every_batch_through_the_ring(monkeypatch, name, changes):
    import mixer
    from mixer.runtime.loader import Loader

    recipe = _recipe(name, **changes)
    if "images" in changes:  # (layout changes keep the recipe's other image settings)
        recipe["images"] = {**_recipe(name)["images"], **changes["images"]}
    expected = [_digest(b) for _, b in zip(range(4), mixer.build_loader(recipe))]
    kinds: list[str] = []
    real = Loader._receive
    monkeypatch.setattr(
        Loader,
        "_receive",
        lambda self, ring, data, padding: (
            kinds.append(type(data).__name__),
            real(self, ring, data, padding),
        )[1],
    )
    loader = mixer.build_loader(recipe, num_workers=2)
    got = [_digest(b) for _, b in zip(range(4), loader)]
    loader.close()
    assert got == expected
    assert kinds == ["InRing"] * 4


def _digest(batch: dict) -> str:
    from helpers import batch_digest

    return batch_digest(batch)


@pytest.mark.slow
def test_a_ring_the_system_will_not_map_leaves_batches_to_the_pipe(monkeypatch, caplog):
    import mixer
    from mixer.runtime import ring

    def refuse(self, workers, slots, slot_bytes):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(ring.BatchRing, "__init__", refuse)
    recipe = _recipe("demo.yaml")
    expected = [_digest(b) for _, b in zip(range(3), mixer.build_loader(recipe))]
    with caplog.at_level("WARNING", logger="mixer.loader"):
        loader = mixer.build_loader(recipe, num_workers=2)
        assert [_digest(b) for _, b in zip(range(3), loader)] == expected
        loader.close()
    assert "no shared-memory ring" in caplog.text and "Cannot allocate memory" in caplog.text


def test_a_process_forked_later_does_not_inherit_a_loaders_ring():
    """Another loader's workers (or a trainer's own processes) forked while a loader runs do
    not keep its ring mapped after it is closed."""
    import mixer

    def shared_maps(pid: int) -> int:  # MAP_SHARED|MAP_ANONYMOUS regions
        with open(f"/proc/{pid}/maps") as maps:
            return sum("/dev/zero (deleted)" in line or "SYSV" in line for line in maps)

    loader = mixer.build_loader(_recipe("demo.yaml"), num_workers=2)
    batches = iter(loader)
    next(batches)
    inside = shared_maps(os.getpid())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports its count and waits to be killed
        os.write(write, str(shared_maps(os.getpid())).encode())
        os._exit(0)
    os.close(write)
    child = int(os.read(read, 64))
    os.waitpid(pid, 0)
    loader.close()
    assert child < inside, (child, inside)
