"""A text field that no record has is refused by `validate`, `inspect` and `plan` (exit 2, one
`error:` line naming the field and the columns or keys the records have), whatever
`on_error` says; a record without it among records that have it is bad input like any other."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from helpers import make_tokenizer

from mixer.tools.cli import main


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fields")
    make_tokenizer(root / "tokenizer.json")
    body = [f"w{i} w{i}" for i in range(40)]
    pq.write_table(pa.table({"body": body, "n": list(range(40))}), root / "a.parquet")
    lines = [json.dumps({"body": t, "n": i}) for i, t in enumerate(body)]
    (root / "b.jsonl").write_text("\n".join(lines) + "\n")
    some = [json.dumps({"content": t}) for t in body]
    some[3] = json.dumps({"body": "w1"})
    (root / "c.jsonl").write_text("\n".join(some) + "\n")
    return root


def _recipe(tmp_path: Path, data: Path, file: str, on_error: str) -> str:
    recipe = {
        "seed": 1,
        "tokenizer": str(data / "tokenizer.json"),
        "seq_len": 16,
        "batch_size": 2,
        "lanes": 2,
        "sources": [
            {
                "name": "s",
                "path": str(data / file),
                "weight": 1.0,
                "text_field": "content",
                "on_error": on_error,
            }
        ],
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize(
    "file, present", [("a.parquet", "columns: body, n"), ("b.jsonl", "keys: body, n")]
)
@pytest.mark.parametrize("command", ["validate", "inspect", "plan"])
def test_a_text_field_no_record_has_is_refused(
    tmp_path, data, capsys, command, file, present, on_error
):
    recipe = _recipe(tmp_path, data, file, on_error)
    extra = ["--tokens", "1e6"] if command == "plan" else []
    assert main([command, recipe, *extra]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("error: source 's', ") and str(data / file) in err, err
    assert "sources[0].text_field" in err and "'content'" in err and f"({present})" in err, err


def test_one_record_without_it_is_skipped_and_counted(tmp_path, data, capsys):
    assert main(["inspect", _recipe(tmp_path, data, "c.jsonl", "skip"), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["sources"]
    assert row["skipped_in_sample"] == 1 and row["est_documents"] > 30
    assert "missing text field 'content' (keys: body)" in row["first_skipped"]
    assert main(["validate", _recipe(tmp_path, data, "c.jsonl", "skip")]) == 0
