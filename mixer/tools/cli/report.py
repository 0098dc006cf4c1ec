"""`mixer report`: draw a metrics log to a PNG."""

from __future__ import annotations

import argparse

from mixer.tools.cli.args import output_file


def run(args: argparse.Namespace) -> int:
    from mixer.tools.plots import write_report

    write_report(args.metrics, args.output)
    print(f"wrote {args.output}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the command and its flags."""
    p = sub.add_parser(
        "report",
        help="draw a metrics log (cumulative and per-stretch realized "
        "share vs target, epochs, loss per source) to a PNG; needs the "
        "[report] extra",
    )
    p.add_argument("metrics", help="metrics log (JSONL)")
    p.add_argument(
        "-o",
        "--output",
        type=output_file,
        default="report.png",
        help="PNG path (default report.png)",
    )
    p.set_defaults(func=run)
