"""`mixer validate`: check a recipe and its tokenizer.

A source whose path matches no files is a warning, not an error: a recipe can be checked
before its data exists (`mixer inspect` and the loader refuse it). A file that is there but
cannot be used (empty, unreadable) is an error, as in `inspect`, and so is a text field that
none of the first records of a source's first split has (the only records read)."""

from __future__ import annotations

import argparse

from mixer.tools.cli.common import backend_line, load


def run(args: argparse.Namespace) -> int:
    from mixer.cache.tokenizer_setup import recipe_tokenizer
    from mixer.images.select import layout_for
    from mixer.sources.listing import NO_FILES
    from mixer.tokenize import Encoder
    from mixer.tools.sampling import first_records

    recipe = load(args.recipe)
    info = recipe_tokenizer(recipe)
    layout_for(recipe, info)  # an image layout checks that the tokenizer has its tokens
    backend, problems, tables = backend_line(recipe, info)
    for problem in problems:
        if problem.message != NO_FILES:
            raise problem
    for index, table in enumerate(tables or []):
        first_records(recipe, index, table, Encoder(info))
    print(
        f"ok: {len(recipe.sources)} source(s), seq_len {recipe.seq_len}, "
        f"batch_size {recipe.batch_size}, lanes {recipe.lanes}"
    )
    print(backend)
    for problem in problems:
        print(
            f"warning: source {problem.source!r}: {problem.file!r} matches no files (not "
            "there yet?); `mixer inspect` and the loader need them"
        )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the command and its flags."""
    p = sub.add_parser(
        "validate",
        help="check a recipe and its tokenizer; exit non-zero "
        "naming the bad field (files not there yet: a warning)",
    )
    p.add_argument("recipe")
    p.set_defaults(func=run)
