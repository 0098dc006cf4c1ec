"""The recipe's tokenizer and the backend that encodes with it, set up one way for every
caller (the loader, `mixer cache`, `inspect`, `validate`, `bench`): resolved tokenizers kept
where the loader keeps them (`tokenizer_info_dir`, else the user's cache folder), the backend
chosen by `resolve_backend` (the same ids whichever encodes)."""

from __future__ import annotations

from typing import Any

from mixer.cache.store import tokenizer_info_dir
from mixer.core.token_info import TokenizerInfo
from mixer.tokenize.choice import BackendChoice, resolve_backend
from mixer.tokenize.tokenizer import resolve_recipe_tokenizer


def recipe_tokenizer(recipe: Any) -> TokenizerInfo:
    """The recipe's tokenizer (EOS, BOS, vocabulary, digest), resolved once per file."""
    return resolve_recipe_tokenizer(recipe, tokenizer_info_dir(recipe))


def recipe_backend(
    recipe: Any, tables: Any, tokenizer: TokenizerInfo | None = None, *, background: bool = False
) -> BackendChoice:
    """Which backend encodes the recipe's text, and why; `tables` (the sources' listings, or
    None where they cannot be listed) give the texts a fastokens verdict is checked on;
    `background`: see `resolve_backend`."""
    info = tokenizer if tokenizer is not None else recipe_tokenizer(recipe)
    return resolve_backend(
        recipe, info, tables, info_cache=tokenizer_info_dir(recipe), background=background
    )
