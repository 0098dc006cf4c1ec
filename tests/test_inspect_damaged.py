"""`mixer inspect` and `mixer plan` read a source through the same error boundary as
training: a damaged file (gzip, zstd, parquet, tar), met by the sample or by the
compression-ratio probe, ends the command with one `error:` line naming the file and the
offset (exit 2); under `on_error: skip` it is counted and named in a warning (exit 0)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml
from helpers import corpus, make_tokenizer, write_docs

from mixer.tools.cli import main


def _tar(path: Path, count: int) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(count):
            data = f"w{i} w{i}".encode()
            info = tarfile.TarInfo(f"s{i:04d}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())


def _damage(path: Path, kind: str) -> None:
    data = bytearray(path.read_bytes())
    if kind == "jsonl.gz":  # late in the file: the sample reads its head, the probe the rest
        at = len(data) * 9 // 10
        data[at : at + 2] = bytes(b ^ 0xFF for b in data[at : at + 2])
    elif kind == "jsonl.zst":  # the first block
        data[20:60] = bytes(b ^ 0x55 for b in data[20:60])
    elif kind == "parquet":  # the first page header
        data[200:240] = bytes(b ^ 0x55 for b in data[200:240])
    else:  # tar: the third member's header
        data[1024:1124] = b"\xff" * 100
    path.write_bytes(bytes(data))


# (format, where the error says the damage is)
CASES = [
    ("jsonl.gz", "stored byte offset"),
    ("jsonl.zst", "decompressed byte offset 0"),
    ("parquet", "row group 0, row 0"),
    ("tar", "tar header at byte offset 1024"),
]


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("damaged")
    tokenizer = make_tokenizer(root / "tokenizer.json")
    docs = corpus(0, 20000, max_len=30)
    write_docs(root / "ok.jsonl", docs[:50], "jsonl")
    files = {}
    for kind, _ in CASES:
        path = root / f"bad.{kind}"
        if kind == "tar":
            _tar(path, 50)
        else:
            write_docs(path, docs, kind, row_group_size=16)
        _damage(path, kind)
        files[kind] = path
    files["tokenizer"] = tokenizer
    return files


def _recipe(tmp_path: Path, damaged: dict[str, Path], kind: str, on_error: str) -> str:
    recipe = {
        "seed": 1,
        "tokenizer": str(damaged["tokenizer"]),
        "seq_len": 16,
        "batch_size": 2,
        "lanes": 2,
        "sources": [
            {"name": "bad", "path": str(damaged[kind]), "weight": 0.5, "on_error": on_error},
            {"name": "ok", "path": str(damaged["tokenizer"].with_name("ok.jsonl")), "weight": 0.5},
        ],
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["inspect", "plan"])
@pytest.mark.parametrize("kind, where", CASES, ids=[k for k, _ in CASES])
def test_a_damaged_file_is_named_with_its_offset(tmp_path, damaged, capsys, kind, where, command):
    recipe = _recipe(tmp_path, damaged, kind, "raise")
    extra = ["--tokens", "1e6"] if command == "plan" else []
    assert main([command, recipe, *extra]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("error: source 'bad', "), err
    assert str(damaged[kind]) in err and where in err, err


@pytest.mark.parametrize("kind, where", CASES, ids=[k for k, _ in CASES])
def test_under_skip_a_damaged_file_is_counted(tmp_path, damaged, capsys, kind, where):
    recipe = _recipe(tmp_path, damaged, kind, "skip")
    assert main(["inspect", recipe, "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["sources"]}
    assert rows["bad"]["skipped_in_sample"] >= 1
    assert where in rows["bad"]["first_skipped"]
    assert rows["ok"]["skipped_in_sample"] == 0
    assert main(["plan", recipe, "--tokens", "1e6"]) == 0
    out = capsys.readouterr().out
    assert f"warning: source 'bad': {rows['bad']['skipped_in_sample']} bad input" in out
