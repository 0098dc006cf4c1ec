"""Token cache: throughput cold (tokenize and write the cache) vs warm (read tokens).

    python benchmarks/cache.py [--copies 20] [--workers 0]

Same corpus and recipe as throughput.py (3 sources × 4 jsonl files, 1 MB splits, 8 lanes,
8 × 2048 batches, epochs: 1) with `token_cache:` set. Rows: no cache, cold (first pass writes
the entries), warm (every split read from the cache), and `mixer cache` filling it ahead
(2 processes). Each row runs in a fresh process; tokens/s over wall time and over the process's
CPU time (workers' CPU is not counted: compare CPU figures at --workers 0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_count, peak_rss_mb, recipe_for, table, write_corpus  # noqa: E402


def loader_run(folder: str, cache: str | None, workers: int) -> dict:
    import mixer
    from mixer.cache.store import CACHE_STATS

    recipe = recipe_for(Path(folder))
    recipe["sources"] = [{**s, "epochs": 1} for s in recipe["sources"]]
    if cache:
        recipe["token_cache"] = cache
    start, cpu = time.perf_counter(), time.process_time()
    tokens = 0
    with mixer.build_loader(recipe, num_workers=workers) as loader:
        for batch in loader:
            tokens += int((batch["source_ids"] >= 0).sum())
    elapsed = time.perf_counter() - start
    return {
        "tokens": tokens,
        "seconds": elapsed,
        "cpu_s": time.process_time() - cpu,
        "rss_mb": peak_rss_mb(),
        "hits": CACHE_STATS.hits,
        "misses": CACHE_STATS.misses,
    }


def fill_run(folder: str, cache: str, workers: int) -> dict:
    from mixer.cache.fill import fill_cache
    from mixer.config.recipe import load_recipe
    from mixer.sources.manifest import list_sources

    recipe = load_recipe({**recipe_for(Path(folder)), "token_cache": cache})
    start, cpu = time.perf_counter(), time.process_time()
    counts = fill_cache(recipe, tables=list_sources(recipe), workers=workers, progress=False)
    return {
        "tokens": 0,
        "seconds": time.perf_counter() - start,
        "cpu_s": time.process_time() - cpu,
        "rss_mb": peak_rss_mb(),
        "hits": 0,
        "misses": counts["written"],
    }


def _child(kind: str, *args) -> dict:
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import json, "
        f"cache as c; print(json.dumps(c.{kind}(*{args!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=20, help="copies of the sample corpus")
    parser.add_argument("--workers", type=int, default=0, help="loader workers")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_corpus(Path(tmp) / "data", args.copies)
        data, cache = str(Path(tmp) / "data"), str(Path(tmp) / "cache")
        size = sum(p.stat().st_size for p in Path(data).glob("*/*.jsonl"))
        rows = [
            {"run": "no cache", **_child("loader_run", data, None, args.workers)},
            {"run": "cold (writes)", **_child("loader_run", data, cache, args.workers)},
            {"run": "warm", **_child("loader_run", data, cache, args.workers)},
            {"run": "warm again", **_child("loader_run", data, cache, args.workers)},
        ]
        cached = sum(p.stat().st_size for p in Path(cache).glob("*/*"))
        shutil.rmtree(cache)
        rows.append({"run": "mixer cache --workers 2 (fill)", **_child("fill_run", data, cache, 2)})
    for row in rows:
        row["tokens_per_s"] = row["tokens"] / row["seconds"] if row["tokens"] else None
        row["tokens_per_cpu_s"] = row["tokens"] / row["cpu_s"] if row["tokens"] else None
    print(
        f"corpus: {size / 1e6:.1f} MB of jsonl, {rows[0]['tokens']:,} tokens; cache "
        f"{cached / 1e6:.1f} MB; {cpu_count()} CPU(s); loader num_workers={args.workers}"
    )
    print(
        table(
            rows,
            [
                "run",
                "tokens",
                "seconds",
                "tokens_per_s",
                "cpu_s",
                "tokens_per_cpu_s",
                "hits",
                "misses",
                "rss_mb",
            ],
        )
    )
    print(
        f"load average {os.getloadavg()[0]:.1f} on {cpu_count()} CPU(s): on a shared machine "
        "seconds include waiting; cpu_s is this process's CPU time (all its threads)"
    )


if __name__ == "__main__":
    main()
