"""Whole-file compressed readers kept open between windows are bounded per process, and
closing one changes nothing in the stream: its lane re-opens it at the cursor."""

from __future__ import annotations

import pytest
from helpers import batch_digest, corpus, expected_counts, token_counts, write_docs

import mixer
from mixer.open_readers import OpenReaders, open_readers


@pytest.fixture
def striped_recipe(tmp_path, tokenizer_path):
    """Two whole-file compressed sources (no seek points: one split per file) striped over
    8 lanes, and a plain one; small windows, so a reader pauses many times in a split."""
    zst = corpus(0, 300, max_len=20)
    gz = corpus(1000, 200, max_len=20)
    plain = corpus(2000, 200, max_len=20)
    for part in range(2):
        write_docs(tmp_path / f"z{part}.jsonl.zst", zst[part::2], "jsonl.zst")
        write_docs(tmp_path / f"g{part}.jsonl.gz", gz[part::2], "jsonl.gz")
    write_docs(tmp_path / "plain.jsonl", plain, "jsonl")
    sources = [("zst", "z*.jsonl.zst", 2), ("gz", "g*.jsonl.gz", 1), ("plain", "plain.jsonl", 1)]
    recipe = {"seed": 7, "tokenizer": str(tokenizer_path), "seq_len": 32, "batch_size": 4,
              "lanes": 8, "shuffle_window": 8,
              "sources": [{"name": name, "path": str(tmp_path / glob), "weight": weight,
                           "epochs": 1} for name, glob, weight in sources]}
    return recipe, zst + gz + plain


def _run(recipe, limit: int, monkeypatch, **kwargs) -> tuple[list[dict], int]:
    """All batches of one epoch with at most `limit` readers open, and the most seen open."""
    monkeypatch.setattr(open_readers, "limit", limit)
    batches, most = [], 0
    for batch in mixer.build_loader(recipe, **kwargs):
        batches.append(batch)
        most = max(most, len(open_readers))
    return batches, most


def test_closing_readers_changes_nothing_in_the_stream(striped_recipe, monkeypatch):
    recipe, docs = striped_recipe
    wide, most_wide = _run(recipe, 1000, monkeypatch)
    narrow, most_narrow = _run(recipe, 2, monkeypatch)
    assert most_wide > 2   # without a limit more are open: the narrow run really closed some
    assert most_narrow <= 2
    assert [batch_digest(b) for b in narrow] == [batch_digest(b) for b in wide]
    assert token_counts(narrow) == expected_counts(docs)   # every document exactly once


def test_resume_with_readers_closed(striped_recipe, monkeypatch):
    recipe, _ = striped_recipe
    reference, _ = _run(recipe, 1000, monkeypatch)
    monkeypatch.setattr(open_readers, "limit", 3)
    for stop in (1, 7, len(reference) // 2):
        loader = mixer.build_loader(recipe)
        head = [b for _, b in zip(range(stop), loader)]
        state = loader.state_dict()
        resumed = mixer.build_loader(recipe)
        resumed.load_state_dict(state)
        tail = list(resumed)
        assert [batch_digest(b) for b in head + tail] == [batch_digest(b) for b in reference]


def test_workers_bound_their_own_readers(striped_recipe, monkeypatch):
    recipe, _ = striped_recipe
    reference, _ = _run(recipe, 1000, monkeypatch)
    with_workers, _ = _run(recipe, 1, monkeypatch, num_workers=2)
    assert [batch_digest(b) for b in with_workers] == [batch_digest(b) for b in reference]


class _Owner:
    def __init__(self, log: list) -> None:
        self.log = log

    def close_reader(self) -> None:
        self.log.append(self)


def test_least_recently_used_closes_first():
    closed: list = []
    readers = OpenReaders(limit=2)
    a, b, c = (_Owner(closed) for _ in range(3))
    readers.hold(a)
    readers.hold(b)
    readers.hold(a)            # used again: b is now the oldest
    readers.hold(c)
    assert closed == [b] and len(readers) == 2
    readers.release(a)         # taken back: not closed later
    d, e = _Owner(closed), _Owner(closed)
    readers.hold(d)
    readers.hold(e)
    assert closed == [b, c]


def test_a_forked_child_forgets_its_parents_readers(monkeypatch):
    closed: list = []
    readers = OpenReaders(limit=1)
    owners = [_Owner(closed) for _ in range(2)]
    readers.hold(owners[0])
    monkeypatch.setattr("os.getpid", lambda: -5)   # as in a forked worker
    readers.hold(owners[1])
    assert closed == [] and len(readers) == 1      # the parent's entry is not closed here


def test_dead_streams_do_not_count():
    readers = OpenReaders(limit=4)
    for _ in range(10):
        readers.hold(_Owner([]))   # each dropped at once
    assert len(readers) == 0
