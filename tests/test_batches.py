"""Batch content: labels, positions, EOS ownership, padding and the `pad` packing mode."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import EOS_ID, FIRST_WORD_ID, corpus, expected_counts, token_counts, write_docs

import mixer
from mixer.core.document import Document
from mixer.pipeline.batch import BatchLayout
from mixer.pipeline.packing import build_row


def batches(recipe: dict, n: int | None = None) -> list[dict]:
    out = []
    for batch in mixer.build_loader(recipe):
        out.append(batch)
        if n is not None and len(out) == n:
            break
    return out


@pytest.mark.parametrize("mask", [False, True])
def test_positions_restart_at_documents_and_rows_and_labels_follow(three_sources, mask):
    recipe = {**three_sources[0], "mask_document_boundaries": mask}
    starts_checked = 0
    for batch in batches(recipe, 40):
        ids, labels, pos, src = (
            batch[k] for k in ("input_ids", "labels", "position_ids", "source_ids")
        )
        assert (pos[:, 0] == 0).all(), "every row starts at position 0"
        for r in range(ids.shape[0]):
            for t in range(1, ids.shape[1]):
                if src[r, t] < 0:
                    continue
                if ids[r, t - 1] == EOS_ID:  # a new document starts after an EOS
                    assert pos[r, t] == 0
                    starts_checked += 1
                    if mask:
                        assert labels[r, t] == -100, "the next document must not be predicted"
                    else:
                        assert labels[r, t] == ids[r, t]
                else:
                    assert pos[r, t] == pos[r, t - 1] + 1
                    assert labels[r, t] == ids[r, t]
                    # tokens of one document share a word id (or end it with EOS)
                    assert ids[r, t] in (ids[r, t - 1], EOS_ID)
                    assert src[r, t] == src[r, t - 1], "EOS belongs to its document's source"
    assert starts_checked > 50


def test_padding_positions_and_labels(three_sources):
    recipe = {
        **three_sources[0],
        "sources": [{**s, "epochs": 1} for s in three_sources[0]["sources"]],
    }
    pads = 0
    for batch in batches(recipe):
        pad = batch["source_ids"] == -1
        pads += int(pad.sum())
        assert (batch["labels"][pad] == -100).all()
        assert (batch["position_ids"][pad] == 0).all()
        assert not (batch["labels"][~pad] == -100).any()
    assert pads > 0


def test_pad_packing_puts_one_document_per_row_and_never_truncates(tmp_path, tokenizer_path):
    docs = corpus(0, 50, min_len=1, max_len=45)  # some longer than seq_len 16
    write_docs(tmp_path / "d.jsonl", docs, "jsonl")
    recipe = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 16,
        "batch_size": 2,
        "lanes": 2,
        "packing": "pad",
        "sources": [{"name": "d", "path": str(tmp_path / "d.jsonl"), "weight": 1, "epochs": 1}],
    }
    got = batches(recipe)
    assert token_counts(got) == expected_counts(docs)
    for batch in got:
        for ids, src in zip(batch["input_ids"], batch["source_ids"]):
            words = set(ids[src >= 0].tolist()) - {EOS_ID}
            assert len(words) <= 1, "one document per row"
            if (ids[src >= 0] == EOS_ID).any():
                assert ids[src >= 0][-1] == EOS_ID, "EOS ends the row's document"


def test_long_documents_continue_on_the_next_rows(tmp_path, tokenizer_path):
    docs = [(0, 100), (1, 3)]
    write_docs(tmp_path / "d.jsonl", docs, "jsonl")
    recipe = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 16,
        "batch_size": 1,
        "lanes": 1,
        "sources": [{"name": "d", "path": str(tmp_path / "d.jsonl"), "weight": 1, "epochs": 1}],
    }
    rows = torch.cat([b["input_ids"] for b in batches(recipe)])
    flat = rows.flatten().tolist()
    first = FIRST_WORD_ID
    assert flat.count(first) == 100 and flat.count(first + 1) == 3 and flat.count(EOS_ID) == 2


def test_bos_is_prepended_when_the_tokenizer_config_asks(tmp_path, tokenizer_path):
    import json
    import shutil

    folder = tmp_path / "hf"
    folder.mkdir()
    shutil.copy(tokenizer_path, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": "<|endoftext|>",
                "bos_token": "w29999",
                "add_bos_token": True,
                "pad_token": "<pad>",
            }
        )
    )
    write_docs(tmp_path / "d.jsonl", [(0, 3)], "jsonl")
    recipe = {
        "tokenizer": str(folder),
        "seq_len": 8,
        "batch_size": 1,
        "lanes": 1,
        "sources": [{"name": "d", "path": str(tmp_path / "d.jsonl"), "weight": 1, "epochs": 1}],
    }
    row = batches(recipe)[0]["input_ids"][0].tolist()
    bos = 29999 + FIRST_WORD_ID
    assert row[:5] == [bos, FIRST_WORD_ID, FIRST_WORD_ID, FIRST_WORD_ID, EOS_ID]


def test_bos_follows_the_tokenizer_template_when_the_config_is_silent(tmp_path):
    from helpers import make_tokenizer
    from tokenizers import Tokenizer, processors

    path = make_tokenizer(tmp_path / "tok.json")
    tok = Tokenizer.from_file(str(path))
    tok.post_processor = processors.TemplateProcessing(
        single="w29999 $A", special_tokens=[("w29999", 30001)]
    )
    tok.save(str(path))
    write_docs(tmp_path / "d.jsonl", [(0, 2)], "jsonl")
    recipe = {
        "tokenizer": str(path),
        "seq_len": 8,
        "batch_size": 1,
        "lanes": 1,
        "sources": [{"name": "d", "path": str(tmp_path / "d.jsonl"), "weight": 1, "epochs": 1}],
    }
    row = batches(recipe)[0]["input_ids"][0].tolist()
    assert row[:4] == [30001, FIRST_WORD_ID, FIRST_WORD_ID, EOS_ID]


class _RowByRow(BatchLayout):
    """The text layout through its per-row protocol (what image layouts use)."""

    def put_row(self, arrays, index, row, source_id):
        super().put_row(arrays, index, row, source_id)


def test_a_batch_written_at_once_equals_the_rows_written_one_by_one_and_the_oracle():
    rng = np.random.default_rng(7)
    seq_len, pad_id = 16, 3
    dtypes = (np.uint16, np.int32, np.uint32, np.int64)
    for case in range(60):
        rows, sources = [], []
        for _ in range(4):
            if rng.random() < 0.2:
                rows.append(None)
                sources.append(-1)
                continue
            pieces, at = [], 0
            while at < seq_len and (at == 0 or rng.random() < 0.8 or case % 2):
                doc = Document(
                    rng.integers(0, 30000, rng.integers(1, 40)).astype(
                        dtypes[rng.integers(len(dtypes))]
                    )
                )
                offset = int(rng.integers(len(doc)))
                length = min(seq_len - at, len(doc) - offset)
                pieces.append((doc, offset, length, bool(rng.random() < 0.5)))
                at += length
            rows.append(build_row(pieces, seq_len, pad_id))
            sources.append(int(rng.integers(3)))
        at_once = BatchLayout(seq_len=seq_len, pad_id=pad_id).assemble(rows, sources, False)
        one_by_one = _RowByRow(seq_len=seq_len, pad_id=pad_id).assemble(rows, sources, False)
        for key in ("input_ids", "labels", "position_ids", "source_ids"):
            assert at_once[key].dtype == np.int64
            assert at_once[key].tolist() == one_by_one[key].tolist(), key
        for r, (row, source) in enumerate(zip(rows, sources)):  # the oracle, in lists
            ids, labels, positions = [], [], []
            for doc, offset, length, mask_first in (
                [] if row is None else [p[1:] for p in row.pieces]
            ):
                piece = [int(t) for t in doc.tokens[offset : offset + length]]
                ids += piece
                labels += [-100 if mask_first else piece[0]] + piece[1:]
                positions += list(range(length))
            pad = seq_len - len(ids)
            assert at_once["input_ids"][r].tolist() == ids + [pad_id] * pad
            assert at_once["labels"][r].tolist() == labels + [-100] * pad
            assert at_once["position_ids"][r].tolist() == positions + [0] * pad
            assert at_once["source_ids"][r].tolist() == [source] * len(ids) + [-1] * pad
