"""`metrics()["epochs"]` counts what the batches handed out hold: under `best_fit` the
documents read into a packing window count as their rows are delivered, not when read."""

from __future__ import annotations

import pytest
from helpers import corpus, write_docs

import mixer

DOCS = 48  # in the lane's slice: the default pack_window (256) reads 5.3 passes ahead


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> dict:
    from helpers import make_tokenizer

    root = tmp_path_factory.mktemp("epochs")
    docs = corpus(0, DOCS, min_len=2, max_len=12)
    for part in range(6):
        write_docs(root / f"d{part}.jsonl", docs[part::6], "jsonl")
    return {
        "seed": 5,
        "tokenizer": str(make_tokenizer(root / "tokenizer.json")),
        "seq_len": 16,
        "batch_size": 2,
        "lanes": 1,
        "packing": "best_fit",
        "sources": [{"name": "d", "path": str(root / "d*.jsonl"), "weight": 1.0}],
    }


def _delivered(batch) -> int:
    """Documents that start in `batch` (each fits a row: one piece per document)."""
    return int(((batch["position_ids"] == 0) & (batch["source_ids"] >= 0)).sum())


def test_epochs_count_delivered_documents_not_the_packing_window(recipe):
    loader = mixer.build_loader(recipe)
    delivered, seen = 0, []
    for step, batch in enumerate(loader):
        delivered += _delivered(batch)
        seen.append((delivered / DOCS, loader.metrics()["epochs"]["d"]))
        if step == 40:
            break
    for passes, epochs in seen:
        assert abs(epochs - passes) <= 0.25, seen
    assert seen[-1][0] > 2  # (it did go round: about 1.3 documents per row)


def test_a_resumed_loader_reports_the_same_epochs(recipe):
    loader = mixer.build_loader(recipe)
    it = iter(loader)
    for _ in range(7):
        next(it)
    state = loader.state_dict()
    before = loader.metrics()["epochs"]["d"]
    after = [(next(it), loader.metrics()["epochs"]["d"])[1] for _ in range(30)]
    resumed = mixer.build_loader(recipe)
    resumed.load_state_dict(state)
    assert resumed.metrics()["epochs"]["d"] == pytest.approx(before)
    rit = iter(resumed)
    again = [(next(rit), resumed.metrics()["epochs"]["d"])[1] for _ in range(30)]
    assert again == pytest.approx(after, abs=1e-3)
