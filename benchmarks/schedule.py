"""Cost of mixtures that change: the stream with a schedule vs without, and `metrics()`.

    python benchmarks/schedule.py [--copies 10] [--batches 200]

Rows: the same corpus and recipe with fixed weights, a step schedule (3 points) and a linear
schedule, at num_workers 0 (tokens/s over `--batches` batches after the first); then the
time of one `loader.metrics()` call with 8 and 64 lanes (mean of 2,000 calls, after the
loader has handed out batches from every lane), and of one `set_weights` call followed by
the next batch (the restart it costs).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import recipe_for, table, write_corpus  # noqa: E402

import mixer  # noqa: E402


def schedules(batch_tokens: int, batches: int) -> dict[str, dict | None]:
    end = batch_tokens * batches
    points = [
        {"at_tokens": 0, "weights": {"prose": 0.6, "code": 0.3, "changelog": 0.1}},
        {"at_tokens": end // 3, "weights": {"prose": 0.2, "code": 0.3, "changelog": 0.5}},
        {"at_tokens": 2 * end // 3, "weights": {"prose": 0.4, "code": 0.4, "changelog": 0.2}},
    ]
    return {
        "fixed weights": None,
        "step schedule": {"interpolate": "step", "points": points},
        "linear schedule": {"interpolate": "linear", "points": points},
    }


def stream_speed(recipe: dict, batches: int) -> dict:
    loader = mixer.build_loader(recipe)
    it = iter(loader)
    next(it)
    start = time.perf_counter()
    tokens = 0
    for batch in itertools.islice(it, batches):
        tokens += int((batch["source_ids"] >= 0).sum())
    elapsed = time.perf_counter() - start
    loader.close()
    return {"tokens_per_s": tokens / elapsed, "seconds": elapsed}


def metrics_cost(recipe: dict, lanes: int, calls: int = 2000) -> dict:
    loader = mixer.build_loader({**recipe, "lanes": lanes, "shuffle_window": 64})
    it = iter(loader)
    for _ in range(lanes):  # a state for every lane
        next(it)
    start = time.perf_counter()
    for _ in range(calls):
        loader.metrics()
    per_call = (time.perf_counter() - start) / calls
    start = time.perf_counter()
    loader.set_weights({"prose": 1, "code": 1})
    next(it)
    restart = time.perf_counter() - start
    loader.close()
    return {"lanes": lanes, "metrics_us": per_call * 1e6, "set_weights_next_batch_s": restart}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_corpus(folder, args.copies)
        base = recipe_for(folder)
        rows = []
        for name, schedule in schedules(8 * 2048, args.batches).items():
            recipe = dict(base) if schedule is None else {**base, "schedule": schedule}
            rows.append({"recipe": name, **stream_speed(recipe, args.batches)})
        print(table(rows, ["recipe", "tokens_per_s", "seconds"]))
        print()
        costs = [metrics_cost(base, lanes) for lanes in (8, 64)]
        print(table(costs, ["lanes", "metrics_us", "set_weights_next_batch_s"]))


if __name__ == "__main__":
    main()
