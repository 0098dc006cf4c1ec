"""Throughput of mixer vs the tokenizer alone on the same documents (the upper bound).

    python benchmarks/throughput.py [--copies 40] [--batches 0]

Each measurement runs in a fresh subprocess so peak RSS is its own. The tokenizer-alone row
encodes every document of the corpus with `encode_batch_fast` in chunks of 64 (as mixer does)
using the tokenizer's default thread pool; mixer rows read, shuffle, tokenize, mix and pack the
same corpus (epochs: 1) into 8 × 2048 batches.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import TOKENIZER, cpu_count, peak_rss_mb, recipe_for, table, write_corpus  # noqa: E402


def tokenizer_alone(folder: str) -> dict:
    from tokenizers import Tokenizer

    texts = []
    for path in sorted(Path(folder).glob("*/*.jsonl")):
        texts += [json.loads(line)["text"] for line in path.read_text().splitlines()]
    tok = Tokenizer.from_file(str(TOKENIZER))
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 64):
        for enc in tok.encode_batch_fast(texts[i : i + 64], add_special_tokens=False):
            tokens += len(enc.ids) + 1  # + EOS, as mixer appends one
    elapsed = time.perf_counter() - start
    return {"tokens": tokens, "seconds": elapsed, "first_batch_s": None, "rss_mb": peak_rss_mb()}


def mixer_run(folder: str, workers: int) -> dict:
    import mixer

    recipe = recipe_for(Path(folder))
    recipe["sources"] = [{**s, "epochs": 1} for s in recipe["sources"]]
    start = time.perf_counter()
    first = None
    tokens = 0
    with mixer.build_loader(recipe, num_workers=workers) as loader:
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            tokens += int((batch["source_ids"] >= 0).sum())
    elapsed = time.perf_counter() - start
    return {"tokens": tokens, "seconds": elapsed, "first_batch_s": first, "rss_mb": peak_rss_mb()}


def _child(kind: str, folder: str, workers: int) -> dict:
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import json, "
        f"throughput as t; print(json.dumps(t.{kind}({folder!r}"
        + (f", {workers}" if kind == "mixer_run" else "")
        + ")))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=40, help="copies of the sample corpus")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_corpus(Path(tmp), args.copies)
        size = sum(p.stat().st_size for p in Path(tmp).glob("*/*.jsonl"))
        rows = []
        base = _child("tokenizer_alone", tmp, 0)
        rows.append({"run": "tokenizer alone", **base})
        for workers in (0, 2):
            rows.append(
                {"run": f"mixer num_workers={workers}", **_child("mixer_run", tmp, workers)}
            )
    for row in rows:
        row["tokens_per_s"] = row["tokens"] / row["seconds"]
        row["vs_tokenizer"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    print(
        f"corpus: {size / 1e6:.1f} MB of jsonl, {rows[0]['tokens']:,} tokens; {cpu_count()} CPU(s)"
    )
    print(
        table(
            rows,
            ["run", "tokens", "seconds", "tokens_per_s", "vs_tokenizer", "first_batch_s", "rss_mb"],
        )
    )


if __name__ == "__main__":
    main()
