"""Resume cost does not grow with the step: at most one split prefix and one window re-read."""

from __future__ import annotations

import pytest
from helpers import corpus, write_docs

import mixer
from mixer.pipeline.lanes import Lane
from mixer.sources import list_source
from mixer.tokenize import Encoder, resolve_tokenizer


def _records_to_resume(recipe, tables, encoder, lane_index: int, steps: int) -> list[int]:
    """Records each source re-reads to resume a lane after `steps` batches (and to serve one)."""
    lane = Lane(lane_index, recipe, tables, encoder)
    for _ in range(steps):
        lane.next_batch(recipe.batch_size)
    resumed = Lane(lane_index, recipe, tables, encoder, lane.state_dict())
    resumed.next_batch(recipe.batch_size)
    return [p.stream.records_read for p in resumed.packers]


@pytest.mark.slow
def test_resume_work_is_bounded_and_independent_of_the_step(tmp_path, tokenizer_path):
    # 4 plain files of 2000 docs, cut into byte-range splits of ~20 KB (~250 docs each)
    docs = corpus(0, 8000, max_len=12)
    for part in range(4):
        write_docs(tmp_path / f"p{part}.jsonl", docs[part::4], "jsonl")
    # one large single-frame .zst: resuming inside it decompresses from its start
    write_docs(tmp_path / "big.jsonl.zst", corpus(10000, 3000, max_len=12), "jsonl.zst")
    recipe = mixer.load_recipe(
        {
            "tokenizer": str(tokenizer_path),
            "seq_len": 32,
            "batch_size": 4,
            "lanes": 2,
            "shuffle_window": 64,
            "split_bytes": 20000,
            "sources": [
                {"name": "plain", "path": str(tmp_path / "p*.jsonl"), "weight": 1},
                {"name": "zst", "path": str(tmp_path / "big.jsonl.zst"), "weight": 1},
            ],
        }
    )
    tables = [list_source(recipe, s) for s in recipe.sources]
    encoder = Encoder(resolve_tokenizer(str(tokenizer_path)))
    per_split = max(
        1
        + 2000 * s.end // max(f.size for f in tables[0].files)
        - 2000 * s.start // max(f.size for f in tables[0].files)
        for s in tables[0].splits
    )
    bound_plain = per_split + 2 * recipe.shuffle_window
    bound_zst = 3000 + 2 * recipe.shuffle_window  # the whole single-frame file, worst case
    for steps in (10, 1000):
        plain, zst = _records_to_resume(recipe, tables, encoder, 1, steps)
        assert plain <= bound_plain, steps
        assert zst <= bound_zst, steps
    # and never "replay N samples": 1000 steps consumed far more than the bound
    lane = Lane(1, recipe, tables, encoder)
    for _ in range(1000):
        lane.next_batch(recipe.batch_size)
    assert lane.packers[0].stream.records_read > 4 * bound_plain


def test_resume_inside_plain_jsonl_seeks_instead_of_rereading(tmp_path, tokenizer_path):
    write_docs(tmp_path / "one.jsonl", corpus(0, 5000, max_len=6), "jsonl")
    recipe = mixer.load_recipe(
        {
            "tokenizer": str(tokenizer_path),
            "seq_len": 16,
            "batch_size": 2,
            "lanes": 1,
            "shuffle_window": 32,
            "split_bytes": 10**9,  # a single split: only seeking helps
            "sources": [{"name": "one", "path": str(tmp_path / "one.jsonl"), "weight": 1}],
        }
    )
    tables = [list_source(recipe, s) for s in recipe.sources]
    encoder = Encoder(resolve_tokenizer(str(tokenizer_path)))
    # The window to resume in, the record after it, and the next window with the record after
    # that: a reader paused at a full window closes and re-reads the record it stopped at.
    assert _records_to_resume(recipe, tables, encoder, 0, 600)[0] <= 2 * recipe.shuffle_window + 2
