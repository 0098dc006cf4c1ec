"""Fuzzer for the reader boundary: mutated shards of every format and codec give batches, a
DataError naming source, file and offset, or (on_error: skip) counted skips; nothing else.

MIXER_FUZZ_EXAMPLES raises the number of examples per format (CI runs a modest number).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from helpers import apply_ops, corpus, doc_text, make_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixer

EXAMPLES = int(os.environ.get("MIXER_FUZZ_EXAMPLES", "15"))
NASTY = [
    b'"\\ud800"',
    b'"\\udfff\\ud800"',
    b"[" * 5000,
    b"{" * 3000,
    b"\x00",
    b"\xff\xfe",
    b'{"text": 5}',
    b'{"text": null}',
    b"[]",
    b"null",
    b"1e999",
    b'"\\u0000"',
    b"\n\n",
    b'{"text": "' + b"w1 " * 200 + b'"}',
    b"\xc3",
    b"\r\n",
    b'{"text": {"a": [1]}}',
]
FORMATS = ["jsonl", "jsonl.gz", "jsonl.zst", "jsonl.zst-frames", "parquet", "text"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def _plain(docs) -> bytes:
    return "".join(json.dumps({"text": doc_text(d, n)}) + "\n" for d, n in docs).encode()


ops = st.lists(
    st.tuples(
        st.sampled_from(["flip", "truncate", "insert"]),
        st.integers(0, 1 << 16),
        st.one_of(st.sampled_from(NASTY), st.binary(min_size=1, max_size=8)),
    ),
    min_size=1,
    max_size=4,
)


def _write(folder: Path, fmt: str, text_ops, byte_ops) -> Path:
    docs = corpus(0, 30, max_len=12)
    plain = apply_ops(_plain(docs), text_ops)  # parse-level damage
    if fmt == "jsonl":
        data = plain
    elif fmt == "jsonl.gz":
        data = gzip.compress(plain)
    elif fmt == "jsonl.zst":
        data = zstandard.ZstdCompressor().compress(plain)
    elif fmt == "jsonl.zst-frames":  # several frames that record their size
        cctx = zstandard.ZstdCompressor(write_content_size=True)
        data = b"".join(cctx.compress(plain[i : i + 300]) for i in range(0, len(plain), 300))
    elif fmt == "parquet":
        texts = [doc_text(d, n) for d, n in docs]
        path = folder / "x.parquet"
        pq.write_table(pa.table({"text": texts}), path, row_group_size=8)
        data = path.read_bytes()
    else:
        data = plain
    data = apply_ops(data, byte_ops)  # codec- and container-level damage
    suffix = {"jsonl.zst-frames": "jsonl.zst", "text": "txt"}.get(fmt, fmt)
    path = folder / f"x.{suffix}"
    path.write_bytes(data)
    return path


def _run(path: Path, tokenizer: Path, on_error: str, manifest: Path | None) -> None:
    recipe = {
        "tokenizer": str(tokenizer),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 2,
        "split_bytes": 256,
        "max_document_bytes": 4096,
        "sources": [
            {"name": "fz", "path": str(path), "weight": 1, "epochs": 1, "on_error": on_error}
        ],
    }
    if manifest is not None:
        recipe["manifest"] = str(manifest)
        (manifest.parent / "r.json").write_text(json.dumps(recipe))
        try:
            mixer.tools.cli.main(["index", str(manifest.parent / "r.json")])
        except mixer.DataError:
            pass
    try:
        for batch in mixer.build_loader(recipe):
            assert batch["input_ids"].shape == (2, 8)
    except mixer.DataError as err:
        assert err.source == "fz", err
        assert err.file is not None, err
        if on_error == "skip":  # only listing may still refuse: nothing left to read
            assert "no readable files" in str(err), err


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text_ops=ops, byte_ops=st.one_of(st.just([]), ops))
def test_mutated_shards_give_batches_or_named_data_errors(
    tokenizer, fmt, on_error, text_ops, byte_ops
):
    import mixer.tools.cli  # noqa: F401  (the index command, for zstd frames)

    with tempfile.TemporaryDirectory() as folder:
        path = _write(Path(folder), fmt, text_ops, byte_ops)
        manifest = Path(folder) / "m.json" if fmt == "jsonl.zst-frames" else None
        _run(path, tokenizer, on_error, manifest)


def test_data_errors_from_workers_name_the_place(tmp_path, tokenizer):
    path = _write(tmp_path, "jsonl.gz", [("insert", 300, b"\xff\xfe{")], [])
    recipe = {
        "tokenizer": str(tokenizer),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 2,
        "sources": [{"name": "fz", "path": str(path), "weight": 1, "epochs": 1}],
    }
    with pytest.raises(mixer.DataError) as err:
        list(mixer.build_loader(recipe, num_workers=2))
    assert (err.value.source, err.value.file) == ("fz", str(path))
    assert err.value.location.startswith("line ")
