"""`mixer bench`: throughput, time to first batch, peak RSS, shares of a recipe, and where the
loader's time goes (the stage table and the bottleneck's verdict)."""

from __future__ import annotations

import argparse
import json
import math

from mixer.tools.bench import run_bench
from mixer.tools.bench_profile import STAGE_COLUMNS, stage_rows, verdict
from mixer.tools.cli.args import WORKERS, count, output_file
from mixer.tools.cli.common import load
from mixer.tools.tables import format_table


def run(args: argparse.Namespace) -> int:
    result = run_bench(
        load(args.recipe),
        batches=args.batches,
        num_workers=args.num_workers,
        progress=not args.json and not args.no_progress,
        metrics_out=args.metrics_out,
        metrics_every=args.metrics_every,
        step_time=args.step_time,
    )
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if result.get("tokenizer_backend"):
        print(f"tokenizer backend: {result['tokenizer_backend']}")
    print(
        f"batches {result['batches']}  workers {result['num_workers']}  "
        f"tokens {result['tokens']:,}  in {result['seconds']:.2f} s"
    )
    print(
        f"throughput {result['tokens_per_s']:,.0f} tokens/s   time to first batch "
        f"{result['time_to_first_batch_s'] or 0:.3f} s   peak RSS {result['peak_rss_mb']:.0f} MB"
    )
    title = "mean target" if load(args.recipe).schedule is not None else "weight"
    columns = [
        ("source", "source"),
        ("weight", title),
        ("share", "realized share"),
        ("skipped", "skipped"),
    ]
    if "images" in result:
        print(f"images {result['images']:,} ({result['images_per_s']:,.0f} images/s)")
    if "videos" in result:
        print(
            f"videos {result['videos']:,}, sampled frames {result['frames']:,} "
            f"({result['frames_per_s']:,.0f} frames/s)"
        )
        columns.append(("oversize", "oversize"))
    rows = [
        {
            "source": n,
            "weight": result["weight"][n],
            "share": result["share"][n],
            "skipped": result["skipped"].get(n, 0),
            "oversize": result.get("oversize", {}).get(n, 0),
        }
        for n in result["share"]
    ]
    print(format_table(rows, columns))
    print()
    print(format_table(stage_rows(result), STAGE_COLUMNS))
    wait = result["wait"]
    print(
        f"waited {wait['wait_s']:.3f} s over {wait['batches']} batches after the first "
        f"({wait['share']:.1%} of the time; p50 {wait['p50_ms']:.2f} ms, p99 "
        f"{wait['p99_ms']:.2f} ms; first batch {wait['first_s']:.3f} s); "
        f"{result['cpu_s_per_batch'] or 0:.4f} CPU s per batch"
    )
    print(verdict(result, result.get("workers_needed"), sized=args.step_time is not None))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the command and its flags."""
    p = sub.add_parser(
        "bench",
        help="throughput, time to first batch, peak RSS, shares "
        "(and images/s, oversize documents under an image layout)",
    )
    p.add_argument("recipe")
    p.add_argument(
        "--batches", type=count("batches", 1), default=100, help="batches to time (default 100)"
    )
    p.add_argument(
        "--num-workers",
        type=WORKERS,
        default=0,
        help="DataLoader worker processes (default 0: in-process)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--metrics-out",
        metavar="FILE",
        type=output_file,
        help="write a metrics log (JSONL, one line per logged batch) for `mixer report`",
    )
    p.add_argument(
        "--metrics-every",
        type=count("K", 1),
        default=1,
        metavar="K",
        help="log every K batches (default 1)",
    )
    p.add_argument(
        "--step-time",
        type=step_seconds,
        metavar="S",
        help="consume like a trainer whose step takes S seconds (sleep S after each batch); "
        "reports the wait and workers_needed at that step time",
    )
    p.set_defaults(func=run)


def step_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--step-time must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"--step-time must be a finite number of seconds >= 0, got {text!r}"
        )
    return value
