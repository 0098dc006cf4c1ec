"""`mixer cache`: tokenize every split of a recipe's sources into its token cache ahead of time.

Rank r of W fills splits r, r + W, ... of the recipe's (source, split) list, so the ranks of a
torchrun job fill one cache in parallel; within a rank, `workers` processes share its splits.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from mixer.cache.store import CACHE_STATS, TokenCache, open_cache
from mixer.cache.tokenizer_setup import recipe_backend
from mixer.config.recipe import Recipe
from mixer.core.errors import RecipeError
from mixer.sources import FORMATS, SourceTable, Storage, read_split
from mixer.tokenize.tokenizer import Encoder, TokenizerInfo


def fill_split(
    cache: TokenCache,
    table: SourceTable,
    split_index: int,
    *,
    text_field: str | None,
    max_bytes: int,
    storage_options: dict[str, Any],
) -> str:
    """Make sure one split has a valid entry: "cached" (it had), "written", "not cached"
    (its records end in an error, hold images, or the cache cannot be written), or
    "pre-tokenized" (megatron/npy splits are read as they are, never cached)."""
    split = table.splits[split_index]
    entry = table.files[split.file]
    if FORMATS[entry.format].pretokenized:
        return "pre-tokenized"
    field = FORMATS[entry.format].text_field(text_field)
    key = cache.key(entry, split, text_field=field, max_bytes=max_bytes)
    if cache.load(key, check_tokens=True) is not None:
        return "cached"
    storage = Storage(table.name, storage_options)
    records = read_split(
        storage=storage,
        entry=entry,
        split=split,
        source=table.name,
        text_field=field,
        max_bytes=max_bytes,
        index=0,
        offset=0,
    )
    writes = CACHE_STATS.writes
    for _ in cache.write_through(records, key, entry.url, Encoder(cache.tokenizer)):
        pass
    return "written" if CACHE_STATS.writes > writes else "not cached"


def _job(args: tuple) -> str:
    return fill_split(*args[:3], **args[3])


def _jobs(
    recipe: Recipe, cache: TokenCache, tables: list[SourceTable], rank: int, world: int
) -> list[tuple]:
    everything = []
    for src, table in zip(recipe.sources, tables):
        options = {
            "text_field": src.chosen_text_field,
            "max_bytes": recipe.max_document_bytes,
            "storage_options": src.storage_options,
        }
        everything += [(cache, table, i, options) for i in range(len(table.splits))]
    return everything[rank::world]


def fill_cache(
    recipe: Recipe,
    *,
    tables: list[SourceTable],
    rank: int = 0,
    world: int = 1,
    workers: int = 0,
    progress: bool = True,
    tokenizer: TokenizerInfo | None = None,
) -> Counter:
    """Fill this rank's share of the cache; counts of "cached", "written", "not cached"."""
    if recipe.token_cache is None:
        raise RecipeError("token_cache: the recipe names no token cache to fill")
    info = tokenizer
    if info is None:  # (the backend as build_loader chooses it: the same ids either way)
        info = recipe_backend(recipe, tables).info
    cache = open_cache(recipe, info)
    if cache is None:
        raise RecipeError("token_cache: image recipes bypass the token cache; nothing to fill")
    jobs = _jobs(recipe, cache, tables, rank, world)
    counts: Counter = Counter()
    results: Iterable[str]
    if workers > 0:
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        results = pool.map(_job, jobs)
    else:
        pool = None
        results = map(_job, jobs)
    if progress:
        from tqdm import tqdm

        results = tqdm(
            results,
            total=len(jobs),
            unit="split",
            desc=f"token cache (rank {rank}/{world})" if world > 1 else "token cache",
        )
    try:
        for result in results:
            counts[result] += 1
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return counts


def cache_summary(
    recipe: Recipe, tables: list[SourceTable], tokenizer: TokenizerInfo
) -> list[dict[str, Any]]:
    """Per source: splits, splits with a committed entry, and the entries' bytes (one listing
    of the cache; checksums are checked when an entry is read, not here)."""
    cache = open_cache(recipe, tokenizer)
    if cache is None:
        return []
    fs, root = cache.filesystem()
    try:
        listed = fs.find(root, detail=True) if fs.exists(root) else {}
    except OSError:
        listed = {}
    sizes = {path.rstrip("/"): info.get("size", 0) or 0 for path, info in listed.items()}
    rows = []
    for src, table in zip(recipe.sources, tables):
        cached = size = pretokenized = 0
        for split in table.splits:
            entry = table.files[split.file]
            if FORMATS[entry.format].pretokenized:
                pretokenized += 1
                continue
            field = FORMATS[entry.format].text_field(src.chosen_text_field)
            base = cache.path(
                cache.key(entry, split, text_field=field, max_bytes=recipe.max_document_bytes)
            )
            if base + ".json" in sizes:
                cached += 1
                size += sum(
                    sizes.get(f"{base}.{part}", 0) for part in ("bin", "idx", "rec", "json")
                )
        rows.append(
            {
                "name": src.name,
                "splits": len(table.splits),
                "cached_splits": cached,
                "cached_bytes": size,
                "pretokenized_splits": pretokenized,
            }
        )
    return rows
