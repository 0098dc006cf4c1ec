from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# One OpenMP thread per test process (set before any test module imports torch; xdist's
# processes inherit it): `make test` runs two processes on two cores, and torch's default (a
# thread per core in each) spends the difference spinning (measured: -18 % wall).
os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).parent))

from helpers import corpus, make_tokenizer, write_docs  # noqa: E402

# The longest modules (real torchrun jobs, S3 through a fault proxy, many subprocesses) run
# first, so `make test`'s two xdist processes (one file at a time) end at about the same time.
SLOW_FIRST = ("test_torchrun", "test_online_mixing_torchrun", "test_train_vlm_torchrun",
              "test_s3", "test_schedule_hostile", "test_images_hostile", "test_properties",
              "test_peers_smoke", "test_lifetime", "test_token_cache", "test_loader")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.stem
        return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: the order within a module is kept


@pytest.fixture
def tokenizer_path(tmp_path: Path) -> Path:
    return make_tokenizer(tmp_path / "tokenizer.json")


@pytest.fixture
def three_sources(tmp_path: Path, tokenizer_path: Path):
    """A recipe dict over three sources in different formats, plus their documents."""
    docs = {
        "prose": corpus(0, 240, max_len=30),
        "code": corpus(1000, 60, min_len=60, max_len=300, seed=1),
        "web": corpus(2000, 200, max_len=12, seed=2),
    }
    for part in range(3):
        write_docs(tmp_path / "prose" / f"p{part}.jsonl", docs["prose"][part::3], "jsonl")
    for part in range(2):
        write_docs(tmp_path / "code" / f"c{part}.parquet", docs["code"][part::2], "parquet",
                   field="content", row_group_size=7)
    write_docs(tmp_path / "web" / "w0.jsonl.zst", docs["web"][:100], "jsonl.zst")
    write_docs(tmp_path / "web" / "w1.jsonl.gz", docs["web"][100:], "jsonl.gz")
    recipe = {
        "seed": 7, "tokenizer": str(tokenizer_path), "seq_len": 16, "batch_size": 4,
        "lanes": 4, "shuffle_window": 8, "split_bytes": 1500,
        "sources": [
            {"name": "prose", "path": str(tmp_path / "prose" / "*.jsonl"), "weight": 0.5},
            {"name": "code", "path": str(tmp_path / "code" / "*.parquet"), "weight": 0.3,
             "text_field": "content"},
            {"name": "web", "path": [str(tmp_path / "web" / "*.zst"),
                                     str(tmp_path / "web" / "*.gz")], "weight": 0.2},
        ],
    }
    return recipe, docs


CANARY = "CANARY-secret-9f8e7d6c"


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server on 127.0.0.1 (HTTP, exactly as the loader talks to AWS)."""
    from moto.server import ThreadedMotoServer
    from s3server import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def s3_options(endpoint: str, **config) -> dict:
    """storage_options for s3fs with a canary secret that must never leak."""
    return {"key": "AKIDMIXERTEST", "secret": CANARY, "endpoint_url": endpoint,
            "client_kwargs": {"region_name": "us-east-1"},
            "config_kwargs": {"read_timeout": 1, "connect_timeout": 2, **config}}
