"""Every reader failure is a DataError naming source, file and offset, or a counted skip."""

from __future__ import annotations

import gzip
import json
import os
import shutil

import pytest
import zstandard
from helpers import corpus, doc_text, expected_counts, token_counts, write_docs

import mixer
from mixer.runtime.state import unpack
from mixer.tools.cli import main as cli_main


def recipe_for(path, tokenizer_path, *, on_error="raise", epochs=1, lanes=2, **extra) -> dict:
    return {
        "tokenizer": str(tokenizer_path),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": lanes,
        "sources": [
            {"name": "bad", "path": str(path), "weight": 1, "epochs": epochs, "on_error": on_error}
        ],
        **extra,
    }


def lines(docs) -> str:
    return "".join(json.dumps({"text": doc_text(d, n)}) + "\n" for d, n in docs)


def compress(data: bytes, codec: str) -> bytes:
    if codec == "gz":
        return gzip.compress(data)
    if codec == "zst":
        return zstandard.ZstdCompressor().compress(data)
    return data


SUFFIX = {"": "jsonl", "gz": "jsonl.gz", "zst": "jsonl.zst"}
SURROGATE = '{"text": "w1 \\ud800 w1"}\n'
DEEP = '{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n"


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["", "gz", "zst"])
@pytest.mark.parametrize(
    "bad_line,why", [(SURROGATE, "not valid Unicode"), (DEEP, "nested too deeply")]
)
def test_bad_record_is_a_data_error_or_a_counted_skip(
    tmp_path, tokenizer_path, codec, bad_line, why
):
    good = lines(corpus(0, 4))
    path = tmp_path / f"x.{SUFFIX[codec]}"
    path.write_bytes(compress((good + bad_line + lines(corpus(4, 3))).encode(), codec))
    with pytest.raises(mixer.DataError, match=why) as err:
        list(mixer.build_loader(recipe_for(path, tokenizer_path)))
    assert err.value.source == "bad" and err.value.file == str(path)
    assert str(len(good.encode())) in err.value.location
    loader = mixer.build_loader(recipe_for(path, tokenizer_path, on_error="skip"))
    assert token_counts(loader) == expected_counts(corpus(0, 7))
    assert loader.metrics()["skipped"]["bad"] == 1


def test_text_file_with_bad_utf8_names_the_byte_offset(tmp_path, tokenizer_path):
    path = tmp_path / "x.txt"
    path.write_bytes(b"w1 w1 \xff\xfe w1")
    with pytest.raises(mixer.DataError, match=r"not valid UTF-8") as err:
        list(mixer.build_loader(recipe_for(path, tokenizer_path)))
    assert err.value.location == "byte offset 6"


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "jsonl.zst", "parquet", "text"])
@pytest.mark.parametrize("how", ["deleted", "directory"])
@pytest.mark.parametrize("workers", [0, 2])
def test_file_gone_after_listing_is_a_data_error_or_a_counted_skip(
    tmp_path, tokenizer_path, fmt, how, workers
):
    data = tmp_path / "data"
    write_docs(data / f"a.{fmt}", [(0, 5)] if fmt == "text" else corpus(0, 6), fmt)
    gone = write_docs(data / f"b.{fmt}", [(9, 5)] if fmt == "text" else corpus(9, 6), fmt)
    for on_error in ("raise", "skip"):
        loader = mixer.build_loader(
            recipe_for(data / f"*.{fmt}", tokenizer_path, on_error=on_error), num_workers=workers
        )
        gone.unlink()
        if how == "directory":
            gone.mkdir()  # unreadable as a file, even for root
        if on_error == "raise":
            with pytest.raises(mixer.DataError) as err:
                list(loader)
            assert (err.value.source, err.value.file) == ("bad", str(gone))
            assert err.value.location is not None
        else:
            got = list(loader)
            assert token_counts(got) == expected_counts([(0, 5)] if fmt == "text" else corpus(0, 6))
            assert loader.metrics()["skipped"]["bad"] >= 1
        if how == "directory":
            gone.rmdir()
        write_docs(gone, [(9, 5)] if fmt == "text" else corpus(9, 6), fmt)


def test_worker_errors_keep_source_file_and_location(tmp_path, tokenizer_path):
    path = tmp_path / "x.jsonl"
    good = lines(corpus(0, 5))
    path.write_text(good + "{broken\n")
    with pytest.raises(mixer.DataError) as err:
        list(mixer.build_loader(recipe_for(path, tokenizer_path), num_workers=2))
    assert err.value.source == "bad"
    assert err.value.file == str(path)
    assert err.value.location == f"byte offset {len(good.encode())}"
    assert "Traceback" not in str(err.value)


def test_skips_in_lanes_that_never_yield_a_real_batch_are_counted(tmp_path, tokenizer_path):
    data = tmp_path / "data"
    docs = [(0, 3), (1, 2)]  # one batch from one lane; the other lanes only yield padding
    write_docs(data / "a.jsonl", docs, "jsonl")
    for i in range(3):
        (data / f"b{i}.jsonl").write_text("not json\n" * (i + 1) + '{"t": 1}\n' * 2)
    recipe = recipe_for(data / "*.jsonl", tokenizer_path, on_error="skip", lanes=4)
    for workers in (0, 2):
        loader = mixer.build_loader(recipe, num_workers=workers)
        got = list(loader)
        assert token_counts(got) == expected_counts(docs)
        assert len(got) < 4, "some lane's padding is never handed out (the case under test)"
        assert loader.metrics()["skipped"]["bad"] == 3 + 4 + 5
        state = unpack(loader.state_dict())
        assert sum(lane["sources"]["bad"]["skipped"] for lane in state["lanes"].values()) == 12


@pytest.mark.parametrize("content", ["gz-empty", "blank-lines", "all-bad-skipped"])
def test_source_without_any_document_in_an_unlimited_recipe_is_named(
    tmp_path, tokenizer_path, content
):
    good = write_docs(tmp_path / "good" / "g.jsonl", corpus(0, 50), "jsonl")
    empty = tmp_path / "empty"
    empty.mkdir()
    if content == "gz-empty":
        (empty / "e.jsonl.gz").write_bytes(gzip.compress(b""))
    elif content == "blank-lines":
        (empty / "e.jsonl").write_text("\n\n   \n" * 20)
    else:
        (empty / "e.jsonl").write_text("nope\n" * 20)
    recipe = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 2,
        "sources": [
            {"name": "good", "path": str(good), "weight": 1},
            {"name": "hollow", "path": str(empty / "*"), "weight": 1, "on_error": "skip"},
        ],
    }
    with pytest.raises(mixer.DataError, match="no document") as err:
        for _ in mixer.build_loader(recipe):
            pass
    assert err.value.source == "hollow"


def test_unlimited_recipe_that_runs_dry_on_a_rank_is_an_error_not_a_silent_end(
    tmp_path, tokenizer_path
):
    path = write_docs(tmp_path / "one.jsonl", [(0, 3)], "jsonl")  # one document, 4 lanes
    recipe = recipe_for(path, tokenizer_path, epochs=None, lanes=4)
    loader = mixer.build_loader(recipe, rank=1, world_size=2)  # lanes 1 and 3: never data
    with pytest.raises(mixer.DataError, match="ran out of documents"):
        for _ in loader:
            pass


@pytest.mark.parametrize("same_size", [True, False])
def test_file_rewritten_after_index_is_refused_not_read_with_old_splits(
    tmp_path, tokenizer_path, same_size
):
    data = tmp_path / "data"
    path = write_docs(data / "x.jsonl", corpus(0, 60), "jsonl")
    recipe = {
        **recipe_for(data / "*.jsonl", tokenizer_path),
        "split_bytes": 200,
        "manifest": str(tmp_path / "m.json"),
    }
    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(json.dumps(recipe))
    assert cli_main(["index", str(recipe_file)]) == 0
    assert token_counts(mixer.build_loader(recipe)) == expected_counts(corpus(0, 60))
    before = path.stat()
    new = lines(corpus(100, 60))
    if same_size:
        new = path.read_text().replace("w1 ", "w2 ")  # other words, same bytes
        assert len(new) == before.st_size
    path.write_text(new)
    os.utime(path, ns=(before.st_mtime_ns, before.st_mtime_ns + 10**9))
    with pytest.raises(mixer.DataError, match="changed since it was listed or indexed") as err:
        list(mixer.build_loader(recipe))
    assert err.value.file == str(path)


def test_resume_refuses_a_corpus_whose_files_changed_content(tmp_path, tokenizer_path):
    data = tmp_path / "data"
    path = write_docs(data / "x.jsonl", corpus(0, 60), "jsonl")
    recipe = recipe_for(data / "*.jsonl", tokenizer_path, epochs=None)
    loader = mixer.build_loader(recipe)
    next(iter(loader))
    state = loader.state_dict()
    loader.close()
    original = path.stat().st_mtime_ns
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)  # copies content and times (like cp -p)
    path.write_text(path.read_text().replace("w1 ", "w2 "))  # same size, new content
    with pytest.raises(mixer.StateError, match="content changed since the checkpoint"):
        mixer.build_loader(recipe).load_state_dict(state)
    assert (copy / "x.jsonl").stat().st_mtime_ns == original
    mixer.build_loader(recipe_for(copy / "*.jsonl", tokenizer_path, epochs=None)).load_state_dict(
        state
    )
