"""Storage layer: sorted listing, splits that partition files, every format read whole."""

from __future__ import annotations

import json

from helpers import corpus, doc_text, write_docs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixer
from mixer.sources import READERS, Storage, list_source


def _all_records(recipe, table, src):
    texts = []
    storage = Storage(src.name, {})
    for split in table.splits:
        entry = table.files[split.file]
        for record in READERS[entry.format](
            storage=storage,
            entry=entry,
            split=split,
            source=src.name,
            text_field=src.text_field,
            max_bytes=1 << 20,
            index=0,
            offset=0,
        ):
            assert record.error is None
            texts.append(record.text)
    return texts


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lengths=st.lists(st.integers(0, 60), min_size=1, max_size=80),
    split_bytes=st.integers(1, 400),
    blank_every=st.integers(0, 7),
)
def test_byte_range_splits_partition_the_lines(
    tmp_path_factory, tokenizer_path, lengths, split_bytes, blank_every
):
    folder = tmp_path_factory.mktemp("splits")
    docs = [(i, n) for i, n in enumerate(lengths)]
    lines = []
    for i, (d, n) in enumerate(docs):
        lines.append(json.dumps({"text": doc_text(d, n)}) + "\n")
        if blank_every and i % blank_every == 0:
            lines.append("\n")
    (folder / "x.jsonl").write_text("".join(lines))
    recipe = mixer.load_recipe(
        {
            "tokenizer": str(tokenizer_path),
            "seq_len": 4,
            "batch_size": 1,
            "split_bytes": split_bytes,
            "sources": [{"name": "s", "path": str(folder / "x.jsonl"), "weight": 1}],
        }
    )
    table = list_source(recipe, recipe.sources[0])
    assert _all_records(recipe, table, recipe.sources[0]) == [doc_text(d, n) for d, n in docs]


def test_every_format_is_read_in_full_and_listing_is_sorted(tmp_path, tokenizer_path):
    docs = corpus(0, 50)
    tmp_path = tmp_path / "mixed"
    write_docs(tmp_path / "b.jsonl.gz", docs[:10], "jsonl.gz")
    write_docs(tmp_path / "a.jsonl.zst", docs[10:20], "jsonl.zst")
    write_docs(tmp_path / "c.parquet", docs[20:40], "parquet", row_group_size=3)
    write_docs(tmp_path / "d.jsonl", docs[40:49], "jsonl")
    write_docs(tmp_path / "e.txt", docs[49:], "text")
    recipe = mixer.load_recipe(
        {
            "tokenizer": str(tokenizer_path),
            "seq_len": 4,
            "batch_size": 1,
            "sources": [{"name": "s", "path": str(tmp_path / "*"), "weight": 1}],
        }
    )
    src = recipe.sources[0]
    table = list_source(recipe, src)
    names = [f.key for f in table.files]
    assert names == ["a.jsonl.zst", "b.jsonl.gz", "c.parquet", "d.jsonl", "e.txt"]
    assert sum(1 for s in table.splits if table.files[s.file].format == "parquet") == 7
    texts = _all_records(recipe, table, src)
    assert sorted(texts) == sorted(doc_text(d, n) for d, n in docs)
