"""What the commands share."""

from __future__ import annotations

from typing import Any


def load(path: str) -> Any:
    """The recipe at `path`, validated."""
    from mixer.config.recipe import load_recipe

    return load_recipe(path)
