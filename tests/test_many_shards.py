"""Thousands of one-record shards: a fast start and no leaked file descriptor."""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from pathlib import Path

import psutil
import pytest
from helpers import (
    doc_text,
    expected_counts,
    make_tokenizer,
    token_counts,
)

import mixer

# -- thousands of one-record shards ---------------------------------------------------------


def _descriptors(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory) -> tuple[Path, list[tuple[int, int]]]:
    folder = tmp_path_factory.mktemp("many")
    (folder / "j").mkdir()
    (folder / "t").mkdir()
    docs = [(d, 1 + d % 3) for d in range(8000)]
    for d, n in docs[:5000]:
        (folder / "j" / f"{d:05d}.jsonl").write_text(json.dumps({"text": doc_text(d, n)}) + "\n")
    for d, n in docs[5000:]:
        with tarfile.open(folder / "t" / f"{d:05d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            data = doc_text(d, n).encode()
            info = tarfile.TarInfo(f"s{d}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    make_tokenizer(folder / "tokenizer.json")
    return folder, docs


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_thousands_of_shards_start_fast_and_leak_no_descriptor(many_shards, workers):
    folder, docs = many_shards
    recipe = {
        "tokenizer": str(folder / "tokenizer.json"),
        "seq_len": 16,
        "batch_size": 4,
        "lanes": 8,
        "sources": [
            {
                "name": "many",
                "weight": 1,
                "epochs": 1,
                "path": [str(folder / "j" / "*.jsonl"), str(folder / "t" / "*.tar")],
            }
        ],
    }
    before = _descriptors()
    start = time.monotonic()
    loader = mixer.build_loader(recipe, num_workers=workers)
    batches = iter(loader)
    got = [next(batches)]
    assert time.monotonic() - start < 15  # listing every shard, and the first batch
    opened = [_descriptors()]
    children = []
    for batch in batches:
        got.append(batch)
        if len(got) % 50 == 0:
            opened.append(_descriptors())
            children += [_descriptors(p.pid) for p in psutil.Process().children()]
    loader.close()
    assert token_counts(got) == expected_counts(docs)
    # A DataLoader's pipes and queues, nothing per shard (each worker opens its shards in turn)
    assert max(opened) - before <= 16, opened
    # a forked worker holds what its parent had open (`before`) plus its own few
    assert max(children, default=0) - before <= 32, (before, children)
    assert _descriptors() == before
