"""Shared helpers for the benchmarks: a larger corpus built from the bundled sample data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import zstandard

from mixer.tools.bench import peak_rss_mb  # noqa: F401  (re-exported)
from mixer.tools.tables import format_table  # noqa: F401  (re-exported)

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "sample"
TOKENIZER = ROOT / "data" / "tokenizer.json"


def sample_texts() -> dict[str, list[str]]:
    """The sample corpus' documents per source (prose, code, changelog)."""
    prose = []
    for path in sorted((SAMPLE / "prose").glob("*.jsonl.zst")):
        data = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
        prose += [json.loads(line)["text"] for line in data.decode().splitlines()]
    code = []
    for path in sorted((SAMPLE / "code").glob("*.parquet")):
        code += pq.read_table(path, columns=["content"]).column(0).to_pylist()
    changelog = [
        json.loads(line)["text"]
        for line in (SAMPLE / "changelog" / "changelog.jsonl").read_text().splitlines()
    ]
    return {"prose": prose, "code": code, "changelog": changelog}


def write_corpus(folder: Path, copies: int, files_per_source: int = 4) -> dict[str, list[str]]:
    """`copies` copies of each sample source as plain jsonl files; returns the documents."""
    out = {}
    for name, texts in sample_texts().items():
        docs = [f"{t}\n[copy {c}]" for c in range(copies) for t in texts]
        (folder / name).mkdir(parents=True, exist_ok=True)
        for part in range(files_per_source):
            with open(folder / name / f"{part:03d}.jsonl", "w") as f:
                for doc in docs[part::files_per_source]:
                    f.write(json.dumps({"text": doc}) + "\n")
        out[name] = docs
    return out


def recipe_for(folder: Path, **overrides) -> dict:
    recipe = {
        "seed": 1,
        "tokenizer": str(TOKENIZER),
        "seq_len": 2048,
        "batch_size": 8,
        "lanes": 8,
        "shuffle_window": 1024,
        "split_bytes": 1 << 20,
        "sources": [
            {"name": "prose", "path": str(folder / "prose" / "*.jsonl"), "weight": 0.5},
            {"name": "code", "path": str(folder / "code" / "*.jsonl"), "weight": 0.3},
            {"name": "changelog", "path": str(folder / "changelog" / "*.jsonl"), "weight": 0.2},
        ],
    }
    recipe.update(overrides)
    return recipe


def table(rows: list[dict], columns: list[str]) -> str:
    return format_table(rows, [(c, c) for c in columns])


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))
