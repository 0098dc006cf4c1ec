"""What the commands share."""

from __future__ import annotations

from typing import Any


def load(path: str) -> Any:
    """The recipe at `path`, validated."""
    from mixer.config.recipe import load_recipe

    return load_recipe(path)


def backend_line(recipe: Any, info: Any) -> tuple[str, list[Any], list[Any] | None]:
    """`tokenizer backend: ...` as build_loader would choose it (and caching the verdict
    where build_loader looks for it), the `DataError` of every source that could not be
    listed (none where all could), and the sources' tables (None unless all could). Sources
    that cannot be listed (files not there yet) leave the stress text alone to check, which
    the line says."""
    from mixer.cache.tokenizer_setup import recipe_backend
    from mixer.core.errors import DataError
    from mixer.sources import list_source
    from mixer.sources.manifest import list_sources

    problems: list[DataError] = []
    try:
        tables = list_sources(recipe)
    except DataError:
        tables = None
        for src in recipe.sources:  # (each source's problem, not only the first)
            try:
                list_source(recipe, src)
            except DataError as exc:
                problems.append(exc)
    choice = recipe_backend(recipe, tables, info)
    return f"tokenizer backend: {choice.describe()}", problems, tables
