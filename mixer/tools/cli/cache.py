"""`mixer cache`: tokenize every split into the recipe's token cache ahead of time."""

from __future__ import annotations

import argparse

from mixer.tools.cli.args import WORKERS
from mixer.tools.cli.common import load


def run(args: argparse.Namespace) -> int:
    from mixer.cache.fill import fill_cache
    from mixer.runtime import dist
    from mixer.sources.manifest import list_sources

    recipe = load(args.recipe)
    rank, world = dist.launcher_rank_and_world()
    counts = fill_cache(
        recipe,
        tables=list_sources(recipe),
        rank=rank,
        world=world,
        workers=args.workers,
        progress=not args.no_progress,
    )
    prefix = f"rank {rank}/{world}: " if world > 1 else ""
    print(
        f"{prefix}{counts['written']} split(s) written, {counts['cached']} already cached, "
        f"{counts['not cached']} not cacheable (ending in an error, or with images)"
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the command and its flags."""
    p = sub.add_parser(
        "cache",
        help="tokenize every split into the recipe's token_cache "
        "(under torchrun the ranks share the splits)",
    )
    p.add_argument("recipe")
    p.add_argument(
        "--workers",
        type=WORKERS,
        default=0,
        help="worker processes per rank (default 0: in-process)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
