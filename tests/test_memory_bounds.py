"""Bounds on the data path's memory: a process keeps a bounded number of whole-file
decompressors open, whatever the number of lanes and compressed sources (a suspended reader
resumes exactly where it stopped); freed malloc memory goes back to the system; fastokens
starts no thread pool of its own unless told to."""

from __future__ import annotations

import gc
import gzip
import hashlib
import io
import json
import os
import threading

import pytest
import zstandard
from helpers import batch_digest, corpus, write_docs
from hypothesis import given
from hypothesis import strategies as st

import mixer
from mixer.core.resources import OpenLimit
from mixer.sources.formats import jsonl, reopen
from mixer.sources.formats.reopen import (
    OPEN_DECOMPRESSORS,
    REBUILD_BUDGET,
    RebuildBudget,
    Reopenable,
)


def _lines(count: int) -> bytes:
    """jsonl that compresses poorly (hex digests), so the file is read in many pieces."""
    return b"".join(
        json.dumps({"text": hashlib.sha256(str(i).encode()).hexdigest() * (1 + i % 9)}).encode()
        + b"\n"
        for i in range(count)
    )


def _read(
    path, decompressor, limit: OpenLimit, others: int, budget: RebuildBudget | None = None
) -> list[tuple[bytes, int]]:
    """Every line with the compressed position after it, while `others` readers of the same
    file are read in turn under the same limit (each read may suspend the others)."""
    budget = budget or RebuildBudget(float("inf"))
    readers = [
        Reopenable(lambda: open(path, "rb"), decompressor, limit, budget) for _ in range(others + 1)
    ]
    streams = [io.BufferedReader(r, buffer_size=16384) for r in readers]
    out = []
    while line := streams[0].readline():
        out.append((line, readers[0].file_position()))
        for other in streams[1:]:
            other.readline()
    for stream in streams:
        stream.close()
    return out


@pytest.mark.slow
def test_a_suspended_reader_gives_the_same_lines_and_positions(tmp_path):
    data = _lines(4000)  # (gz: ~170 KB, read 16 KB at a time)
    (tmp_path / "a.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(data))
    (tmp_path / "a.gz").write_bytes(gzip.compress(data))
    for name, decompressor in (("a.zst", jsonl._zstd), ("a.gz", jsonl._gzip)):
        reference = _read(tmp_path / name, decompressor, OpenLimit(100), 0)
        assert b"".join(line for line, _ in reference) == data
        limit = OpenLimit(1)
        bounded = _read(tmp_path / name, decompressor, limit, 2)
        assert limit.suspended > 20, name  # every turn suspended another reader
        # the same lines at the same compressed positions (ZstdStream's and GzipStream's
        # input depends only on the output taken)
        assert bounded == reference, name
        assert limit.open_count() == 0, name  # closed readers leave the limit
    # a budget of decompressing again half what was read: suspensions past it are refused
    budget = RebuildBudget(0.5)
    limit = OpenLimit(1)
    bounded = _read(tmp_path / "a.zst", jsonl._zstd, limit, 2, budget)
    assert bounded == _read(tmp_path / "a.zst", jsonl._zstd, OpenLimit(100), 0)
    assert budget.refused and limit.suspended and budget.reserved <= 0.5 * budget.read


@pytest.mark.slow
def test_many_compressed_sources_and_lanes_stay_under_the_limit(
    tmp_path, tokenizer_path, monkeypatch
):
    sources = []
    for i in range(6):
        fmt = "jsonl.zst" if i % 3 else "jsonl.gz"
        path = write_docs(tmp_path / f"s{i}.{fmt}", corpus(1000 * i, 300, max_len=20, seed=i), fmt)
        sources.append({"name": f"s{i}", "path": str(path), "weight": 1 + i})
    recipe = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 64,
        "batch_size": 4,
        "lanes": 4,
        "shuffle_window": 16,
        "sources": sources,
    }  # 24 (lane, source) readers

    monkeypatch.setattr(REBUILD_BUDGET, "ratio", float("inf"))  # (the limit alone here)

    def run(limit: int) -> tuple[list[str], dict, int]:
        monkeypatch.setattr(OPEN_DECOMPRESSORS, "limit", limit)
        monkeypatch.setattr(OPEN_DECOMPRESSORS, "soft", limit)
        loader = mixer.build_loader(recipe)
        digests, most = [], 0
        for batch in loader:
            digests.append(batch_digest(batch))
            most = max(most, OPEN_DECOMPRESSORS.open_count())
            if len(digests) == 120:
                break
        state = loader.state_dict()
        loader.close()
        return digests, state, most

    before = OPEN_DECOMPRESSORS.suspended
    unbounded, state, most = run(10**6)
    assert most > 12 and OPEN_DECOMPRESSORS.suspended == before
    bounded, bounded_state, most = run(3)
    assert most <= 3 and OPEN_DECOMPRESSORS.suspended > before + 20
    assert bounded == unbounded and bounded_state == state


@pytest.mark.slow
def test_many_small_compressed_sources_stay_at_the_limit_within_the_rebuild_budget(
    tmp_path, tokenizer_path, monkeypatch
):
    """With the default limits and budget, a long run over many small whole-file sources in
    small windows: at most `limit` readers stay open (the one being read aside), what the
    suspensions decompress again stays within the budget, and the batches are those of no
    limit. (A budget that ran out kept a reader open per (lane, source) for the rest of the
    run: 131 at 100 sources after 1,500 batches.)"""
    sources = []
    for i in range(8):
        fmt = "jsonl.zst" if i % 2 else "jsonl.gz"
        path = write_docs(tmp_path / f"s{i}.{fmt}", corpus(1000 * i, 150, max_len=30, seed=i), fmt)
        sources.append({"name": f"s{i}", "path": str(path), "weight": 1})
    recipe = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 64,
        "batch_size": 4,
        "lanes": 4,
        "shuffle_window": 4,
        "sources": sources,
    }  # 32 readers, a window every 4 docs
    for counter in ("read", "reserved", "refused"):  # (this test's counts alone)
        monkeypatch.setattr(REBUILD_BUDGET, counter, 0)

    def run() -> tuple[list[str], int]:
        loader = mixer.build_loader(recipe)
        digests, most = [], 0
        for batch in loader:
            digests.append(batch_digest(batch))
            most = max(most, OPEN_DECOMPRESSORS.open_count())
            if len(digests) == 400:  # several epochs of every source
                break
        loader.close()
        return digests, most

    suspended = OPEN_DECOMPRESSORS.suspended
    bounded, most = run()
    assert most <= OPEN_DECOMPRESSORS.limit + 1 and REBUILD_BUDGET.refused == 0
    assert OPEN_DECOMPRESSORS.suspended > suspended + 200
    assert REBUILD_BUDGET.reserved <= REBUILD_BUDGET.ratio * REBUILD_BUDGET.read
    monkeypatch.setattr(OPEN_DECOMPRESSORS, "soft", 10**6)
    monkeypatch.setattr(OPEN_DECOMPRESSORS, "limit", 10**6)
    unbounded, most = run()
    assert most > 16 and bounded == unbounded


@pytest.mark.parametrize("kind", ["zst", "gz"])
def test_small_windows_over_many_small_files_decompress_again_within_the_budget(
    tmp_path, monkeypatch, kind
):
    """Readers of small files taken a small window at a time in turn (many sources, many
    lanes): what reopening decompresses again stays within the budget's ratio of what is
    read, soft suspensions within their share; past it readers stay open instead."""
    data = _lines(3000)
    path = tmp_path / f"a.{kind}"
    path.write_bytes(
        zstandard.ZstdCompressor(level=3).compress(data) if kind == "zst" else gzip.compress(data)
    )
    again = [0]
    real_discard = reopen._discard

    def counting(stream, count):
        again[0] += count
        return real_discard(stream, count)

    monkeypatch.setattr(reopen, "_discard", counting)
    decompressor = jsonl._zstd if kind == "zst" else jsonl._gzip
    budget, limit = RebuildBudget(4.0), OpenLimit(6, soft=3)
    readers = [
        io.BufferedReader(
            Reopenable(lambda: open(path, "rb"), decompressor, limit, budget), buffer_size=4096
        )
        for _ in range(16)
    ]
    read, live = 0, list(readers)
    while live:
        for reader in list(live):
            got = 0
            while got < 8192:  # one small window
                line = reader.readline()
                if not line:
                    live.remove(reader)
                    break
                got += len(line)
            read += got
    for reader in readers:
        reader.close()
    assert read == 16 * len(data)
    assert again[0] <= budget.reserved <= 4.0 * budget.read
    assert budget.refused  # the budget ran out: readers were kept open past the limit


class _Deep:
    """A `Suspendable` whose suspension allocates enough to run the garbage collector."""

    def suspend(self, cheap_only: bool = False) -> bool:
        gc.collect()
        return True


@pytest.mark.slow
def test_a_reader_collected_while_the_limit_suspends_another_does_not_deadlock(tmp_path):
    """The garbage collector may close a dropped reader (which leaves the limit) on the
    thread that holds the limit's lock, inside a suspension."""
    path = tmp_path / "x.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "a"}\n' * 100))
    limit = OpenLimit(1)

    def work() -> None:
        reader = Reopenable(lambda: open(path, "rb"), jsonl._zstd, limit, RebuildBudget(2.0))
        reader.cycle = reader  # collected by the cycle collector only
        del reader
        first, second = _Deep(), _Deep()
        limit.touch(first)  # past the limit: the reader is suspended
        limit.touch(second)  # past it again: suspending `first` collects the reader

    gc.disable()
    try:
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        thread.join(10)
    finally:
        gc.enable()
    assert not thread.is_alive()


class _Resource:
    """A fake `Suspendable`: cheap or not to take up again."""

    def __init__(self, cheap: bool) -> None:
        self.cheap = cheap
        self.open = False

    def suspend(self, cheap_only: bool = False) -> bool:
        if cheap_only and not self.cheap:
            return False
        self.open = False
        return True


@given(
    st.lists(st.booleans(), min_size=1, max_size=12),
    st.integers(0, 6),
    st.integers(0, 6),
    st.lists(st.integers(0, 11), max_size=80),
)
def test_past_soft_only_cheap_resources_are_suspended_past_the_limit_any(
    cheap, soft, extra, touches
):
    limit = OpenLimit(soft + extra, soft=soft)
    items = [_Resource(c) for c in cheap]
    for index in touches:
        item = items[index % len(items)]
        opening = not item.open
        item.open = True
        limit.touch(item)
        opened = [i for i in items if i.open]
        assert len(opened) == limit.open_count() <= max(limit.limit, 1)
        if opening and len(opened) > soft:  # only the one just opened may be cheap
            assert all(not i.cheap for i in opened if i is not item)


def test_soft_suspensions_take_cheap_readers_within_their_share_of_the_budget(caplog):
    budget = RebuildBudget(4.0, soft_share=0.5, cheap=1000)
    assert not budget.reserve(1, cheap_only=True)  # nothing read yet
    budget.add_read(1000)  # the budget: 4,000; soft suspensions: 2,000 of it
    assert budget.reserve(1000, cheap_only=True) and budget.reserve(1000, cheap_only=True)
    assert not budget.reserve(1, cheap_only=True)  # its share is spent
    assert not budget.reserve(1001, cheap_only=True) and budget.refused == 0  # not cheap
    with caplog.at_level("WARNING", logger="mixer.sources.formats.reopen"):
        assert budget.reserve(2000)  # past the limit: the rest of the budget
        assert not budget.reserve(1) and not budget.reserve(1)
    assert budget.reserved == 4000 and budget.refused == 2
    assert len([r for r in caplog.records if "open past the limit" in r.message]) == 1


def test_freed_malloc_memory_goes_back_to_the_system_at_most_once_an_interval():
    import ctypes

    import psutil

    from mixer.core.resources import FreedMemory

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(64 << 10) for _ in range(800)]  # 50 MB under the mmap threshold
    for block in blocks:
        ctypes.memset(block, 1, 64 << 10)
    for block in blocks[:-1]:  # the last one keeps the heap's top: nothing is trimmed
        libc.free(block)
    held = psutil.Process().memory_info().rss
    freed = FreedMemory(3600.0)
    freed.maybe_release()
    freed.maybe_release()  # within the interval: not again
    assert freed.trims == 1
    assert psutil.Process().memory_info().rss < held - (30 << 20)
    libc.free(blocks[-1])


def test_fastokens_gets_no_pool_of_its_own_unless_told(monkeypatch):
    from mixer.tokenize import encoding
    from mixer.tokenize.backends import set_fastokens_threads

    for rayon, fast, expected in ((None, None, "1"), ("3", None, "3"), ("3", "5", "5")):
        for name, value in (("RAYON_NUM_THREADS", rayon), ("FASTOKENS_BPE_THREADS", fast)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        set_fastokens_threads()
        assert os.environ["FASTOKENS_BPE_THREADS"] == expected
    monkeypatch.setattr(encoding, "_encoding_threads", encoding._encoding_threads)
    for rayon, expected in ((None, "1"), ("4", "2")):  # a DataLoader worker of 2
        monkeypatch.delenv("FASTOKENS_BPE_THREADS", raising=False)
        if rayon is None:
            monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("RAYON_NUM_THREADS", rayon)
        encoding.use_worker_encoding_threads(2, 4)
        assert os.environ["FASTOKENS_BPE_THREADS"] == expected


def test_a_process_encoding_with_fastokens_keeps_one_encoding_thread(tmp_path, monkeypatch):
    from pathlib import Path

    from mixer.tokenize import encoding

    demo = Path(__file__).resolve().parent.parent / "data" / "tokenizer.json"
    path = tmp_path / "a.jsonl"
    path.write_text(
        "".join(json.dumps({"text": f"document {i} " * (i % 50 + 1)}) + "\n" for i in range(200))
    )
    recipe = {
        "tokenizer": str(demo),
        "seq_len": 64,
        "batch_size": 2,
        "sources": [{"name": "a", "path": str(path), "weight": 1}],
    }
    monkeypatch.setattr(encoding, "_encoding_threads", encoding.ENCODING_THREADS)
    hf = mixer.build_loader({**recipe, "tokenizer_backend": "hf"})
    assert encoding.encoding_pool().threads == encoding.ENCODING_THREADS
    reference = [batch_digest(b) for _, b in zip(range(20), hf)]
    fast = mixer.build_loader({**recipe, "tokenizer_backend": "fastokens"})
    assert encoding.encoding_pool().threads == 1
    assert [batch_digest(b) for _, b in zip(range(20), fast)] == reference
    hf.close()
    fast.close()
