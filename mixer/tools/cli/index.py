"""`mixer index`: list every source once and save a manifest for start-up."""

from __future__ import annotations

import argparse
from pathlib import Path

from mixer.core.errors import MixerError
from mixer.tools.cli.args import output_file, output_problem
from mixer.tools.cli.common import load
from mixer.tools.tables import format_table


def run(args: argparse.Namespace) -> int:
    from mixer.sources.manifest import manifest_path, write_manifest

    recipe = load(args.recipe)
    path = Path(args.output) if args.output else manifest_path(recipe)
    if path is None:
        path = Path(args.recipe).with_suffix(".manifest.json")
    problem = output_problem(str(path), make_parents=True) if not args.output else None
    if problem:
        raise MixerError(f"manifest path: {problem}")
    summary = write_manifest(recipe, path)
    rows = [{"source": name, **info} for name, info in summary.items()]
    print(
        format_table(
            rows,
            [
                ("source", "source"),
                ("files", "files"),
                ("splits", "splits"),
                ("bytes", "bytes"),
                ("documents", "documents"),
            ],
        )
    )
    print(f"wrote {path}")
    if recipe.manifest is None or Path(recipe.resolve(recipe.manifest)) != path.resolve():
        print(f"note: set `manifest: {path}` in the recipe so that start-up uses it")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the command and its flags."""
    p = sub.add_parser("index", help="list every source once and save a manifest for start-up")
    p.add_argument("recipe")
    p.add_argument(
        "-o",
        "--output",
        type=output_file,
        help="manifest path (default: the recipe's `manifest`, else RECIPE.manifest.json)",
    )
    p.set_defaults(func=run)
