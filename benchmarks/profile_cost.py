"""What the stage profile costs: loader throughput with and without it.

    python benchmarks/profile_cost.py [--copies 20] [--repeat 3] [--workers 0,2]

The corpus and recipe of `benchmarks/throughput.py` (sample texts, 8 × 2048 batches, one
epoch of every source). Each run is a fresh subprocess reading the whole corpus; runs with and
without the profile alternate, `--repeat` times each, so a busy machine biases neither. The
profile is switched off only here, in the benchmark's own process, before the loader (and
its DataLoader workers, forked from it) starts: `timed` blocks and the per-batch snapshots of
`mixer.core.stages` become no-ops. What remains of the profile when it is off (the
`perf_counter` calls of the consumer's wait and of its own transfer time, a few per batch)
is in both columns.

Columns: tokens per second, median over the repeats (best in brackets), with the profile
(`on`) and without (`off`); `cost` is 1 - on / off of the medians (negative: within the noise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_count, recipe_for, table, write_corpus  # noqa: E402


def profile_off() -> None:
    """Make every stage block and snapshot of this process (and of processes it forks later)
    a no-op."""
    from mixer.core import stages

    zeros = [0.0] * len(stages.STAGES)
    stages.timed.__enter__ = lambda self: None  # type: ignore[method-assign]
    stages.timed.__exit__ = lambda self, *exc: None  # type: ignore[method-assign]
    stages.StageClock.snapshot = lambda self: list(zeros)  # type: ignore[method-assign]


def run(folder: str, workers: int, profile: bool) -> dict:
    if not profile:
        profile_off()
    import mixer

    recipe = recipe_for(Path(folder))
    recipe["sources"] = [{**s, "epochs": 1} for s in recipe["sources"]]
    tokens = 0
    with mixer.build_loader(recipe, num_workers=workers) as loader:
        start = None
        for batch in loader:
            if start is None:  # from the first batch on: start-up is not the profile's
                start = time.perf_counter()
                continue
            tokens += int((batch["source_ids"] >= 0).sum())
        seconds = time.perf_counter() - (start or time.perf_counter())
        stages = loader.metrics()["stages"]
        busy = sum(s["busy_s"] for name, s in stages.items() if name != "transfer")
    return {"tokens": tokens, "seconds": seconds, "busy_s": busy}


def _child(folder: str, workers: int, profile: bool) -> dict:
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import json, "
        f"profile_cost as p; print(json.dumps(p.run({folder!r}, {workers}, {profile})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=20, help="copies of the sample corpus")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=lambda v: [int(w) for w in v.split(",")], default=[0, 2])
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        write_corpus(Path(tmp), args.copies)
        size = sum(p.stat().st_size for p in Path(tmp).glob("*/*.jsonl"))
        for workers in args.workers:
            rates: dict[bool, list[float]] = {True: [], False: []}
            busy = 0.0
            for _ in range(args.repeat):
                for profile in (True, False):
                    result = _child(tmp, workers, profile)
                    rates[profile].append(result["tokens"] / result["seconds"])
                    if profile:
                        busy = result["busy_s"]
                    elif result["busy_s"]:
                        raise SystemExit(f"the profile was not off: {result}")
            on, off = statistics.median(rates[True]), statistics.median(rates[False])
            rows.append(
                {
                    "num_workers": workers,
                    "on tokens/s": f"{on:,.0f} ({max(rates[True]):,.0f})",
                    "off tokens/s": f"{off:,.0f} ({max(rates[False]):,.0f})",
                    "cost": f"{100 * (1 - on / off):+.1f} %",
                    "busy_s measured (on, without transfer)": f"{busy:.1f}",
                }
            )
    print(f"corpus: {size / 1e6:.1f} MB of jsonl; {cpu_count()} CPU(s); {args.repeat} runs each")
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
