"""best_fit packing: fewer cut documents than concat, same documents, sound labels."""

from __future__ import annotations

from helpers import EOS_ID, corpus, expected_counts, token_counts, write_docs
from hypothesis import given
from hypothesis import strategies as st

import mixer
from mixer.pipeline.best_fit import plan_rows


@given(lengths=st.lists(st.integers(1, 16), max_size=60), seq_len=st.integers(16, 40))
def test_plan_places_every_piece_once_within_capacity(lengths, seq_len):
    rows = plan_rows(lengths, seq_len)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= seq_len for row in rows)
    # best fit never leaves two rows that could have been merged... at most one half-empty
    assert sum(1 for row in rows if sum(lengths[i] for i in row) <= seq_len // 2) <= 1


def _cut_documents(batches) -> int:
    """Documents whose tokens appear in more than one row."""
    rows_of: dict[int, set] = {}
    n = 0
    for batch in batches:
        for ids, src in zip(batch["input_ids"].tolist(), batch["source_ids"].tolist()):
            n += 1
            for token, s in zip(ids, src):
                if s >= 0 and token != EOS_ID:
                    rows_of.setdefault(token, set()).add(n)
    return sum(1 for rows in rows_of.values() if len(rows) > 1)


def test_best_fit_cuts_fewer_documents_and_loses_none(tmp_path, tokenizer_path):
    docs = corpus(0, 400, min_len=2, max_len=40)
    write_docs(tmp_path / "d.jsonl", docs, "jsonl")
    base = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 64,
        "batch_size": 4,
        "lanes": 2,
        "mask_document_boundaries": True,
        "sources": [{"name": "d", "path": str(tmp_path / "d.jsonl"), "weight": 1, "epochs": 1}],
    }
    concat = list(mixer.build_loader(base))
    best = list(mixer.build_loader({**base, "packing": "best_fit", "pack_window": 64}))
    assert token_counts(best) == expected_counts(docs)
    assert _cut_documents(best) * 4 < _cut_documents(concat)
    padding = sum(int((b["source_ids"] < 0).sum()) for b in best)
    assert padding < 0.1 * sum(b["source_ids"].numel() for b in best)
    for batch in best:  # positions restart per piece; no piece's first token is a label
        ids, labels, pos = batch["input_ids"], batch["labels"], batch["position_ids"]
        starts = (pos == 0) & (batch["source_ids"] >= 0)
        assert (labels[starts] == -100).all()
        assert (
            labels[~starts & (batch["source_ids"] >= 0)]
            == ids[~starts & (batch["source_ids"] >= 0)]
        ).all()
