"""`mixer validate`: check a recipe and its tokenizer."""

from __future__ import annotations

import argparse

from mixer.tools.cli.common import backend_line, load


def run(args: argparse.Namespace) -> int:
    from mixer.images.select import layout_for
    from mixer.tokenize import resolve_tokenizer

    recipe = load(args.recipe)
    info = resolve_tokenizer(recipe.resolve(recipe.tokenizer), recipe.eos_token)
    layout_for(recipe, info)   # an image layout checks that the tokenizer has its tokens
    backend = backend_line(recipe, info)
    print(f"ok: {len(recipe.sources)} source(s), seq_len {recipe.seq_len}, "
          f"batch_size {recipe.batch_size}, lanes {recipe.lanes}")
    print(backend)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the command and its flags."""
    p = sub.add_parser("validate", help="check a recipe and its tokenizer; exit non-zero "
                       "naming the bad field")
    p.add_argument("recipe")
    p.set_defaults(func=run)
