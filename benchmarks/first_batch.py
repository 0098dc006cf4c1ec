"""The first batch on a fresh corpus, by tokenizer backend and worker count.

    python benchmarks/first_batch.py [--files 5000] [--repeat 3] [--workers 0,2]
                                     [--backends hf,auto-cold,auto-warm,fastokens-cold]
                                     [--profile]

A corpus of `--files` small jsonl files (prose and code of the bundled sample, a few
documents a file, in two sources), the bundled 32k BPE `data/tokenizer.json`. Every run is a
fresh process with a fresh corpus path and its own empty `XDG_CACHE_HOME`, so nothing of an
earlier run is cached (a fastokens verdict is kept by the files it sampled):

* hf: `tokenizer_backend: hf` (nothing is verified);
* auto-cold: `tokenizer_backend: auto`, no verdict kept: fastokens is verified on this corpus;
* auto-warm: `auto` again on a corpus a first process has already verified (it reads the
  verdict kept then);
* fastokens-cold: `tokenizer_backend: fastokens`, no verdict kept: verified before
  `build_loader` returns (what the verification costs a start that waits for it).

Each cell is the median of `--repeat` processes (the spread beside it): `build_loader` time,
the first batch's time after it returns, and their sum. Libraries are imported before the
clock starts. `--profile` prints a cProfile of one auto-cold `build_loader` + first batch at
num_workers 0 (cumulative time, top entries).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import TOKENIZER, sample_texts  # noqa: E402

DOCS_PER_FILE = 3


def write_corpus(folder: Path, files: int) -> None:
    """`files` jsonl files of `DOCS_PER_FILE` documents, half prose, half code."""
    texts = sample_texts()
    for name in ("prose", "code"):
        (folder / name).mkdir(parents=True, exist_ok=True)
        docs = texts[name]
        for f in range(files // 2):
            lines = [
                json.dumps({"text": f"{docs[(f * DOCS_PER_FILE + d) % len(docs)]}\n[file {f}]"})
                for d in range(DOCS_PER_FILE)
            ]
            (folder / name / f"{f:05d}.jsonl").write_text("\n".join(lines) + "\n")


def recipe_for(folder: Path, backend: str) -> dict:
    return {
        "seed": 1,
        "tokenizer": str(TOKENIZER),
        "tokenizer_backend": backend,
        "seq_len": 2048,
        "batch_size": 8,
        "lanes": 8,
        "sources": [
            {"name": "prose", "path": str(folder / "prose" / "*.jsonl"), "weight": 0.6},
            {"name": "code", "path": str(folder / "code" / "*.jsonl"), "weight": 0.4},
        ],
    }


def first_batch(
    folder: str, backend: str, workers: int, profile: bool = False, settle: bool = False
) -> dict:
    """In the child: build the loader and take its first batch, timed; `settle`: then wait
    for a background verification's verdict (kept for the next process)."""
    import time

    import mixer

    recipe = recipe_for(Path(folder), backend)
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    loader = mixer.build_loader(recipe, rank=0, world_size=1, num_workers=workers)
    build = time.perf_counter() - t0
    batches = iter(loader)  # (held: a dropped iterator stops its workers before returning)
    next(batches)
    first = time.perf_counter() - t0 - build
    if prof is not None:
        import pstats

        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
    choice = loader.backend
    encoding = getattr(choice, "encoding", None) or choice.info.backend  # (what encoded it)
    job = getattr(choice, "background", None)
    if settle and job is not None:
        job.wait(60)
    describe = loader.backend.describe() if loader.backend is not None else None
    loader.close()
    return {"build_s": build, "first_s": first, "backend": describe, "encoding": encoding}


def child(
    folder: Path,
    cache: Path,
    backend: str,
    workers: int,
    profile: bool = False,
    settle: bool = False,
) -> dict:
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import json, "
        "first_batch as fb, mixer, torch, tokenizers, fastokens; "
        f"print('RESULT', json.dumps(fb.first_batch({str(folder)!r}, {backend!r}, "
        f"{workers}, {profile}, {settle})))"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    out = subprocess.run(  # (in the run's folder: PYTHONPATH alone says which mixer)
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=folder.parent
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    if profile:
        print(out.stderr, file=sys.stderr)
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def one_run(root: Path, files: int, backend: str, workers: int, run: int) -> dict:
    """A fresh corpus path and cache folder; auto-warm verifies in a first process."""
    folder = root / f"{backend}-{workers}-{run}"
    cache = folder / "xdg"
    write_corpus(folder / "corpus", files)
    name = backend.removesuffix("-cold").removesuffix("-warm")
    if backend == "auto-warm":
        child(folder / "corpus", cache, name, workers, settle=True)
    try:
        return child(folder / "corpus", cache, name, workers)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def cell(values: list[float]) -> str:
    mid = statistics.median(values)
    return f"{mid:.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--backends", default="hf,auto-cold,auto-warm,fastokens-cold")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mixer-first-batch-"))
    try:
        if args.profile:
            write_corpus(root / "corpus", args.files)
            child(root / "corpus", root / "xdg", "auto", 0, profile=True)
            return
        backends = args.backends.split(",")
        workers = [int(w) for w in args.workers.split(",")]
        runs: dict[tuple[str, int], list[dict]] = {(b, w): [] for b in backends for w in workers}
        for run in range(args.repeat):  # interleaved: a noisy minute spreads over every row
            for key in runs:
                runs[key].append(one_run(root, args.files, *key, run))
        print(f"{args.files:,} jsonl files, median of {args.repeat} processes (min–max), s")
        print()
        print("| backend | workers | build_loader | first batch | total | encodes (first batch) |")
        print("|---|---|---|---|---|---|")
        for (backend, w), rows in runs.items():
            builds = [r["build_s"] for r in rows]
            firsts = [r["first_s"] for r in rows]
            totals = [r["build_s"] + r["first_s"] for r in rows]
            says = rows[-1]["encoding"] or rows[-1]["backend"]
            print(
                f"| {backend} | {w} | {cell(builds)} | {cell(firsts)} | {cell(totals)} | {says} |"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
