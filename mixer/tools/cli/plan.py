"""`mixer plan`: where N training tokens will come from, before training."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mixer.tools.cli.args import TOKENS, WORKERS, WORLD
from mixer.tools.cli.common import load
from mixer.tools.tables import format_table


def run(args: argparse.Namespace) -> int:
    from mixer.tools.plan import plan

    result = plan(load(args.recipe), args.tokens, world_size=args.world, num_workers=args.workers)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_plan(result)
    if not result["topology"]["valid"]:
        print("error: the loader refuses this topology (see the warning above)", file=sys.stderr)
        return 2
    return 0


def _print_plan(result: dict[str, Any]) -> None:
    rows = [{"name": name, **row} for name, row in result["sources"].items()]
    print(
        f"plan for {result['training_tokens']:,} training tokens "
        f"(schedule: {result['schedule'] or 'none'}; sizes are inspect's estimates)"
    )
    print(
        format_table(
            rows,
            [
                ("name", "source"),
                ("share", "share"),
                ("target_tokens", "target tokens"),
                ("tokens_per_epoch", "~tokens/epoch"),
                ("epochs", "epochs"),
                ("epochs_cap", "cap"),
                ("runs_out_at_tokens", "runs out at"),
                ("read_amplification", "read amp."),
                ("resume_bytes_per_stream", "resume B/stream"),
            ],
        )
    )
    for event in result["renormalizations"]:
        weights = ", ".join(f"{n} {w:.3g}" for n, w in event["weights"].items()) or "none left"
        print(
            f"at {event['at_tokens']:,} tokens {event['source']!r} runs out; "
            f"weights from there: {weights}"
        )
    topo = result["topology"]
    print(
        f"topology: world_size {topo['world_size']}, lanes {topo['lanes']}: valid "
        f"num_workers {topo['valid_num_workers'] or 'none'}; shares within 1 point after "
        f"{topo['exact_mixture_after_tokens_per_rank']:,.0f} tokens per rank"
    )
    print(
        f"resume worst case: {result['resume']['worst_bytes_per_rank']:,} bytes re-read per "
        "rank (one shuffle window per stream, or a whole split without access points)"
    )
    for warning in result["warnings"]:
        print(f"warning: {warning}")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the command and its flags."""
    p = sub.add_parser(
        "plan",
        help="per source for N training tokens: target tokens, epochs, "
        "when capped sources run out, valid topologies, resume worst case",
    )
    p.add_argument("recipe")
    p.add_argument("--tokens", type=TOKENS, required=True, help="training tokens (e.g. 1e12)")
    p.add_argument("--world", type=WORLD, default=1, help="world size (default 1)")
    p.add_argument(
        "--workers",
        type=WORKERS,
        default=None,
        help="DataLoader workers per rank to check (default: list the valid ones)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)
