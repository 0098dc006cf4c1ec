"""A bad value costs its own record only, in every format whose containers hold many records
(parquet row groups, webdataset tars, compressed jsonl files and frames), and metrics measure
progress inside splits whose size in records is unknown.

The fuzzer damages the values of random documents (bytes that are not UTF-8, a surrogate
encoded as bytes as some exporters write, a non-string value) and checks, with
`on_error: skip`, that every other document is delivered exactly once and each damaged one is
counted under `bad_text`.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from helpers import corpus, doc_text, expected_counts, make_tokenizer, token_counts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixer
from mixer.tools.cli import main as cli_main

EXAMPLES = int(os.environ.get("MIXER_FUZZ_EXAMPLES", "15"))
BAD_BYTES = [b"\xed\xa0\x80", b"\xff", b"\xc3", b"\xe2\x82", b"\xf4\x90\x80\x80", b"\xc0\xaf"]
FORMATS = [
    "jsonl",
    "jsonl.gz",
    "jsonl.zst",
    "jsonl.zst-frames",
    "parquet",
    "parquet-binary",
    "webdataset",
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def _values(docs, bad: dict[int, bytes]) -> list[bytes]:
    """Each document's text as UTF-8 bytes, with `bad[i]` spliced into document i."""
    out = []
    for i, (d, n) in enumerate(docs):
        text = doc_text(d, n).encode()
        if i in bad:
            cut = len(text) // 2
            text = text[:cut] + bad[i] + text[cut:]
        out.append(text)
    return out


def _jsonl(values: list[bytes]) -> bytes:
    # json.dumps cannot write invalid UTF-8: write the string literal by hand
    return b"".join(b'{"id": %d, "text": "%s"}\n' % (i, v) for i, v in enumerate(values))


def _write(folder: Path, fmt: str, values: list[bytes]) -> Path:
    if fmt.startswith("jsonl"):
        plain = _jsonl(values)
        if fmt == "jsonl":
            data, suffix = plain, "jsonl"
        elif fmt == "jsonl.gz":
            data, suffix = gzip.compress(plain), "jsonl.gz"
        elif fmt == "jsonl.zst":
            data, suffix = zstandard.ZstdCompressor().compress(plain), "jsonl.zst"
        else:  # several frames, split into groups by `mixer index`
            cctx = zstandard.ZstdCompressor(write_content_size=True)
            data = b"".join(cctx.compress(plain[i : i + 200]) for i in range(0, len(plain), 200))
            suffix = "jsonl.zst"
        path = folder / f"x.{suffix}"
        path.write_bytes(data)
    elif fmt.startswith("parquet"):
        column = pa.array(values, pa.binary())
        if fmt == "parquet":  # a string column whose bytes were never checked
            column = column.view(pa.string())
        path = folder / "x.parquet"
        pq.write_table(pa.table({"text": column}), path, row_group_size=8)
    else:
        path = folder / "x.tar"
        with tarfile.open(path, "w") as tar:
            for i, value in enumerate(values):
                info = tarfile.TarInfo(f"s{i:04d}.txt")
                info.size = len(value)
                tar.addfile(info, io.BytesIO(value))
    return path


def _recipe(path: Path, tokenizer: Path, folder: Path, fmt: str, on_error: str) -> dict:
    recipe = {
        "tokenizer": str(tokenizer),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 2,
        "split_bytes": 256,
        "shuffle_window": 4,
        "sources": [
            {"name": "v", "path": str(path), "weight": 1, "epochs": 1, "on_error": on_error}
        ],
    }
    if fmt == "webdataset":
        recipe["sources"][0]["text_field"] = "txt"
    if fmt == "jsonl.zst-frames":
        recipe["manifest"] = str(folder / "m.json")
        (folder / "r.json").write_text(json.dumps(recipe))
        assert cli_main(["index", str(folder / "r.json")]) in (0, None)
    return recipe


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_bad_value_costs_its_own_record_only(tokenizer, fmt, data):
    docs = corpus(0, 24, max_len=10)
    bad = data.draw(
        st.dictionaries(st.integers(0, len(docs) - 1), st.sampled_from(BAD_BYTES), max_size=4),
        label="bad",
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = _write(folder, fmt, _values(docs, bad))
        loader = mixer.build_loader(_recipe(path, tokenizer, folder, fmt, "skip"))
        batches = list(loader)
        good = [doc for i, doc in enumerate(docs) if i not in bad]
        assert token_counts(batches) == expected_counts(good)
        metrics = loader.metrics()
        assert metrics["skipped"]["v"] == len(bad)
        assert metrics["skipped_by_reason"]["v"] == ({"bad_text": len(bad)} if bad else {})


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_bad_value_is_an_error_naming_its_record(tmp_path, tokenizer, fmt):
    docs = corpus(0, 20, max_len=6)
    path = _write(tmp_path, fmt, _values(docs, {13: b"\xed\xa0\x80"}))
    with pytest.raises(mixer.DataError) as err:
        list(mixer.build_loader(_recipe(path, tokenizer, tmp_path, fmt, "raise")))
    assert (err.value.source, err.value.file, err.value.reason) == ("v", str(path), "bad_text")
    assert "UTF-8" in str(err.value)
    if fmt.startswith("parquet"):
        assert err.value.location == "row group 1, row 5"  # (8 rows a group)
    elif fmt == "webdataset":
        assert "sample s0013" in err.value.location
    else:
        assert "offset" in err.value.location


def test_parquet_value_longer_than_the_limit_is_its_own_skip(tmp_path, tokenizer):
    docs = corpus(0, 16, max_len=6)
    texts = [doc_text(d, n) for d, n in docs]
    texts[5] = doc_text(5, 4000)  # 20 KB
    pq.write_table(pa.table({"text": texts}), tmp_path / "x.parquet", row_group_size=16)
    recipe = {
        "tokenizer": str(tokenizer),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 1,
        "max_document_bytes": 1000,
        "sources": [
            {
                "name": "v",
                "path": str(tmp_path / "x.parquet"),
                "weight": 1,
                "epochs": 1,
                "on_error": "skip",
            }
        ],
    }
    loader = mixer.build_loader(recipe)
    batches = list(loader)
    assert token_counts(batches) == expected_counts(docs[:5] + docs[6:])
    assert loader.metrics()["skipped_by_reason"]["v"] == {"too_long": 1}


# -- progress inside splits of unknown size -------------------------------------------------------


def _lines(first: int, count: int) -> bytes:
    return "".join(
        json.dumps({"text": doc_text(d, 30)}) + "\n" for d in range(first, first + count)
    ).encode()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl.gz", "jsonl.zst", "jsonl.zst-frames", "cached-gz"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_epochs_grow_inside_whole_compressed_files(tmp_path, tokenizer, fmt, num_workers):
    """A source that delivered documents never reports 0 epochs, and the figure only grows."""
    data = [_lines(i * 3000, 3000) for i in range(2)]
    for i, plain in enumerate(data):
        if fmt in ("jsonl.gz", "cached-gz"):
            (tmp_path / f"f{i}.jsonl.gz").write_bytes(gzip.compress(plain, compresslevel=1))
        elif fmt == "jsonl.zst":
            (tmp_path / f"f{i}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(plain))
        else:
            cctx = zstandard.ZstdCompressor(write_content_size=True)
            frames = b"".join(
                cctx.compress(plain[j : j + 40_000]) for j in range(0, len(plain), 40_000)
            )
            (tmp_path / f"f{i}.jsonl.zst").write_bytes(frames)
    recipe = {
        "tokenizer": str(tokenizer),
        "seq_len": 64,
        "batch_size": 2,
        "lanes": 2,
        "shuffle_window": 64,
        "split_bytes": 80_000,
        "sources": [{"name": "c", "path": str(tmp_path / "*.jsonl.*"), "weight": 1}],
    }
    if fmt == "jsonl.zst-frames":
        recipe["manifest"] = str(tmp_path / "m.json")
        (tmp_path / "r.json").write_text(json.dumps(recipe))
        assert cli_main(["index", str(tmp_path / "r.json")]) in (0, None)
    if fmt == "cached-gz":  # a warm token cache replays the files instead of reading them
        recipe["token_cache"] = str(tmp_path / "cache")
        for _ in zip(range(2000), mixer.build_loader(recipe)):
            pass
        recipe["token_cache"] = str(tmp_path / "cache")
    loader = mixer.build_loader(recipe, num_workers=num_workers)
    seen = []
    for step, _ in zip(range(1200), loader):
        if step % 100 == 0 or step < 3:
            seen.append(loader.metrics()["epochs"]["c"])
    loader.close()
    assert all(value > 0 for value in seen), seen
    assert seen == sorted(seen), seen
    assert 0.1 < seen[-1] < 1.0, seen  # ~1200 of ~2 × 6000 sequences per pass


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(
        st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()),
        max_size=60,
    ),
    piece=st.integers(1, 8),
)
def test_a_text_is_refused_exactly_when_it_holds_a_surrogate_and_the_first_is_named(text, piece):
    """The reader boundary's check, in pieces of any size: refused iff not encodable as UTF-8,
    naming the first surrogate's character index."""
    from mixer.sources import boundary

    first = next((i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF), None)
    why = boundary._invalid_text(text, piece)
    if first is None:
        assert why is None
    else:
        assert why is not None and f"at character {first};" in why
