"""Memory of the data path: peak PSS of the process tree, over lanes, sources and run length.

    python benchmarks/memory.py [--mb 210] [--batches 900] [--repeat 3] [--workdir /tmp/mixer-peers]
        [--groups lanes,sources,...] [--shuffle-budget-mb M] [--thread-text-mb T] [--open-limit K]

On the corpus of benchmarks/corpus.py (as benchmarks/peers.py: rank 0 of 2, 8 x 2048), each
row runs in a fresh process: it imports mixer (PSS measured), then torch (measured again: the
baseline), builds a loader (`tokenizer_backend` as asked, num_workers 0 unless `--workers`)
and takes N batches while a thread samples the PSS of the process and all its children every
20 ms (psutil's `memory_full_info().pss`). Reported:

    data path     peak PSS of the tree minus the PSS after `import torch, mixer`: what the
                  data path adds to a training script, which has torch imported before it
                  builds a loader. pyarrow, the tokenizer libraries and all that mixer loads
                  to read and tokenize count (`import mixer` does not import torch, so
                  a baseline taken after `import mixer` alone would count torch's ~190 MB)
    median        the median of the samples minus the same: where the run stays, apart from
                  the transients its peak catches (window refills, large documents, the
                  start-up: a longer run meets more of them)
    after mixer   peak PSS minus the PSS right after `import mixer` alone (torch counts)
    CPU           CPU seconds of the tree (user + system) from building the loader to the
                  last batch, and the whole-file decompressors suspended meanwhile by the
                  process's limit (`mixer.sources.formats.reopen`; each costs decompressing
                  that file's start again: "(R of D MB)" is what the suspensions reserved
                  of that against the D MB the readers decompressed)

Rows: lanes 8, 16, 32, 64 (3 sources); 3, 10, 30, 100 sources (8 lanes, or `--lanes`;
source i reads one shard of prose, code and web in turn, shard i // 3 mod 16 of that kind,
under its own name, weights equal: every row reads the three formats alike); run length
1x, 3x, 10x (N, 3N, 10N batches; 8 lanes, or `--lanes`); "run length at 100 sources", 1x and
10x (what grows with many sources shows only over a long run: whole-file decompressors
kept open once the budget on reopening them runs out). "flat" compares each group's
largest and smallest data-path figure.

N is 900 batches by default: every row then runs past the filling of its shuffle windows,
which hold up to the recipe's `shuffle_budget_bytes` of text (64 MB over 8 lanes: 32 MB on
this rank), a bound the recipe sets, reached once the rank has read about that much. A run
of 300 batches reads ~20 MB of text and ends while the windows still fill, so its figures
sit 25–35 MB under the steady state and a longer run looked like growth (run length 1x / 3x
at 300: 119 / 142 MB; at 900: 136 / 135 MB, 9,000 batches 143 MB). `--shuffle-budget-mb`
shows the bound move with the budget (16 MB: 91 / 103 / 112 MB at 300 / 900 / 3,000).
PSS shares a library's pages among the processes that map them: run it alone (another
process of the same venv lowers every figure by its share).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import FIELDS, Corpus, build  # noqa: E402
from peers import RANK, SOURCES, WORLD, mixer_recipe  # noqa: E402

SAMPLE_S = 0.02
LONG = "run length at 100 sources"
GROUPS = ("lanes", "sources", "run length", LONG)


def _tree_pss() -> int:
    import psutil

    me = psutil.Process()
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def _tree_cpu() -> float:
    """CPU seconds (user + system) of this process and its children."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def _suspended() -> str | None:
    """Decompressors this process's open limit suspended, and the MB of decompressing again
    their suspensions reserved (None: a mixer without the limit)."""
    try:
        from mixer.sources.formats.reopen import OPEN_DECOMPRESSORS, REBUILD_BUDGET
    except ImportError:
        return None
    return (
        f"{OPEN_DECOMPRESSORS.suspended} ({REBUILD_BUDGET.reserved / 1e6:.0f} of "
        f"{REBUILD_BUDGET.read / 1e6:.0f} MB)"
    )


class PeakSampler:
    """Samples the tree's PSS on a thread until stopped; `peak` is the largest seen,
    `median` the median of the samples."""

    def __init__(self) -> None:
        self.peak = _tree_pss()
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.samples.append(_tree_pss())
            self.peak = max(self.peak, self.samples[-1])

    @property
    def median(self) -> int:
        return sorted(self.samples)[len(self.samples) // 2] if self.samples else self.peak

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _tree_pss())
        return self.peak


def recipe_for(corpus: Corpus, lanes: int, sources: int, backend: str) -> dict:
    recipe = mixer_recipe(corpus, None, backend)
    recipe["lanes"] = lanes
    if sources != len(SOURCES):
        # Source i reads one shard of kind i mod 3 (prose, code, web in turn), so that every
        # row reads the three formats alike and differs from the others in its count only.
        kinds = [[(s, path) for path in corpus.files(s)] for s in SOURCES]
        shards = [
            kinds[i % len(kinds)][(i // len(kinds)) % len(kinds[i % len(kinds)])]
            for i in range(sources)
        ]
        recipe["sources"] = [
            {"name": f"s{i:03d}", "path": str(path), "text_field": FIELDS[kind], "weight": 1.0}
            for i, (kind, path) in enumerate(shards)
        ]
    return recipe


def child(args: argparse.Namespace) -> dict:
    opts = json.loads(args.opts)
    import mixer

    base = _tree_pss()
    import torch  # noqa: F401

    after_torch = _tree_pss()
    recipe = recipe_for(
        Corpus(Path(args.corpus), 0), opts["lanes"], opts["sources"], opts["backend"]
    )
    if opts.get("open_limit"):
        from mixer.sources.formats.reopen import OPEN_DECOMPRESSORS

        OPEN_DECOMPRESSORS.limit = OPEN_DECOMPRESSORS.soft = opts["open_limit"]
    if opts.get("thread_text_mb"):
        from mixer.tokenize import encoding

        encoding.FASTOKENS_THREAD_TEXT = int(opts["thread_text_mb"] * (1 << 20))
    if opts.get("shuffle_budget_mb"):
        recipe["shuffle_budget_bytes"] = int(opts["shuffle_budget_mb"] * (1 << 20))
    sampler = PeakSampler()
    cpu = _tree_cpu()
    loader = mixer.build_loader(recipe, rank=RANK, world_size=WORLD, num_workers=opts["workers"])
    taken = 0
    for _ in loader:
        taken += 1
        if taken == args.batches:
            break
    cpu = _tree_cpu() - cpu
    peak = sampler.stop()
    loader.close()
    return {
        "base_mb": base / 1e6,
        "torch_mb": (after_torch - base) / 1e6,
        "peak_mb": peak / 1e6,
        "data_mb": (peak - after_torch) / 1e6,
        "median_mb": (sampler.median - after_torch) / 1e6,
        "after_mixer_mb": (peak - base) / 1e6,
        "batches": taken,
        "cpu_s": cpu,
        "suspended": _suspended(),
        "backend": loader.tokenizer.backend,
    }


def _spawn(corpus: Corpus, batches: int, opts: dict) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--corpus",
        str(corpus.folder),
        "--batches",
        str(batches),
        "--opts",
        json.dumps(opts),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return {"error": tail[0]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median_run(runs: list[dict]) -> dict:
    """The run whose data-path peak is the median of `runs` (an error if any failed), with
    the median of their medians and the range of their peaks."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return failed[0]
    ordered = sorted(runs, key=lambda r: r["data_mb"])
    middle = dict(ordered[(len(ordered) - 1) // 2])
    medians = sorted(r["median_mb"] for r in runs)
    middle["median_mb"] = medians[(len(medians) - 1) // 2]
    middle["range"] = (ordered[0]["data_mb"], ordered[-1]["data_mb"])
    return middle


def plan(args: argparse.Namespace) -> list[tuple[str, str, dict, int]]:
    """(group, label, options, batches) of every row."""
    base = {
        "lanes": args.lanes,
        "sources": 3,
        "workers": args.workers,
        "backend": args.backend,
        "open_limit": args.open_limit,
        "thread_text_mb": args.thread_text_mb,
        "shuffle_budget_mb": args.shuffle_budget_mb,
    }
    rows = [
        ("lanes", f"{lanes} lanes", {**base, "lanes": lanes}, args.batches)
        for lanes in (8, 16, 32, 64)
    ]
    rows += [
        ("sources", f"{n} sources", {**base, "sources": n}, args.batches) for n in (3, 10, 30, 100)
    ]
    rows += [
        ("run length", f"{k}x ({k * args.batches} batches)", base, k * args.batches)
        for k in (1, 3, 10)
    ]
    rows += [
        (LONG, f"{k}x ({k * args.batches} batches)", {**base, "sources": 100}, k * args.batches)
        for k in (1, 10)
    ]
    return rows


def markdown(results: list[dict]) -> str:
    lines = [
        "| group | row | data path (peak − import torch, mixer) | median | after mixer | "
        "peak PSS | import mixer | + torch | CPU s | suspended | backend |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['group']} | {r['row']} | {r['error']} |||||||||")
            continue
        low, high = r.get("range", (r["data_mb"], r["data_mb"]))
        spread = f" ({low:.0f}–{high:.0f})" if high > low else ""
        lines.append(
            f"| {r['group']} | {r['row']} | {r['data_mb']:.0f} MB{spread} | "
            f"{r['median_mb']:.0f} MB | "
            f"{r['after_mixer_mb']:.0f} MB | {r['peak_mb']:.0f} MB | "
            f"{r['base_mb']:.0f} MB | {r['torch_mb']:.0f} MB | {r['cpu_s']:.2f} | "
            f"{'–' if r['suspended'] is None else r['suspended']} | "
            f"{r['backend']} |"
        )
    return "\n".join(lines)


def flatness(results: list[dict], key: str = "data_mb") -> str:
    out = []
    for group in GROUPS:
        values = [r[key] for r in results if r["group"] == group and "error" not in r]
        if values:
            out.append(
                f"{group}: {min(values):.0f}–{max(values):.0f} MB "
                f"(+{100 * (max(values) / min(values) - 1):.0f} %)"
            )
    return ("flat? " if key == "data_mb" else "medians: ") + "; ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=210, help="corpus size, MB of text")
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument(
        "--batches",
        type=int,
        default=900,
        help="batches of the 1x run and of the lanes and sources rows",
    )
    parser.add_argument("--workers", type=int, default=0, help="num_workers (default 0)")
    parser.add_argument("--backend", default="fastokens", help="tokenizer_backend")
    parser.add_argument(
        "--lanes", type=int, default=8, help="lanes of the sources and run-length rows (default 8)"
    )
    parser.add_argument(
        "--open-limit",
        type=int,
        default=0,
        help="whole-file decompressors open at once per process, "
        "cheap to reopen or not (default: mixer's, 4 and 8)",
    )
    parser.add_argument(
        "--thread-text-mb",
        type=float,
        default=0,
        help="text a fastokens calling thread encodes before it is replaced "
        "(default: mixer's FASTOKENS_THREAD_TEXT)",
    )
    parser.add_argument(
        "--shuffle-budget-mb",
        type=float,
        default=0,
        help="the recipe's shuffle_budget_bytes, in MB (default: mixer's)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each row: the median peak is reported, the range beside "
        "it, and the median of the medians (a peak moves ±5-10 MB run to run)",
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mixer-peers"))
    parser.add_argument(
        "--groups", default=",".join(GROUPS), help=f"comma-separated subset of: {', '.join(GROUPS)}"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--opts", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    corpus = build(args.workdir, args.mb, args.vocab)
    groups = set(args.groups.split(","))
    results: list[dict[str, Any]] = []
    for group, label, opts, batches in plan(args):
        if group not in groups:
            continue
        print(f"measuring {label} ...", flush=True)
        runs = [_spawn(corpus, batches, opts) for _ in range(args.repeat)]
        results.append({"group": group, "row": label, **_median_run(runs)})
    print(
        f"\nrank {RANK} of {WORLD}, 8 x 2048, num_workers {args.workers}, "
        f"median of {args.repeat} run(s) a row, "
        f"tokenizer_backend {args.backend}, open decompressors limit "
        f"{args.open_limit or 'default'}; {len(os.sched_getaffinity(0))} CPU(s)"
    )
    print(markdown(results))
    print(flatness(results))
    print(flatness(results, "median_mb"))


if __name__ == "__main__":
    main()
