"""Speed, start-up and memory of the loader on a real-text corpus.

    python benchmarks/startup.py CORPUS [--batches 800] [--repeat 1] [--only ROW,...]

CORPUS holds prose/*.jsonl.zst, code/*.parquet (`content`), web/*.jsonl and tokenizer.json
(e.g. built by benchmarks/peers.py's corpus builder). Recipe: 3 sources, 8 × 2048 batches,
8 lanes, rank 0 of 2. Each row runs in a fresh process (its own peak RSS, libraries imported
before the clock starts):

* tokenizer alone: the documents mixer delivers in the same run, encoded with
  `encode_batch_fast` in calls of 64 (the tokenizer's default thread pool), texts in memory;
* mixer num_workers N: `build_loader` time, first batch time after it returns, tokens/s
  over the run, peak RSS (process + workers);
* resume: a new process loads the state saved at half the run and times its first batch;
* lanes 8/16/64 and 1× vs 10× run length: peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

RECIPE = {"seed": 1, "seq_len": 2048, "batch_size": 8, "lanes": 8}


def recipe_for(corpus: Path, **overrides) -> dict:
    recipe = {
        **RECIPE,
        "tokenizer": str(corpus / "tokenizer.json"),
        "sources": [
            {"name": "prose", "path": str(corpus / "prose" / "*.jsonl.zst"), "weight": 0.4},
            {
                "name": "code",
                "path": str(corpus / "code" / "*.parquet"),
                "text_field": "content",
                "weight": 0.3,
            },
            {"name": "web", "path": str(corpus / "web" / "*.jsonl"), "weight": 0.3},
        ],
    }
    if os.environ.get("SHUFFLE_BUDGET_BYTES"):  # compare budgets without editing the recipe
        recipe["shuffle_budget_bytes"] = int(os.environ["SHUFFLE_BUDGET_BYTES"])
    recipe.update(overrides)
    return recipe


class PeakRss:
    """Peak RSS of this process and its live children, sampled every 50 ms (workers' memory
    counts while they run, not only once they exit)."""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _tree_mb() -> float:
        """RSS of this process and its child processes (DataLoader workers), from /proc."""
        pids = ["self"]
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/children") as f:
                    pids += f.read().split()
            except OSError:
                pass
        total = 0
        for pid in pids:
            try:
                with open(f"/proc/{pid}/statm") as f:
                    total += int(f.read().split()[1]) * 4096
            except OSError:
                pass
        return total / 2**20

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._tree_mb())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return max(self.peak, own)


def tokenizer_alone(corpus: str, batches: int) -> dict:
    """Encode as many tokens as mixer delivers, from each source its weight's share of them,
    in calls of 64 documents (texts read into memory beforehand, not timed)."""
    import pyarrow.parquet as pq
    import zstandard
    from tokenizers import Tokenizer

    root = Path(corpus)
    texts: dict[str, list[str]] = {"prose": [], "code": [], "web": []}
    for path in sorted((root / "prose").glob("*.jsonl.zst")):
        data = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
        texts["prose"] += [json.loads(line)["text"] for line in data.decode().splitlines()]
    for path in sorted((root / "code").glob("*.parquet")):
        texts["code"] += pq.read_table(path, columns=["content"]).column(0).to_pylist()
    for path in sorted((root / "web").glob("*.jsonl")):
        texts["web"] += [json.loads(line)["text"] for line in path.read_text().splitlines()]
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    want = batches * RECIPE["batch_size"] * RECIPE["seq_len"]
    start = time.perf_counter()
    tokens = 0
    for source in recipe_for(root)["sources"]:
        docs = texts[source["name"]]
        goal, got, i = want * source["weight"], 0, 0
        while got < goal:
            chunk = docs[i % len(docs) : i % len(docs) + 64]
            i += 64
            got += sum(
                len(e.ids) + 1 for e in tok.encode_batch_fast(chunk, add_special_tokens=False)
            )
        tokens += got
    elapsed = time.perf_counter() - start
    return {"tokens": tokens, "seconds": elapsed}


def mixer_run(
    corpus: str,
    batches: int,
    workers: int,
    lanes: int = 8,
    save: str | None = None,
    resume: str | None = None,
) -> dict:
    import mixer

    recipe = recipe_for(Path(corpus), lanes=lanes)
    rss = PeakRss()
    t0 = time.perf_counter()
    loader = mixer.build_loader(recipe, rank=0, world_size=2, num_workers=workers)
    if resume:
        loader.load_state_dict(json.loads(Path(resume).read_text()))
    build = time.perf_counter() - t0
    start = time.perf_counter()
    first = None
    tokens = 0
    n = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        tokens += int((batch["source_ids"] >= 0).sum())
        n += 1
        if save and n == batches // 2:
            Path(save).write_text(json.dumps(loader.state_dict()))
        if n >= batches:
            break
    elapsed = time.perf_counter() - start
    loader.close()
    return {
        "tokens": tokens,
        "seconds": elapsed,
        "build_s": build,
        "first_batch_s": first,
        "rss_mb": rss.stop(),
    }


def child(kind: str, *args) -> dict:
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import json, "
        f"startup as s, mixer, torch, tokenizers, pyarrow.parquet, zstandard; "
        f"print('RESULT', json.dumps(s.{kind}(*{args!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def fmt(rows: list[dict], columns: list[str]) -> str:
    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3f}" if v < 100 else f"{v:,.0f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus")
    parser.add_argument("--batches", type=int, default=800)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", default="speed,resume,lanes,length")
    args = parser.parse_args()
    only = set(args.only.split(","))
    corpus = str(Path(args.corpus).resolve())
    state = str(Path(corpus) / "_state.json")
    rows = []
    for _ in range(args.repeat):
        if "speed" in only:
            base = child("tokenizer_alone", corpus, args.batches)
            base_rate = base["tokens"] / base["seconds"]
            rows.append({"run": "tokenizer alone", **base})
            for workers in (0, 2):
                row = child("mixer_run", corpus, args.batches, workers, 8, state)
                rows.append({"run": f"mixer workers={workers}", **row})
            for row in rows[-3:]:
                row["tokens_per_s"] = row["tokens"] / row["seconds"]
                row["vs_tokenizer"] = row["tokens_per_s"] / base_rate
        if "resume" in only:
            for workers in (0, 2):
                child("mixer_run", corpus, args.batches, workers, 8, state)
                row = child("mixer_run", corpus, 4, workers, 8, None, state)
                rows.append({"run": f"resume workers={workers}", **row})
        if "lanes" in only:
            for lanes in (8, 16, 64):
                row = child("mixer_run", corpus, 200, 0, lanes)
                rows.append({"run": f"lanes={lanes} workers=0 200 batches", **row})
        if "length" in only:
            for batches in (args.batches // 10, args.batches):
                row = child("mixer_run", corpus, batches, 0, 8)
                rows.append({"run": f"{batches} batches workers=0", **row})
    print(
        fmt(
            rows,
            [
                "run",
                "tokens",
                "seconds",
                "tokens_per_s",
                "vs_tokenizer",
                "build_s",
                "first_batch_s",
                "rss_mb",
            ],
        )
    )


if __name__ == "__main__":
    main()
