"""Token cache (`token_cache:`): the same batches cold, warm or partly warm; damaged, stale or
unwritable entries are never used; `mixer cache` fills it; entries are Megatron corpora."""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import procs
import pytest
import yaml
from conftest import s3_options
from helpers import batch_digest, corpus, make_tokenizer, word_id, write_docs
from hypothesis import given, settings
from hypothesis import strategies as st

import mixer
from mixer.cache import spill as spill_module
from mixer.cache import store as cache_module
from mixer.cache.store import CACHE_STATS, TokenCache
from mixer.tokenize import resolve_tokenizer
from mixer.tools.cli import main as cli

ROOT = Path(__file__).resolve().parent.parent
N = 40  # batches compared per run (the recipe's sources run through several epochs)


@pytest.fixture
def data(tmp_path: Path) -> dict:
    """Three sources: byte-range jsonl splits with a malformed line (skipped), parquet row
    groups, and one zstd file striped over the 4 lanes."""
    tok = make_tokenizer(tmp_path / "tok.json")
    a = corpus(0, 160, max_len=30)
    write_docs(tmp_path / "a" / "a0.jsonl", a[:80], "jsonl")
    write_docs(tmp_path / "a" / "a1.jsonl", a[80:], "jsonl")
    lines = (tmp_path / "a" / "a0.jsonl").read_text().splitlines(keepends=True)
    lines.insert(30, "{not json\n")
    (tmp_path / "a" / "a0.jsonl").write_text("".join(lines))
    write_docs(
        tmp_path / "b" / "b0.parquet",
        corpus(1000, 50, min_len=20, max_len=90),
        "parquet",
        row_group_size=9,
    )
    write_docs(tmp_path / "c" / "c0.jsonl.zst", corpus(2000, 40, max_len=12), "jsonl.zst")
    return {
        "seed": 5,
        "tokenizer": str(tok),
        "seq_len": 16,
        "batch_size": 2,
        "lanes": 4,
        "shuffle_window": 6,
        "shuffle_window_bytes": 400,
        "split_bytes": 1200,
        "token_cache": str(tmp_path / "cache"),
        "sources": [
            {
                "name": "a",
                "path": str(tmp_path / "a" / "*.jsonl"),
                "weight": 0.5,
                "on_error": "skip",
            },
            {"name": "b", "path": str(tmp_path / "b" / "*.parquet"), "weight": 0.3},
            {"name": "c", "path": str(tmp_path / "c" / "*.zst"), "weight": 0.2},
        ],
    }


def without_cache(recipe: dict) -> dict:
    return {k: v for k, v in recipe.items() if k != "token_cache"}


def run(
    recipe: dict,
    n: int = N,
    *,
    workers: int = 0,
    rank: int = 0,
    world: int = 1,
    state: dict | None = None,
) -> tuple[list[str], dict, dict]:
    """Digests of n batches, the state after them, and the loader's metrics."""
    loader = mixer.build_loader(recipe, rank=rank, world_size=world, num_workers=workers)
    if state is not None:
        loader.load_state_dict(state)
    out: list[str] = []
    if n:
        for batch in loader:
            out.append(batch_digest(batch))
            if len(out) == n:
                break
    return out, loader.state_dict(), loader.metrics()


def entries(recipe: dict) -> list[Path]:
    return sorted(Path(recipe["token_cache"]).glob("??/*.json"))  # (not tokenizers/*.json)


def test_cold_warm_and_partly_warm_give_the_same_batches(data, tmp_path):
    reference, _, metrics = run(without_cache(data))
    CACHE_STATS.reset()
    cold, _, cold_metrics = run(data)
    assert CACHE_STATS.writes > 0 and CACHE_STATS.hits == 0
    assert cold == reference and cold_metrics["skipped"] == metrics["skipped"]
    assert metrics["skipped"]["a"] >= 1  # the malformed line, replayed from the cache too
    CACHE_STATS.reset()
    warm, _, warm_metrics = run(data)
    assert CACHE_STATS.hits > 0
    assert warm == reference and warm_metrics["skipped"] == metrics["skipped"]
    fill(data, tmp_path)  # (a run writes only the splits it read whole, alone in its lane)
    assert len(entries(data)) >= 4
    for commit in entries(data)[::2]:  # partly warm: every other entry gone
        for suffix in (".json", ".bin"):
            commit.with_suffix(suffix).unlink()
    CACHE_STATS.reset()
    partly, _, _ = run(data)
    assert CACHE_STATS.hits > 0 and CACHE_STATS.misses > 0 and partly == reference


@pytest.mark.parametrize("workers,world", [(2, 1), (0, 2)])
def test_same_stream_with_workers_and_ranks(data, workers, world):
    reference = [run(without_cache(data), N // world, rank=r, world=world)[0] for r in range(world)]
    for _ in ("cold", "warm"):
        got = [run(data, N // world, workers=workers, rank=r, world=world)[0] for r in range(world)]
        assert got == reference
    assert entries(data)


@pytest.mark.parametrize("k", [0, 3, 11, 26])
def test_resume_inside_cached_and_uncached_splits(data, k):
    reference, _, _ = run(without_cache(data))
    first, state, _ = run(data, k)  # cold: entries being written when the state is taken
    rest, _, _ = run(data, N - k, state=state)  # now partly warm
    assert first + rest == reference
    rest_warm, _, _ = run(data, N - k, state=state)
    assert first + rest_warm == reference


def fill(recipe: dict, tmp_path: Path, *extra: str) -> Path:
    path = tmp_path / f"recipe{len(list(tmp_path.glob('recipe*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert cli(["cache", str(path), "--no-progress", *extra]) == 0
    return path


def splits_of(recipe: dict) -> int:
    from mixer.sources.manifest import list_sources

    return sum(len(t.splits) for t in list_sources(mixer.load_recipe(recipe)))


def test_cli_fills_every_split_then_a_run_tokenizes_no_text(data, tmp_path, monkeypatch, capsys):
    fill(data, tmp_path)
    assert len(entries(data)) == splits_of(data)
    assert "written" in capsys.readouterr().out
    reference, _, metrics = run(without_cache(data))
    tokenized = []
    real = mixer.tokenize.Encoder.__call__
    monkeypatch.setattr(
        mixer.tokenize.Encoder,
        "__call__",
        lambda self, texts: tokenized.extend(texts) or real(self, texts),
    )
    CACHE_STATS.reset()
    warm, _, warm_metrics = run(data)
    assert warm == reference and warm_metrics["skipped"] == metrics["skipped"]
    assert metrics["skipped"]["a"] >= 1  # the malformed line, replayed from the cache
    assert tokenized == [] and CACHE_STATS.misses == 0 and CACHE_STATS.hits > 0


def test_a_cached_bad_record_raises_the_same_error(data, tmp_path):
    fill(data, tmp_path)
    strict = {
        **data,
        "sources": [{**data["sources"][0], "on_error": "raise"}, *data["sources"][1:]],
    }
    errors = []
    for recipe in (without_cache(strict), strict):
        CACHE_STATS.reset()
        with pytest.raises(mixer.DataError) as caught:
            run(recipe, 10 * N)
        errors.append(
            (str(caught.value), caught.value.source, caught.value.file, caught.value.location)
        )
    assert CACHE_STATS.hits > 0 and CACHE_STATS.misses == 0
    assert errors[0] == errors[1] and "a0.jsonl" in errors[0][0]


def test_inspect_reports_the_cached_fraction(data, tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    assert cli(["inspect", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["token_cache"]
    assert [r["cached_splits"] for r in rows] == [0, 0, 0]
    fill(data, tmp_path)
    capsys.readouterr()
    assert cli(["inspect", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["token_cache"]
    assert all(r["cached_splits"] == r["splits"] > 0 and r["cached_bytes"] > 0 for r in rows)
    assert cli(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "token cache" in out and f"{rows[1]['splits']}/{rows[1]['splits']}" in out


def damage_truncate(entry: Path) -> None:
    data = entry.with_suffix(".bin").read_bytes()
    entry.with_suffix(".bin").write_bytes(data[: len(data) // 2])


def damage_flip(entry: Path) -> None:
    data = bytearray(entry.with_suffix(".bin").read_bytes())
    data[len(data) // 3] ^= 0x01
    entry.with_suffix(".bin").write_bytes(bytes(data))


def damage_index(entry: Path) -> None:
    data = bytearray(entry.with_suffix(".idx").read_bytes())
    data[40] ^= 0xFF  # inside the sequence lengths (after the 34-byte header)
    entry.with_suffix(".idx").write_bytes(bytes(data))


def counting_loads(monkeypatch) -> list[str]:
    """Files `Tokenizer.from_file` is asked to load from now on (none loaded before)."""
    from types import SimpleNamespace

    from mixer.tokenize import tokenizer as tokenizer_module

    loads: list[str] = []
    real = tokenizer_module.Tokenizer.from_file
    monkeypatch.setattr(
        tokenizer_module,
        "Tokenizer",
        SimpleNamespace(from_file=lambda file: loads.append(file) or real(file)),
    )
    monkeypatch.setattr(tokenizer_module, "_loaded", {})
    return loads


def test_a_warm_run_never_loads_the_tokenizer(data, tmp_path, monkeypatch):
    fill(data, tmp_path)  # (also keeps the resolved tokenizer in the cache)
    reference, _, _ = run(without_cache(data))
    assert list((Path(data["token_cache"]) / "tokenizers").glob("*.json"))
    loads = counting_loads(monkeypatch)
    CACHE_STATS.reset()
    assert run(data)[0] == reference
    assert loads == [] and CACHE_STATS.hits > 0 and CACHE_STATS.misses == 0


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["garbage", "tampered", "truncated"])
def test_a_damaged_tokenizer_info_means_a_real_load(data, tmp_path, monkeypatch, damage):
    fill(data, tmp_path)
    reference, _, _ = run(without_cache(data))
    plain = resolve_tokenizer(data["tokenizer"])
    [stored] = (Path(data["token_cache"]) / "tokenizers").glob("*.json")
    good = stored.read_text()
    kept = json.loads(good)
    if damage == "garbage":
        stored.write_bytes(b"\x00\xff{not json")
    elif damage == "tampered":  # a plausible id, the checksum left as it was
        stored.write_text(json.dumps({**kept, "eos_id": kept["eos_id"] + 1}))
    else:
        stored.write_text(good[: len(good) // 2])
    loads = counting_loads(monkeypatch)
    info = resolve_tokenizer(data["tokenizer"], info_cache=str(stored.parent))
    assert info == plain and loads == [data["tokenizer"]]
    assert stored.read_text() == good  # rewritten by the real load
    assert run(data)[0] == reference


def test_damaged_entries_are_detected_and_rebuilt(data, tmp_path):
    fill(data, tmp_path)
    reference, _, _ = run(without_cache(data))
    damaged = entries(data)
    cache = TokenCache(data["token_cache"], resolve_tokenizer(data["tokenizer"]))
    assert all(cache.load(entry.stem, check_tokens=True) is not None for entry in damaged)
    for i, entry in enumerate(damaged):  # each kind of damage on a third of the entries
        (damage_truncate, damage_flip, damage_index)[i % 3](entry)
    assert all(
        cache.load(entry.stem, check_tokens=True) is None  # each one detected
        for entry in damaged
    )
    CACHE_STATS.reset()
    assert run(data)[0] == reference
    assert CACHE_STATS.corrupt > 0 and CACHE_STATS.writes > 0  # the run rebuilt what it read
    fill(data, tmp_path)  # and `mixer cache` the rest
    CACHE_STATS.reset()
    assert run(data)[0] == reference
    assert CACHE_STATS.corrupt == 0 and CACHE_STATS.misses == 0


def blocks_of(entry: Path) -> tuple[int, int]:
    """(block size, number of blocks) of an entry's .bin, from its commit."""
    size, block, crcs = json.loads(entry.read_text())["bin"]
    return block, len(crcs)


@pytest.mark.parametrize("k", [3, 11])
def test_a_corrupt_block_met_after_a_resume_reads_the_source_from_there(
    data, tmp_path, monkeypatch, k
):
    monkeypatch.setattr(cache_module, "BIN_BLOCK", 32)  # many blocks per entry
    fill(data, tmp_path)
    reference, _, _ = run(without_cache(data))
    first, state, _ = run(data, k)
    damaged = [e for e in entries(data) if blocks_of(e)[1] >= 4]
    assert len(damaged) >= 4
    for entry in damaged:  # a flipped byte in every block from the middle on
        block, count = blocks_of(entry)
        tokens = bytearray(entry.with_suffix(".bin").read_bytes())
        for b in range(count // 2, count):
            tokens[b * block] ^= 0x01
        entry.with_suffix(".bin").write_bytes(bytes(tokens))
    CACHE_STATS.reset()
    rest, _, _ = run(data, N - k, state=state)
    assert first + rest == reference
    assert CACHE_STATS.corrupt > 0 and CACHE_STATS.hits > 0  # damage met inside replays
    fill(data, tmp_path)  # what the run neither rebuilt nor dropped, `mixer cache` rewrites
    CACHE_STATS.reset()
    assert run(data)[0] == reference
    assert CACHE_STATS.corrupt == 0 and CACHE_STATS.misses == 0


@pytest.mark.slow
def test_two_processes_filling_one_cache_at_once(data, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    started = [
        procs.spawn([sys.executable, "-m", "mixer", "cache", str(path), "--no-progress"], env=env)
        for _ in range(2)
    ]
    for proc in started:
        done = procs.finish(proc, timeout=120)
        assert done.returncode == 0, done.stderr
    assert len(entries(data)) == splits_of(data)
    assert not list(Path(data["token_cache"]).glob("*/*.tmp-*"))
    reference, _, _ = run(without_cache(data))
    CACHE_STATS.reset()
    assert run(data)[0] == reference
    assert CACHE_STATS.corrupt == 0 and CACHE_STATS.misses == 0


def warnings_of(caplog) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "mixer.token_cache" and r.levelno >= logging.WARNING
    ]


def test_unwritable_cache_warns_once_and_keeps_the_stream(data, tmp_path, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    recipe = {**data, "token_cache": str(blocker / "cache")}
    reference, _, _ = run(without_cache(data))
    with caplog.at_level(logging.WARNING, logger="mixer.token_cache"):
        assert run(recipe)[0] == reference
        assert run(recipe)[0] == reference
    assert len(warnings_of(caplog)) == 1
    assert "cannot be written" in warnings_of(caplog)[0].getMessage()


@pytest.mark.slow
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_full_or_read_only_cache_warns_once_and_reads_what_it_has(
    data, tmp_path, caplog, monkeypatch, code
):
    fill(data, tmp_path)
    for commit in entries(data)[::2]:
        commit.unlink()  # these splits would be written again

    def refuse(fs, path, payload):
        raise OSError(code, os.strerror(code), path)

    monkeypatch.setattr(cache_module, "_put", refuse)
    # Long enough to read every split to its end (which entries were removed depends on the
    # keys, and so on the temporary folder's path).
    reference, _, _ = run(without_cache(data), 400)
    CACHE_STATS.reset()
    with caplog.at_level(logging.WARNING, logger="mixer.token_cache"):
        assert run(data, 400)[0] == reference
    assert len(warnings_of(caplog)) == 1
    assert CACHE_STATS.hits > 0 and CACHE_STATS.writes == 0


def test_changed_tokenizer_or_rewritten_file_never_hits_a_stale_entry(data, tmp_path):
    fill(data, tmp_path)
    before = set(entries(data))
    # A tokenizer whose ids differ: its digest (part of every key) changes.
    tok = json.loads(Path(data["tokenizer"]).read_text())
    vocab = tok["model"]["vocab"]
    vocab["w3"], vocab["w4"] = vocab["w4"], vocab["w3"]
    Path(data["tokenizer"]).write_text(json.dumps(tok))
    reference, _, _ = run(without_cache(data))
    CACHE_STATS.reset()
    assert run(data)[0] == reference
    assert CACHE_STATS.hits == 0
    # A rewritten source file (same size, new content): its entries are not used either.
    fill(data, tmp_path)
    a1 = Path(data["sources"][0]["path"]).parent / "a1.jsonl"
    text = a1.read_text()
    a1.write_text(text.replace("w90 ", "w91 ", 1))
    os.utime(a1, ns=(1, 1))
    reference, _, _ = run(without_cache(data))
    CACHE_STATS.reset()
    assert run(data)[0] == reference
    assert CACHE_STATS.misses > 0 and len(set(entries(data)) - before) > 0


def test_an_entry_is_a_megatron_indexed_dataset(data, tmp_path):
    """Read back with numpy per the documented MMIDIDX layout, not with mixer's parser."""
    fill(data, tmp_path)
    docs = {d: n for d, n in corpus(1000, 50, min_len=20, max_len=90)}
    found = 0
    for commit in entries(data):
        idx = commit.with_suffix(".idx").read_bytes()
        assert idx[:9] == b"MMIDIDX\x00\x00"
        version, code = np.frombuffer(idx, "<u8", 1, 9)[0], idx[17]
        sequences, documents = np.frombuffer(idx, "<u8", 2, 18)
        assert version == 1 and code == 8  # uint16 for this vocabulary
        lengths = np.frombuffer(idx, "<i4", sequences, 34)
        pointers = np.frombuffer(idx, "<i8", sequences, 34 + 4 * sequences)
        doc_index = np.frombuffer(idx, "<i8", documents, 34 + 12 * sequences)
        assert list(doc_index) == list(range(sequences + 1))
        tokens = np.fromfile(commit.with_suffix(".bin"), "<u2")
        for length, pointer in zip(lengths, pointers):
            ids = tokens[pointer // 2 : pointer // 2 + length]
            assert ids[-1] == 0  # EOS
            doc = int(ids[0]) - word_id(0)
            if doc in docs:
                assert list(ids[:-1]) == [word_id(doc)] * docs[doc]
                found += 1
    assert found == 50  # every document of source b, each once


@pytest.mark.slow
def test_s3_cache_url(data, tmp_path, s3_endpoint):
    import boto3

    boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    ).create_bucket(Bucket="tokcache")
    recipe = {
        **data,
        "token_cache": "s3://tokcache/run1",
        "token_cache_storage_options": s3_options(s3_endpoint),
    }
    reference, _, _ = run(without_cache(data))
    CACHE_STATS.reset()
    assert run(recipe)[0] == reference
    assert CACHE_STATS.writes > 0
    CACHE_STATS.reset()
    assert run(recipe)[0] == reference
    assert CACHE_STATS.hits > 0 and CACHE_STATS.corrupt == 0


@pytest.mark.slow
def test_cache_under_torchrun_ranks_share_the_splits(data, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    result = procs.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "mixer",
            "cache",
            str(path),
            "--no-progress",
        ],
        timeout=180,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    total = splits_of(data)
    written = sorted(
        int(line.split(": ")[1].split()[0])
        for line in result.stdout.splitlines()
        if line.startswith("rank ")
    )
    assert written == [total // 2, total - total // 2]  # each rank filled its share
    assert len(entries(data)) == total


def test_local_files_alike_in_key_size_and_mtime_do_not_share_an_entry(data, tmp_path):
    """Two sources' `000.jsonl` of equal size and pinned mtime but other words."""
    for name, first in (("x", 3000), ("y", 4000)):
        write_docs(tmp_path / name / "000.jsonl", [(first + i, 5) for i in range(20)], "jsonl")
        os.utime(tmp_path / name / "000.jsonl", ns=(10**18, 10**18))
    assert (tmp_path / "x" / "000.jsonl").stat().st_size == (
        tmp_path / "y" / "000.jsonl"
    ).stat().st_size
    recipe = {
        **data,
        "sources": [
            {"name": n, "path": str(tmp_path / n / "*.jsonl"), "weight": 0.5} for n in "xy"
        ],
    }
    reference, _, _ = run(without_cache(recipe))
    fill(recipe, tmp_path)
    assert len(entries(recipe)) == splits_of(recipe)
    assert run(recipe)[0] == reference


def test_image_recipes_bypass_the_cache_and_say_so(caplog, tmp_path):
    from types import SimpleNamespace

    from mixer.cache.store import open_cache

    recipe = SimpleNamespace(
        token_cache=str(tmp_path / "c"),
        images=object(),
        token_cache_storage_options={},
        resolve=lambda p: p,
    )
    with caplog.at_level(logging.WARNING, logger="mixer.token_cache"):
        assert open_cache(recipe, None) is None
        assert open_cache(recipe, None) is None
    assert len(warnings_of(caplog)) == 1 and "image" in warnings_of(caplog)[0].getMessage()


@pytest.mark.slow
def test_a_run_caches_seekable_splits_read_over_many_windows(tmp_path, monkeypatch):
    """Parquet row groups and plain-jsonl ranges close their reader at every full window (as
    without a cache) while the stream writes their entries: a later run replays every one.
    The cache is looked up once per split read, not once per window."""
    loads = []
    original = TokenCache.load
    monkeypatch.setattr(
        TokenCache, "load", lambda self, *a, **k: loads.append(1) or original(self, *a, **k)
    )
    tok = make_tokenizer(tmp_path / "tok.json")
    write_docs(
        tmp_path / "p" / "p0.parquet",
        corpus(0, 120, min_len=5, max_len=40),
        "parquet",
        row_group_size=7,
    )
    write_docs(tmp_path / "j" / "j0.jsonl", corpus(500, 90, max_len=30), "jsonl")
    recipe = {
        "seed": 2,
        "tokenizer": str(tok),
        "seq_len": 16,
        "batch_size": 2,
        "lanes": 1,
        "shuffle_window": 5,
        "token_cache": str(tmp_path / "cache"),
        "sources": [
            {"name": "p", "path": str(tmp_path / "p" / "*.parquet"), "weight": 0.6},
            {"name": "j", "path": str(tmp_path / "j" / "*.jsonl"), "weight": 0.4},
        ],
    }
    n = 300  # past the end of both sources' first epoch
    reference = run(without_cache(recipe), n)[0]
    CACHE_STATS.reset()
    assert run(recipe, n)[0] == reference
    assert CACHE_STATS.writes == splits_of(recipe)
    assert len(loads) <= 4 * splits_of(recipe)  # (< 4 epochs; 5-document windows)
    loads.clear()  # 4 lanes: still one lookup per split read
    striped = {**recipe, "lanes": 4, "token_cache": str(tmp_path / "cache-2")}
    assert run(striped, n)[0] == run(without_cache(striped), n)[0]
    assert len(loads) <= 3 * splits_of(striped)  # (fewer than 3 epochs of each split)
    CACHE_STATS.reset()
    assert run(recipe, n)[0] == reference
    assert CACHE_STATS.misses == 0 and CACHE_STATS.hits >= splits_of(recipe)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_a_writer_holds_only_documents_ahead_of_an_earlier_one(tmp_path_factory, draw):
    """Tokens arrive in any order within a window; the writer spills each document once every
    earlier one is in, so it never holds more than a window, and the entry it stores is the
    documents in order."""
    from mixer.cache.store import SplitWriter
    from mixer.core.records import Record
    from mixer.tokenize.tokenizer import TokenizerInfo

    folder = tmp_path_factory.mktemp("cache")
    info = TokenizerInfo(path="t", eos_id=1, bos_id=None, pad_id=0, digest="d", vocab_size=1000)
    cache = TokenCache(str(folder), info)
    count = draw.draw(st.integers(0, 60))
    window = draw.draw(st.integers(1, 8))
    docs = [
        np.arange(i, i + draw.draw(st.integers(0, 9)), dtype=np.uint32) % 1000 for i in range(count)
    ]
    writer = SplitWriter(cache, "k" * 32, "file")
    for start in range(0, count, window):
        numbers = [
            writer.record(Record(i, i * 10, f"t{i}"))
            for i in range(start, min(start + window, count))
        ]
        for doc in draw.draw(st.permutations(numbers)):
            writer.add_tokens(doc, docs[doc])
            assert len(writer.ahead) < window
    writer.end()
    stored = cache.load("k" * 32, check_tokens=True)
    assert stored is not None and len(stored.starts) == count + 1
    for d, ids in enumerate(docs):
        got = stored.tokens.tokens(int(stored.starts[d]), int(stored.starts[d + 1]))
        assert np.array_equal(got, ids)
    assert stored.records[:, 0].tolist() == list(range(count))


@pytest.mark.slow
@pytest.mark.parametrize("where", ["spill", "store"])
def test_a_disk_that_fills_while_writing_warns_once_and_keeps_the_stream(
    data, tmp_path, caplog, monkeypatch, where
):
    """ENOSPC while a split's tokens go to their temporary file (flushed every 64 bytes here),
    or while the entry is copied into the cache: one warning, the stream as without a cache,
    and `mixer cache` still exits 0."""
    monkeypatch.setattr(spill_module, "SPILL_BUFFER", 64)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if where == "spill":
        monkeypatch.setattr(os, "pwrite", full)
    else:
        monkeypatch.setattr(cache_module, "_put_chunks", full)
    reference, _, _ = run(without_cache(data), 200)
    with caplog.at_level(logging.WARNING, logger="mixer.token_cache"):
        assert run(data, 200)[0] == reference
        assert run({**data, "lanes": 1}, 50)[0] == run(without_cache({**data, "lanes": 1}), 50)[0]
        fill(data, tmp_path)
    assert len(warnings_of(caplog)) == 1
    assert not entries(data) and spill_module._open_files.count == 0


@pytest.mark.slow
def test_spill_files_are_capped_per_process_and_closed_with_the_loader(data, monkeypatch):
    """Beyond its share of file descriptors a writer gives its entry up (the cache stays
    writable: later splits are cached); closing the loader closes every spill file."""
    monkeypatch.setattr(spill_module, "SPILL_BUFFER", 16)
    monkeypatch.setattr(spill_module, "_max_open_files", lambda: 2)
    peak = []
    original = spill_module.TokenSpill._open

    def counting(self):
        original(self)
        peak.append(spill_module._open_files.count)

    monkeypatch.setattr(spill_module.TokenSpill, "_open", counting)
    reference, _, _ = run(without_cache(data), 400)
    CACHE_STATS.reset()
    loader = mixer.build_loader(data)
    out = []
    for batch in loader:
        out.append(batch_digest(batch))
        if len(out) == 400:
            break
    assert out == reference
    assert CACHE_STATS.writes > 0 and max(peak) <= 2
    loader = mixer.build_loader({**data, "token_cache": data["token_cache"] + "-2"})
    for _batch in loader:
        if spill_module._open_files.count:  # entries under way
            break
    loader.close()
    assert spill_module._open_files.count == 0


def test_a_window_resumed_past_its_start_writes_no_entry(tmp_path, monkeypatch):
    """Resumed inside a split's first window, the documents before the position are not
    tokenized again: no entry is adopted (it could never complete and would hold the whole
    split), and the stream is the same."""
    tok = make_tokenizer(tmp_path / "tok.json")
    write_docs(tmp_path / "j" / "j0.jsonl", corpus(0, 300, max_len=12), "jsonl")
    recipe = {
        "seed": 4,
        "tokenizer": str(tok),
        "seq_len": 16,
        "batch_size": 2,
        "lanes": 1,
        "shuffle_window": 64,
        "token_cache": str(tmp_path / "cache"),
        "sources": [{"name": "j", "path": str(tmp_path / "j" / "*.jsonl"), "weight": 1.0}],
    }
    reference, _, _ = run(without_cache(recipe), 30)
    _, state, _ = run(without_cache(recipe), 3)
    assert state  # (three batches: inside the first window of 64 documents)
    ahead = []
    original = cache_module.SplitWriter.add_tokens

    def watching(self, doc, ids):
        original(self, doc, ids)
        ahead.append(len(self.ahead))

    monkeypatch.setattr(cache_module.SplitWriter, "add_tokens", watching)
    assert run(recipe, 27, state=state)[0] == reference[3:]
    assert max(ahead, default=0) < 64


@pytest.mark.slow
def test_a_forked_child_that_exits_normally_leaves_the_entry_intact(tmp_path):
    """A child forked mid-split (exiting through the interpreter, finalizers and all) writes
    nothing into its parent's temporary files: the entry the parent stores replays the same
    stream."""
    tok = make_tokenizer(tmp_path / "tok.json")
    write_docs(tmp_path / "a" / "a0.jsonl", corpus(0, 600, min_len=5, max_len=40), "jsonl")
    recipe = {
        "seed": 1,
        "tokenizer": str(tok),
        "seq_len": 64,
        "batch_size": 2,
        "lanes": 1,
        "shuffle_window": 16,
        "split_bytes": 1 << 30,
        "token_cache": str(tmp_path / "c"),
        "sources": [{"name": "a", "path": str(tmp_path / "a" / "*.jsonl"), "weight": 1.0}],
    }
    reference, _, _ = run(without_cache(recipe), 300)
    script = f"""
import os, sys, json
sys.path.insert(0, {str(ROOT / "tests")!r})
import mixer
from helpers import batch_digest
loader = mixer.build_loader(json.loads({json.dumps(json.dumps(recipe))}))
out = []
for batch in loader:
    out.append(batch_digest(batch))
    if len(out) % 60 == 0:   # five forks while the one split's entry is written
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
    if len(out) == 300:
        break
print(json.dumps(out))
"""
    done = procs.run([sys.executable, "-c", script], timeout=120)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == reference
    assert entries(recipe)
    CACHE_STATS.reset()
    assert run(recipe, 300)[0] == reference and CACHE_STATS.hits > 0
