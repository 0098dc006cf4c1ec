"""What the commands share."""

from __future__ import annotations

from typing import Any


def load(path: str) -> Any:
    """The recipe at `path`, validated."""
    from mixer.config.recipe import load_recipe

    return load_recipe(path)


def backend_line(recipe: Any, info: Any) -> tuple[str, str | None]:
    """`tokenizer backend: ...` as build_loader would choose it (and caching the verdict
    where build_loader looks for it), and why the sources could not be listed (None where
    they could). Sources that cannot be listed (files not there yet) leave the stress text
    alone to check, which the line says."""
    from mixer.cache.store import tokenizer_info_dir
    from mixer.core.errors import DataError
    from mixer.sources.manifest import list_sources
    from mixer.tokenize import resolve_backend

    try:
        tables, problem = list_sources(recipe), None
    except DataError as exc:
        tables, problem = None, str(exc)
    choice = resolve_backend(recipe, info, tables, info_cache=tokenizer_info_dir(recipe))
    why = f"; sources not read: {problem}" if problem is not None and choice.verdict else ""
    return f"tokenizer backend: {choice.describe()}{why}", problem
