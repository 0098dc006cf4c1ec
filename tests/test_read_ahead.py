"""Reading the first windows while the tokenizer loads: a stream that reads its next window
early (`SourceStream.read_ahead`) gives the same batches, state and metrics at every step; a
read that fails surfaces where it would have; DataLoader workers start from lanes their parent
read while fastokens loaded, and give the batches of num_workers 0."""

from __future__ import annotations

import gzip
import hashlib
import json
import time
from pathlib import Path

import pytest
from helpers import corpus, take_digests, write_docs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixer
from mixer.pipeline.lanes import Lane
from mixer.runtime import lane_dataset
from mixer.sources import list_source
from mixer.tokenize import Encoder, backends, resolve_tokenizer, verify
from mixer.tokenize import tokenizer as tokenizer_module

DEMO_TOKENIZER = Path(__file__).resolve().parent.parent / "data" / "tokenizer.json"


def _recipe(tmp_path, tokenizer_path, on_error: str = "skip") -> dict:
    """Four sources in four formats; the gzip one, drawn rarely, has malformed lines among
    its first records (what its first window skips shows in the state once it is read)."""
    docs = corpus(0, 300, max_len=30)
    for part in range(2):
        write_docs(tmp_path / "prose" / f"p{part}.jsonl", docs[part::2], "jsonl")
    write_docs(tmp_path / "code.parquet", corpus(1000, 80, min_len=20, max_len=90, seed=1),
               "parquet", row_group_size=9)
    write_docs(tmp_path / "web.jsonl.zst", corpus(2000, 150, max_len=12, seed=2), "jsonl.zst")
    lines = [json.dumps({"text": f"g{d} " * (1 + d % 7)}) for d in range(200)]
    for bad in (0, 1, 2, 3, 57, 58, 140):
        lines[bad] = '{"text": broken'
    (tmp_path / "bad.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return {"seed": 5, "tokenizer": str(tokenizer_path), "seq_len": 16, "batch_size": 3,
            "lanes": 2, "shuffle_window": 6, "split_bytes": 1200,
            "sources": [
                {"name": "prose", "path": str(tmp_path / "prose" / "*.jsonl"), "weight": 0.5},
                {"name": "code", "path": str(tmp_path / "code.parquet"), "weight": 0.25},
                {"name": "web", "path": str(tmp_path / "web.jsonl.zst"), "weight": 0.22},
                {"name": "bad", "path": str(tmp_path / "bad.jsonl.gz"), "weight": 0.03,
                 "on_error": on_error}]}


def _digest(batch) -> str:
    h = hashlib.blake2b(digest_size=8)
    for key in sorted(batch.arrays):
        h.update(key.encode() + batch.arrays[key].tobytes())
    return h.hexdigest()


def _run(lane: Lane, recipe, steps: int, ahead: set[int]) -> list[tuple[str, str]]:
    out = []
    for step in range(steps):
        if step in ahead:
            lane.read_ahead(lambda: True)
        out.append((_digest(lane.next_batch(recipe.batch_size)),
                    json.dumps(lane.state_dict(), sort_keys=True)))
    return out


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ahead=st.sets(st.integers(0, 59), max_size=20), resume_at=st.integers(0, 30))
def test_reading_ahead_changes_no_batch_state_or_metric(tmp_path, tokenizer_path, ahead,
                                                        resume_at):
    recipe = mixer.load_recipe(_recipe(tmp_path, tokenizer_path))
    tables = [list_source(recipe, s) for s in recipe.sources]
    encoder = Encoder(resolve_tokenizer(recipe.tokenizer))
    reference = _run(Lane(1, recipe, tables, encoder), recipe, 60, set())
    assert _run(Lane(1, recipe, tables, encoder), recipe, 60, ahead) == reference
    # resumed from a state: reading ahead first reads the window the state is inside
    start = Lane(1, recipe, tables, encoder)
    _run(start, recipe, resume_at, set())
    resumed = Lane(1, recipe, tables, encoder, start.state_dict())
    later = {step - resume_at for step in ahead if step >= resume_at} | {0}
    assert _run(resumed, recipe, 60 - resume_at, later) == reference[resume_at:]


def _slow_fresh_fastokens(monkeypatch, tmp_path, seconds: float) -> list[int]:
    """As in a new process with a warm verdict: nothing loaded, and fastokens' load takes
    `seconds` more (a loader reads ahead meanwhile). Returns the lanes `prepare` read ahead
    for DataLoader workers, as it makes them."""
    monkeypatch.setattr(tokenizer_module, "_loaded", {})
    monkeypatch.setattr(backends, "_fast_loaded", {})
    monkeypatch.setattr(verify, "_verdicts", {})
    real = backends._load_fastokens
    monkeypatch.setattr(backends, "_load_fastokens",
                        lambda file, digest: (time.sleep(seconds), real(file, digest))[1])
    prepared: list[int] = []
    real_prepare = lane_dataset.LaneDataset.prepare

    def prepare(self, workers):
        real_prepare(self, workers)
        prepared.extend(index for index, _, _ in self._prepared.values())

    monkeypatch.setattr(lane_dataset.LaneDataset, "prepare", prepare)
    return prepared


def _loader_recipe(tmp_path, on_error: str = "skip") -> dict:
    return {**_recipe(tmp_path, DEMO_TOKENIZER, on_error), "tokenizer_backend": "fastokens",
            "lanes": 4}


def _batches_and_state(loader, n: int) -> tuple[list[str], str]:
    digests = take_digests(loader, n)
    state = json.dumps(loader.state_dict(), sort_keys=True, default=str)
    metrics = json.dumps(loader.metrics(), sort_keys=True, default=str)
    loader.close()
    return digests, state + metrics


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_reads_ahead_while_fastokens_loads_and_gives_the_same_stream(
        tmp_path, monkeypatch, workers):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    recipe = _loader_recipe(tmp_path)
    reference = _batches_and_state(mixer.build_loader(recipe, num_workers=0), 12)  # (warm)
    read = []
    real_read_ahead = Lane.read_ahead
    monkeypatch.setattr(Lane, "read_ahead",
                        lambda self, go: read.append(real_read_ahead(self, go)) or read[-1])
    prepared = _slow_fresh_fastokens(monkeypatch, tmp_path, 1.0)
    got = _batches_and_state(mixer.build_loader(recipe, num_workers=workers), 12)
    assert got == reference
    if workers:   # each worker's first lane, read in the loader's process before the fork
        assert sorted(prepared) == [0, 1]
    assert sum(read) >= 4   # every stream of a first lane read its window ahead


@pytest.mark.parametrize("workers", [0, 2])
def test_a_window_that_fails_when_read_ahead_fails_where_it_would_have(tmp_path, monkeypatch,
                                                                       workers):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    recipe = _loader_recipe(tmp_path, on_error="raise")

    def until_error(loader) -> tuple[int, str]:
        taken = 0
        try:
            for _ in loader:
                taken += 1
        except mixer.DataError as exc:
            return taken, str(exc)
        finally:
            loader.close()
        raise AssertionError("no error")

    reference = until_error(mixer.build_loader(recipe, num_workers=0))
    assert "bad.jsonl.gz" in reference[1]
    _slow_fresh_fastokens(monkeypatch, tmp_path, 1.0)
    assert until_error(mixer.build_loader(recipe, num_workers=workers)) == reference
