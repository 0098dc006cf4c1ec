from __future__ import annotations

import atexit
import faulthandler
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# One OpenMP thread per test process (set before any test module imports torch; xdist's
# processes inherit it): `make test` runs two processes on two cores, and torch's default (a
# thread per core in each) spends the difference spinning (measured: -18 % wall).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Tokenizer-backend verdicts that have no token cache to sit beside go to the user's cache
# folder (mixer/tokenize/verify.py); the tests' go to one of their own, removed at exit.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="mixer-tests-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)

sys.path.insert(0, str(Path(__file__).parent))

from helpers import corpus, make_tokenizer, write_docs  # noqa: E402

# The longest modules (real torchrun jobs, S3 through a fault proxy, many subprocesses) run
# first, so `make test`'s two xdist processes (one file at a time) end at about the same time.
SLOW_FIRST = (
    "test_torchrun",
    "test_online_mixing_torchrun",
    "test_train_vlm_torchrun",
    "test_s3",
    "test_schedule_hostile",
    "test_images_hostile",
    "test_properties",
    "test_peers_smoke",
    "test_lifetime",
    "test_token_cache",
    "test_loader",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.stem
        return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: the order within a module is kept


# pytest-timeout (pyproject.toml) fails a test stuck past its limit with every thread's stack.
# A test its alarm cannot end (the main thread inside a C++ wait, or the alarm's exception
# raised inside a finalizer, where Python drops it) is ended by this watchdog later:
# faulthandler writes the stacks to a file and exits the process, xdist names the test and
# (`--max-worker-restart=0` in the Makefile) ends the run, whose summary prints that file.
# The grace leaves a test that pytest-timeout did end the time to tear down.
STUCK_GRACE_S = 90


def _stuck_after(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    limit = marker.args[0] if marker is not None and marker.args else item.config.getini("timeout")
    return float(limit or 300) + STUCK_GRACE_S


def _stacks_file(config: pytest.Config) -> Path:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return config.rootpath / ".pytest_cache" / f"stuck-{worker}.txt"


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller: forget an earlier run's stacks
        for old in (config.rootpath / ".pytest_cache").glob("stuck-*.txt"):
            old.unlink()


_watchdog_out: list = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not _watchdog_out:
        path = _stacks_file(item.config)
        path.parent.mkdir(parents=True, exist_ok=True)
        _watchdog_out.append(open(path, "w"))  # noqa: SIM115 (open for the process's life)
    faulthandler.dump_traceback_later(_stuck_after(item), exit=True, file=_watchdog_out[0])
    yield
    faulthandler.cancel_dump_traceback_later()


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    for path in sorted((config.rootpath / ".pytest_cache").glob("stuck-*.txt")):
        if path.stat().st_size:
            terminalreporter.section(f"stacks of a stuck test process ({path.stem})")
            terminalreporter.write(path.read_text(errors="replace"))


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
        write_docs(
            tmp_path / "code" / f"c{part}.parquet",
            docs["code"][part::2],
            "parquet",
            field="content",
            row_group_size=7,
        )
    write_docs(tmp_path / "web" / "w0.jsonl.zst", docs["web"][:100], "jsonl.zst")
    write_docs(tmp_path / "web" / "w1.jsonl.gz", docs["web"][100:], "jsonl.gz")
    recipe = {
        "seed": 7,
        "tokenizer": str(tokenizer_path),
        "seq_len": 16,
        "batch_size": 4,
        "lanes": 4,
        "shuffle_window": 8,
        "split_bytes": 1500,
        "sources": [
            {"name": "prose", "path": str(tmp_path / "prose" / "*.jsonl"), "weight": 0.5},
            {
                "name": "code",
                "path": str(tmp_path / "code" / "*.parquet"),
                "weight": 0.3,
                "text_field": "content",
            },
            {
                "name": "web",
                "path": [str(tmp_path / "web" / "*.zst"), str(tmp_path / "web" / "*.gz")],
                "weight": 0.2,
            },
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
    return {
        "key": "AKIDMIXERTEST",
        "secret": CANARY,
        "endpoint_url": endpoint,
        "client_kwargs": {"region_name": "us-east-1"},
        "config_kwargs": {"read_timeout": 1, "connect_timeout": 2, **config},
    }
