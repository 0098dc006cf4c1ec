"""Every stateful stage passes one resume check (as in torchdata.nodes' shared harness)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import corpus, write_docs
from hypothesis import given, settings
from hypothesis import strategies as st

import mixer
from mixer.pipeline.lanes import Lane
from mixer.pipeline.packing import Packer
from mixer.pipeline.settings import StreamSettings
from mixer.pipeline.stream import SourceStream
from mixer.sources import list_source
from mixer.tokenize import Encoder, resolve_tokenizer


def check_resume(
    make: Callable[[], Any], step: Callable[[Any], Any], total: int, points: list[int]
) -> None:
    """Stopping after k outputs, saving, and loading into a fresh stage changes nothing.

    Covers the initial state (k = 0), mid-stream, across epoch ends, the end of a finite stream
    and a second save/load in a row.
    """
    stage = make()
    reference = [step(stage) for _ in range(total)]
    for k in points:
        first = make()
        assert [step(first) for _ in range(k)] == reference[:k]
        state = json.loads(json.dumps(first.state_dict()))
        second = make()
        second.load_state_dict(state)
        again = make()
        again.load_state_dict(json.loads(json.dumps(second.state_dict())))
        assert [step(again) for _ in range(total - k)] == reference[k:], f"resume after {k}"


@pytest.fixture
def setup(tmp_path, tokenizer_path):
    docs = corpus(0, 90, max_len=25)
    for part in range(3):
        write_docs(tmp_path / f"d{part}.jsonl", docs[part::3], "jsonl")
    write_docs(tmp_path / "z.jsonl.zst", corpus(500, 40), "jsonl.zst")
    recipe = mixer.load_recipe(
        {
            "tokenizer": str(tokenizer_path),
            "seq_len": 8,
            "batch_size": 3,
            "lanes": 2,
            "shuffle_window": 7,
            "split_bytes": 600,
            "sources": [
                {"name": "d", "path": str(tmp_path / "d*.jsonl"), "weight": 2, "epochs": 3},
                {"name": "z", "path": str(tmp_path / "z.jsonl.zst"), "weight": 1},
            ],
        }
    )
    tables = [list_source(recipe, s) for s in recipe.sources]
    return recipe, tables, Encoder(resolve_tokenizer(str(tokenizer_path)))


def _stream(recipe, tables, encoder, index: int = 0, lane: int = 1) -> SourceStream:
    src = recipe.sources[index]
    settings = StreamSettings(
        lanes=recipe.lanes,
        seed=recipe.seed,
        epochs=src.epochs,
        on_error=src.on_error,
        text_field=src.text_field,
        window_docs=recipe.shuffle_window,
        window_bytes=recipe.window_bytes,
        max_document_bytes=recipe.max_document_bytes,
    )
    return SourceStream(table=tables[index], lane=lane, settings=settings, encode=encoder)


def _doc(stream: SourceStream):
    doc = stream.next_document()
    return None if doc is None else doc.tokens.tolist()


def test_source_stream_resumes_exactly(setup):
    recipe, tables, encoder = setup
    make = lambda: _stream(recipe, tables, encoder)  # noqa: E731
    n = 0
    probe = make()
    while probe.next_document() is not None:
        n += 1
    assert n > 100, "three epochs of the lane's slice"
    check_resume(make, _doc, n + 2, [0, 1, 6, 7, 8, n // 3, n // 3 + 1, n - 1, n, n + 1])


def test_packer_resumes_exactly_with_a_partial_document(setup):
    recipe, tables, encoder = setup

    def make() -> Packer:
        return Packer(
            _stream(recipe, tables, encoder),
            seq_len=8,
            mode="concat",
            pad_id=1,
            mask_document_boundaries=True,
        )

    def row(packer: Packer):
        r = packer.next_row()
        return None if r is None else (r.input_ids.tolist(), r.labels.tolist(), r.real)

    check_resume(make, row, 200, [0, 1, 2, 3, 17, 50, 199])


def test_packer_state_holds_a_pending_document_offset(setup):
    recipe, tables, encoder = setup
    packer = Packer(
        _stream(recipe, tables, encoder),
        seq_len=8,
        mode="concat",
        pad_id=1,
        mask_document_boundaries=False,
    )
    offsets = []
    for _ in range(40):
        packer.next_row()
        offsets.append(packer.state_dict()["offset"])
    assert any(offsets), "some rows cut a document, so the state carries a token offset"


def test_lane_resumes_exactly(setup):
    recipe, tables, encoder = setup

    def make() -> Lane:
        return Lane(1, recipe, tables, encoder)

    def batch(lane: Lane):
        b = lane.next_batch(3)
        return b.input_ids.tolist(), b.source_ids.tolist(), b.padding

    check_resume(make, batch, 120, [0, 1, 5, 33, 119])


def test_best_fit_packer_resumes_exactly(setup):
    from mixer.pipeline.best_fit import BestFitPacker

    recipe, tables, encoder = setup

    def make() -> BestFitPacker:
        return BestFitPacker(
            _stream(recipe, tables, encoder),
            seq_len=8,
            pad_id=1,
            mask_document_boundaries=True,
            window=5,
        )

    def row(packer: BestFitPacker):
        r = packer.next_row()
        return None if r is None else (r.input_ids.tolist(), r.labels.tolist(), r.real)

    check_resume(make, row, 200, [0, 1, 2, 3, 17, 50, 199])


class _ListSource:
    """Documents from a list: the smallest resumable `DocumentSource`."""

    name, lane = "list", 0

    def __init__(self, docs: list[list[int]]) -> None:
        self.docs, self.at = docs, 0

    @property
    def done(self) -> bool:
        return self.at >= len(self.docs)

    def next_document(self):
        from mixer.core.document import Document

        if self.done:
            return None
        self.at += 1
        return Document(np.array(self.docs[self.at - 1], dtype=np.uint32))

    def state_dict(self) -> dict[str, int]:
        return {"at": self.at}

    def load_state_dict(self, state) -> None:
        self.at = 0 if state is None else state["at"]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=12),
    seq_len=st.integers(1, 9),
    mask=st.booleans(),
    resume_at=st.integers(0, 80),
)
def test_concat_rows_are_the_documents_cut_in_order_and_a_packer_holds_little(
    lengths, seq_len, mask, resume_at
):
    """`concat` rows are the documents' tokens back to back cut every seq_len (labels -100 at
    each document's first token when masking; `starts` counts the documents begun); a pending
    document is held as at most twice
    what is left of it (its packed front is cut off); a packer resumed from the state after
    any row goes on with the same rows."""
    docs, token = [], 10
    for n in lengths:
        docs.append(list(range(token, token + n)))
        token += n
    flat = [t for d in docs for t in d]
    starts = set(np.cumsum([0] + lengths[:-1]).tolist())

    def make() -> Packer:
        return Packer(
            _ListSource(docs),
            seq_len=seq_len,
            mode="concat",
            pad_id=0,
            mask_document_boundaries=mask,
        )

    packer, rows, states = make(), [], []
    while (row := packer.next_row()) is not None:
        rows.append((row.input_ids.tolist(), row.labels.tolist()))
        assert row.starts == len(
            starts & set(range(len(rows) * seq_len - seq_len, len(rows) * seq_len))
        )
        states.append(packer.state_dict())
        if packer._pending is not None:
            document, offset = packer._pending[:2]
            assert len(document) <= 2 * (len(document) - offset)
    for i, (ids, labels) in enumerate(rows):
        at = i * seq_len
        real = flat[at : at + seq_len]
        assert ids[: len(real)] == real and all(t == 0 for t in ids[len(real) :])
        assert labels[: len(real)] == [
            -100 if mask and at + k in starts else t for k, t in enumerate(real)
        ]
    k = resume_at % len(rows)
    resumed = make()
    resumed.load_state_dict(states[k])
    again = []
    while (row := resumed.next_row()) is not None:
        again.append((row.input_ids.tolist(), row.labels.tolist()))
    assert again == rows[k + 1 :]
