"""What the stage profile costs: loader throughput with and without it.

    python benchmarks/profile_cost.py [--copies 20] [--repeat 6] [--workers 0,2]

The corpus and recipe of `benchmarks/throughput.py` (sample texts, 8 × 2048 batches, one
epoch of every source). Each run reads the whole corpus, after one warm-up run (the token
cache, the page cache); runs with and without the profile alternate (on/off, then off/on),
`--repeat` times each, so a busy machine biases neither. The profile is switched off only
here, in the benchmark's own process, before the loader (and its DataLoader workers, forked
from it) starts: `timed` blocks and the per-batch snapshots of
`mixer.core.stages` become no-ops. What remains of the profile when it is off (the
`perf_counter` calls of the consumer's wait and of its own transfer time, a few per batch)
is in both columns.

Columns: tokens per second, median over the repeats (best in brackets), with the profile
(`on`) and without (`off`); `cost` is 1 - on / off of the medians and of the bests (negative:
within the noise; on a shared machine the bests are the steadier figure).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_count, recipe_for, table, write_corpus  # noqa: E402


class ProfileSwitch:
    """Turns the stage profile of this process (and of processes it forks later) off and on
    again: `timed` blocks and stage snapshots become no-ops."""

    def __init__(self) -> None:
        from mixer.core import stages

        self.stages = stages
        self.saved = (stages.timed.__enter__, stages.timed.__exit__, stages.StageClock.snapshot)

    def set(self, on: bool) -> None:
        stages = self.stages
        if on:
            enter, leave, snapshot = self.saved
        else:
            zeros = [0.0] * len(stages.STAGES)
            enter, leave, snapshot = (
                lambda self: None,
                lambda self, *exc: None,
                lambda self: list(zeros),
            )
        stages.timed.__enter__ = enter  # type: ignore[method-assign]
        stages.timed.__exit__ = leave  # type: ignore[method-assign]
        stages.StageClock.snapshot = snapshot  # type: ignore[method-assign]


def run(recipe: dict, workers: int) -> dict:
    """One pass over the corpus: tokens per second from the first batch on."""
    import mixer

    tokens = batches = 0
    with mixer.build_loader(recipe, num_workers=workers) as loader:
        start = None
        for batch in loader:
            if start is None:  # from the first batch on: start-up is not the profile's
                start = time.perf_counter()
                continue
            tokens += int((batch["source_ids"] >= 0).sum())
            batches += 1
        seconds = time.perf_counter() - (start or time.perf_counter())
        stages = loader.metrics()["stages"]
        busy = sum(s["busy_s"] for name, s in stages.items() if name != "transfer")
    return {"rate": tokens / seconds, "busy_s": busy, "batches": batches + 1}


def count_blocks(recipe: dict) -> str:
    """The profile's own work, counted at num_workers 0: `timed` blocks and snapshots per
    batch, and what one of each costs on this machine."""
    from mixer.core import stages

    counts = {"blocks": 0, "snapshots": 0}
    enter, snapshot = stages.StageClock.enter, stages.StageClock.snapshot

    def counted_enter(self, stage):
        counts["blocks"] += 1
        return enter(self, stage)

    def counted_snapshot(self):
        counts["snapshots"] += 1
        return snapshot(self)

    stages.StageClock.enter = counted_enter  # type: ignore[method-assign]
    stages.StageClock.snapshot = counted_snapshot  # type: ignore[method-assign]
    try:
        batches = run(recipe, 0)["batches"]
    finally:
        stages.StageClock.enter, stages.StageClock.snapshot = enter, snapshot  # type: ignore[method-assign]
    clock, n = stages.StageClock(), 100_000
    start = time.perf_counter()
    for _ in range(n):
        clock.leave(clock.enter(stages.ENCODE))
    block_us = (time.perf_counter() - start) / n * 1e6
    start = time.perf_counter()
    for _ in range(n):
        stages.CLOCK.snapshot()
    snapshot_us = (time.perf_counter() - start) / n * 1e6
    per_batch = counts["blocks"] / batches * block_us + counts["snapshots"] / batches * snapshot_us
    return (
        f"counted at num_workers 0: {counts['blocks'] / batches:.1f} blocks and "
        f"{counts['snapshots'] / batches:.1f} snapshots a batch; {block_us:.2f} µs a block, "
        f"{snapshot_us:.2f} µs a snapshot ({len(stages.CLOCK._threads)} thread records): "
        f"{per_batch:.1f} µs a batch"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=20, help="copies of the sample corpus")
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument("--workers", type=lambda v: [int(w) for w in v.split(",")], default=[0, 2])
    args = parser.parse_args(argv)
    rows = []
    switch = ProfileSwitch()
    with tempfile.TemporaryDirectory() as tmp:
        write_corpus(Path(tmp), args.copies)
        size = sum(p.stat().st_size for p in Path(tmp).glob("*/*.jsonl"))
        recipe = recipe_for(Path(tmp))
        recipe["sources"] = [{**s, "epochs": 1} for s in recipe["sources"]]
        for workers in args.workers:
            run(recipe, workers)  # warm: the token cache, the page cache
            rates: dict[bool, list[float]] = {True: [], False: []}
            busy = 0.0
            for r in range(args.repeat):
                for profile in (True, False) if r % 2 == 0 else (False, True):
                    switch.set(profile)
                    result = run(recipe, workers)
                    switch.set(True)
                    rates[profile].append(result["rate"])
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
                    "cost (medians)": f"{100 * (1 - on / off):+.1f} %",
                    "cost (bests)": f"{100 * (1 - max(rates[True]) / max(rates[False])):+.1f} %",
                    "busy_s measured (on, without transfer)": f"{busy:.1f}",
                }
            )
            if workers == 0:
                counted = count_blocks(recipe)
    print(f"corpus: {size / 1e6:.1f} MB of jsonl; {cpu_count()} CPU(s); {args.repeat} runs each")
    print(table(rows, list(rows[0])))
    if 0 in args.workers:
        print(counted)


if __name__ == "__main__":
    main()
