"""A process keeps a bounded number of whole-file decompressors open, whatever the number of
lanes and compressed sources: a suspended reader resumes exactly where it stopped."""

from __future__ import annotations

import gzip
import hashlib
import io
import json

import zstandard
from helpers import batch_digest, corpus, write_docs

import mixer
from mixer.core.resources import OpenLimit
from mixer.sources.formats import jsonl
from mixer.sources.formats.reopen import OPEN_DECOMPRESSORS, Reopenable


def _lines(count: int) -> bytes:
    """jsonl that compresses poorly (hex digests), so the file is read in many pieces."""
    return b"".join(json.dumps({"text": hashlib.sha256(str(i).encode()).hexdigest() * (1 + i % 9)})
                    .encode() + b"\n" for i in range(count))


def _read(path, decompressor, limit: OpenLimit, others: int) -> list[tuple[bytes, int]]:
    """Every line with the compressed position after it, while `others` readers of the same
    file are read in turn under the same limit (each read may suspend the others)."""
    readers = [Reopenable(lambda: open(path, "rb"), decompressor, limit)
               for _ in range(others + 1)]
    streams = [io.BufferedReader(r, buffer_size=16384) for r in readers]
    out = []
    while line := streams[0].readline():
        out.append((line, readers[0].file_position()))
        for other in streams[1:]:
            other.readline()
    for stream in streams:
        stream.close()
    return out


def test_a_suspended_reader_gives_the_same_lines_and_positions(tmp_path):
    data = _lines(1500)
    (tmp_path / "a.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(data))
    (tmp_path / "a.gz").write_bytes(gzip.compress(data))
    for name, decompressor in (("a.zst", jsonl._zstd), ("a.gz", jsonl._gzip)):
        reference = _read(tmp_path / name, decompressor, OpenLimit(100), 0)
        assert b"".join(line for line, _ in reference) == data
        limit = OpenLimit(1)
        bounded = _read(tmp_path / name, decompressor, limit, 2)
        assert limit.suspended > 20, name   # every turn suspended another reader
        assert [line for line, _ in bounded] == [line for line, _ in reference], name
        if name == "a.zst":   # ZstdStream's input depends only on the output taken
            assert bounded == reference
        assert limit.open_count() == 0, name   # closed readers leave the limit


def test_many_compressed_sources_and_lanes_stay_under_the_limit(tmp_path, tokenizer_path,
                                                                monkeypatch):
    sources = []
    for i in range(6):
        fmt = "jsonl.zst" if i % 3 else "jsonl.gz"
        path = write_docs(tmp_path / f"s{i}.{fmt}", corpus(1000 * i, 300, max_len=20, seed=i),
                          fmt)
        sources.append({"name": f"s{i}", "path": str(path), "weight": 1 + i})
    recipe = {"tokenizer": str(tokenizer_path), "seq_len": 64, "batch_size": 4, "lanes": 4,
              "shuffle_window": 16, "sources": sources}   # 24 (lane, source) readers

    def run(limit: int) -> tuple[list[str], dict, int]:
        monkeypatch.setattr(OPEN_DECOMPRESSORS, "limit", limit)
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
