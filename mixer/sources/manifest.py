"""Manifests: a source's listing (objects, sizes, ETags, splits) saved once, reused at start-up.

`mixer index RECIPE` writes one; a recipe whose `manifest` key names an existing file then
starts without listing or reading parquet footers. A manifest entry is used only for a source
whose globs, format and split settings are unchanged; a file or object changed since indexing
is caught when it is opened (size and ETag, or size and modification time for local files)
rather than read with stale splits.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, StrictInt, StrictStr, ValidationError

from mixer.config.recipe import Recipe, SourceConfig, field_path
from mixer.core.errors import RecipeError
from mixer.core.records import FileEntry, Split
from mixer.sources.formats.registry import FORMATS
from mixer.sources.listing import SourceTable, list_source

MANIFEST_FORMAT = "mixer.manifest"
MANIFEST_VERSION = 2  # 2: local files' modification times


def _key(recipe: Recipe, src: SourceConfig) -> dict[str, Any]:
    key = {
        "globs": [recipe.resolve(g) for g in src.globs],
        "format": src.format,
        "split_bytes": recipe.split_bytes,
        "on_error": src.on_error,
    }
    if src.token_dtype is not None:
        key["token_dtype"] = src.token_dtype
    return key


def _row(f: FileEntry) -> list[Any]:
    return [f.url, f.key, f.size, f.format, f.etag, f.mtime_ns]


def _pretokenized(files: list[FileEntry]) -> list[list[Any]]:
    """[file number, token dtype, [the `.idx`'s row] or []] of each pre-tokenized file."""
    return [
        [i, f.dtype, [] if f.index is None else [_row(f.index)]]
        for i, f in enumerate(files)
        if f.dtype or f.index is not None
    ]


def _entries(rows: list, pretokenized: list) -> list[FileEntry]:
    files = [FileEntry(*row) for row in rows]
    for i, dtype, index in pretokenized:
        files[i] = replace(files[i], dtype=dtype, index=FileEntry(*index[0]) if index else None)
    return files


def manifest_path(recipe: Recipe) -> Path | None:
    return Path(recipe.resolve(recipe.manifest)) if recipe.manifest else None


def write_manifest(recipe: Recipe, path: Path) -> dict[str, Any]:
    """List every source and save the tables to `path` (JSON). Returns a per-source summary."""
    sources = {}
    summary = {}
    for src in recipe.sources:
        table = list_source(recipe, src, deep=True)
        sources[src.name] = {
            "key": _key(recipe, src),
            "files": [_row(f) for f in table.files],
            "pretokenized": _pretokenized(table.files),
            "splits": [s.to_list() for s in table.splits],
            "skipped": table.skipped,
        }
        known = [s.records for s in table.splits]
        summary[src.name] = {
            "files": len(table.files),
            "splits": len(table.splits),
            "bytes": table.total_bytes,
            "documents": sum(known) if all(n >= 0 for n in known) else None,
        }
    data = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "sources": sources}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")))
    tmp.replace(path)  # readers never see a half-written manifest
    return summary


def _known_format(name: str) -> str:
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}")
    return name


# Strict scalars (no "12" or true for a size); rows are JSON arrays.
Count = Annotated[StrictInt, Field(ge=0)]
Flag = Annotated[StrictInt, Field(ge=0, le=1)]
Known = Annotated[StrictInt, Field(ge=-1)]  # -1: unknown / not used
# url, key, size, format, etag, mtime_ns
KnownFormat = Annotated[StrictStr, AfterValidator(_known_format)]
FileRow = tuple[StrictStr, StrictStr, Count, KnownFormat, StrictStr, Count]
PretokenizedRow = tuple[Count, StrictStr, list[FileRow]]  # file, dtype, [its .idx] or []
SplitRow = tuple[Count, Count, Count, Known, Flag, Count, Known]  # as Split.to_list() writes


class _SavedSource(BaseModel):
    key: dict[str, Any]
    files: list[FileRow]
    splits: list[SplitRow]
    skipped: list[str]
    pretokenized: list[PretokenizedRow] = []


class _Manifest(BaseModel):
    """What follows `format` and `version` (checked by `_read` before this, with their own
    message)."""

    sources: dict[str, _SavedSource]


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise RecipeError(f"manifest: cannot read {str(path)!r}: {exc}") from None
    if (
        not isinstance(data, dict)
        or data.get("format") != MANIFEST_FORMAT
        or data.get("version") != MANIFEST_VERSION
    ):
        raise RecipeError(
            f"manifest: {str(path)!r} is not a version-{MANIFEST_VERSION} mixer "
            "manifest; re-run `mixer index`"
        )
    try:
        manifest = _Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise RecipeError(
            f"manifest: {str(path)!r} is damaged at "
            f"{field_path(tuple(first['loc']))}: {first['msg']}; "
            "re-run `mixer index`"
        ) from None
    for name, saved in manifest.sources.items():
        for field, rows in (("splits", saved.splits), ("pretokenized", saved.pretokenized)):
            bad = next((i for i, row in enumerate(rows) if row[0] >= len(saved.files)), None)
            if bad is not None:
                raise RecipeError(
                    f"manifest: {str(path)!r} is damaged at sources.{name}."
                    f"{field}[{bad}]: no such file; re-run `mixer index`"
                )
    return data


def list_sources(recipe: Recipe) -> list[SourceTable]:
    """Every source's table: from the recipe's manifest where it matches, else listed now."""
    path = manifest_path(recipe)
    saved = _read(path)["sources"] if path is not None and path.exists() else {}
    tables = []
    for src in recipe.sources:
        entry = saved.get(src.name)
        if entry is not None and entry["key"] == _key(recipe, src):
            files = _entries(entry["files"], entry.get("pretokenized", []))
            splits = [Split.from_list(s) for s in entry["splits"]]
            tables.append(SourceTable(src.name, files, splits, list(entry["skipped"])))
        else:
            tables.append(list_source(recipe, src))
    return tables
