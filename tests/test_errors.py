"""Nothing silent: bad input raises naming source, file and offset, or is skipped and counted."""

from __future__ import annotations

import gzip
import json
import multiprocessing

import pytest
import zstandard
from helpers import corpus, doc_text, expected_counts, token_counts, write_docs

import mixer
from mixer.runtime.state import unpack


def recipe_for(tmp_path, tokenizer_path, path, *, on_error="raise", **source) -> dict:
    return {
        "tokenizer": str(tokenizer_path),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 2,
        "sources": [
            {
                "name": "bad",
                "path": str(path),
                "weight": 1,
                "epochs": 1,
                "on_error": on_error,
                **source,
            }
        ],
    }


def lines(docs) -> str:
    return "".join(json.dumps({"text": doc_text(d, n)}) + "\n" for d, n in docs)


def run(recipe) -> list[dict]:
    return list(mixer.build_loader(recipe))


def test_malformed_json_line_names_source_file_and_byte_offset(tmp_path, tokenizer_path):
    good = lines(corpus(0, 5))
    path = tmp_path / "x.jsonl"
    path.write_text(good + '{"text": "w1 w1"\n' + lines(corpus(5, 3)))
    with pytest.raises(mixer.DataError) as err:
        run(recipe_for(tmp_path, tokenizer_path, path))
    message = str(err.value)
    assert "'bad'" in message and str(path) in message
    assert f"byte offset {len(good.encode())}" in message and "malformed JSON" in message


def test_missing_text_field_in_compressed_file_names_the_line(tmp_path, tokenizer_path):
    body = lines(corpus(0, 6)) + json.dumps({"body": "w1"}) + "\n"
    path = tmp_path / "x.jsonl.gz"
    path.write_bytes(gzip.compress(body.encode()))
    with pytest.raises(mixer.DataError, match=r"line 7 .*missing text field 'text'"):
        run(recipe_for(tmp_path, tokenizer_path, path))


@pytest.mark.parametrize("suffix", ["jsonl.gz", "jsonl.zst"])
def test_corrupt_compressed_file_is_an_error_naming_the_file(tmp_path, tokenizer_path, suffix):
    data = lines(corpus(0, 400, max_len=30)).encode()
    packed = (
        gzip.compress(data) if suffix == "jsonl.gz" else zstandard.ZstdCompressor().compress(data)
    )
    path = tmp_path / f"x.{suffix}"
    path.write_bytes(packed[: len(packed) // 2] + b"\x00garbage" * 50)
    with pytest.raises(mixer.DataError) as err:
        run(recipe_for(tmp_path, tokenizer_path, path))
    assert str(path) in str(err.value) and "corrupt" in str(err.value)


def test_empty_shard_and_unmatched_path_are_errors(tmp_path, tokenizer_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(mixer.DataError, match=r"empty.jsonl.*empty shard"):
        run(recipe_for(tmp_path, tokenizer_path, tmp_path / "empty.jsonl"))
    with pytest.raises(mixer.DataError, match=r"'bad'.*nothing-\*\.jsonl.*matches no files"):
        run(recipe_for(tmp_path, tokenizer_path, tmp_path / "nothing-*.jsonl"))


def test_skip_policy_skips_and_counts_in_metrics_and_state(tmp_path, tokenizer_path):
    docs = corpus(0, 30)
    path = tmp_path / "data" / "x.jsonl"
    path.parent.mkdir()
    path.write_text(
        lines(docs[:10]) + "not json\n" + lines(docs[10:20]) + '{"t": 1}\n' + lines(docs[20:])
    )
    (tmp_path / "data" / "y.jsonl").write_text("")
    recipe = recipe_for(tmp_path, tokenizer_path, tmp_path / "data" / "*.jsonl", on_error="skip")
    loader = mixer.build_loader(recipe)
    got = list(loader)
    assert token_counts(got) == expected_counts(docs)
    metrics = loader.metrics()
    assert metrics["skipped"]["bad"] == 3  # two bad records and one empty shard
    state = unpack(loader.state_dict())
    lanes = state["lanes"].values()
    assert sum(lane["sources"]["bad"]["skipped"] for lane in lanes) == 2
    assert state["listing_skipped"]["bad"] == 1


def test_overlong_record_is_an_error_or_skipped(tmp_path, tokenizer_path):
    path = tmp_path / "x.jsonl"
    path.write_text(lines([(0, 3)]) + lines([(1, 5000)]) + lines([(2, 4)]))
    with pytest.raises(mixer.DataError, match="max_document_bytes"):
        run({**recipe_for(tmp_path, tokenizer_path, path), "max_document_bytes": 1000})
    got = run(
        {**recipe_for(tmp_path, tokenizer_path, path, on_error="skip"), "max_document_bytes": 1000}
    )
    assert token_counts(got) == expected_counts([(0, 3), (2, 4)])


def test_parquet_without_the_text_column_is_an_error(tmp_path, tokenizer_path):
    path = write_docs(tmp_path / "x.parquet", corpus(0, 5), "parquet", field="body")
    with pytest.raises(mixer.DataError, match=r"x.parquet.*row group 0.*missing text field"):
        run(recipe_for(tmp_path, tokenizer_path, path))


def test_errors_in_worker_processes_keep_their_type_and_message(tmp_path, tokenizer_path):
    path = tmp_path / "x.jsonl"
    path.write_text(lines(corpus(0, 5)) + "{broken\n")
    with pytest.raises(mixer.DataError) as err:
        list(mixer.build_loader(recipe_for(tmp_path, tokenizer_path, path), num_workers=2))
    assert str(path) in str(err.value) and "malformed JSON" in str(err.value)
    assert not multiprocessing.active_children(), "workers stop with the error"


def test_unknown_storage_protocol_names_the_source(tmp_path, tokenizer_path):
    recipe = recipe_for(tmp_path, tokenizer_path, "nosuchproto://bucket/*.jsonl")
    with pytest.raises(mixer.DataError, match=r"source 'bad'.*nosuchproto.*filesystem"):
        mixer.build_loader(recipe)


def test_every_data_error_names_its_reason_where_it_is_raised():
    """A skip's reason comes from its raise site, never from words in its message."""
    import ast
    from pathlib import Path

    from mixer.core.errors import REASONS

    package = Path(mixer.__file__).parent
    sites = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "DataError":
                reason = next((k.value for k in node.keywords if k.arg == "reason"), None)
                sites.append((path.relative_to(package), node.lineno, reason))
    assert len(sites) > 40, "the scan found the raise sites"
    unnamed = [(str(p), line) for p, line, reason in sites if reason is None]
    assert not unnamed, f"DataError raised without reason=: {unnamed}"
    for path, line, reason in sites:
        if isinstance(reason, ast.Constant):
            assert reason.value in REASONS, (str(path), line, reason.value)


def test_a_data_error_keeps_message_and_reason_through_pickling():
    import pickle

    err = mixer.DataError(
        "bad bytes", source="s", file="f.jsonl", location="byte offset 3", reason="bad_text"
    )
    back = pickle.loads(pickle.dumps(err))
    assert (back.message, back.reason, back.source, back.file, back.location) == (
        "bad bytes",
        "bad_text",
        "s",
        "f.jsonl",
        "byte offset 3",
    )
    assert str(back) == str(err) == "source 's', file 'f.jsonl', byte offset 3: bad bytes"
    with pytest.raises(ValueError, match="unknown DataError reason"):
        mixer.DataError("x", reason="guessed")
