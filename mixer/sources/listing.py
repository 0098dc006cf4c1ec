"""List a source once (sorted, deterministic) and cut its files into splits."""

from __future__ import annotations

import functools
import os
import random
from dataclasses import dataclass, field

from fsspec.implementations.local import LocalFileSystem

from mixer.errors import DataError
from mixer.recipe import Recipe, SourceConfig
from mixer.sources.base import FileEntry, Split
from mixer.sources.parquet import row_groups
from mixer.sources.storage import RetryPolicy, Storage, call_with_retries, filesystem, redact
from mixer.sources.zstd_frames import group_frames, scan_frames

_EXTENSIONS = (
    (".jsonl.zst", "jsonl.zst"), (".json.zst", "jsonl.zst"), (".jsonl.zstd", "jsonl.zst"),
    (".jsonl.gz", "jsonl.gz"), (".json.gz", "jsonl.gz"),
    (".jsonl", "jsonl"), (".json", "jsonl"), (".ndjson", "jsonl"),
    (".parquet", "parquet"), (".pq", "parquet"),
    (".txt", "text"), (".text", "text"), (".md", "text"),
)

def infer_format(name: str) -> str | None:
    lower = name.lower()
    for ext, fmt in _EXTENSIONS:
        if lower.endswith(ext):
            return fmt
    return None


@dataclass
class SourceTable:
    """The listed files and splits of one source, plus what listing skipped."""

    name: str
    files: list[FileEntry]
    splits: list[Split]
    skipped: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def fingerprint(self) -> list[list]:
        return [[f.key, f.size] for f in self.files]


def _fixed_prefix(path: str) -> str:
    cut = min((i for i, ch in enumerate(path) if ch in "*?["), default=len(path))
    prefix = path[:cut]
    if cut == len(path):  # a plain file: its folder is the prefix
        return prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""
    return prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""


def _expand(recipe: Recipe, src: SourceConfig, skipped: list[str]) -> list[FileEntry]:
    entries: dict[str, FileEntry] = {}
    for pattern in src.globs:
        url = recipe.resolve(pattern)
        fs, path = filesystem(url, src.storage_options, src.name)
        try:
            found = call_with_retries(functools.partial(fs.glob, path, detail=True),
                                      describe="list",
                                      policy=RetryPolicy(), rng=random.Random(path))
        except Exception as exc:  # 403, missing bucket, unreachable endpoint
            raise DataError(redact(f"cannot list: {type(exc).__name__}: {exc}",
                                   src.storage_options), source=src.name, file=pattern) from None
        files = sorted((p, info) for p, info in found.items() if info.get("type") != "directory")
        if not files:
            err = DataError("path matches no files", source=src.name, file=pattern)
            if src.on_error == "raise":
                raise err
            skipped.append(str(err))
            continue
        prefix = _fixed_prefix(path)
        for p, info in files:
            full = p if isinstance(fs, LocalFileSystem) else fs.unstrip_protocol(p)
            fmt = src.format or infer_format(p)
            if fmt is None:
                raise DataError("cannot infer the format from the file name; set "
                                "sources[].format", source=src.name, file=full)
            key = p[len(prefix):] if p.startswith(prefix) else p
            etag = str(info.get("ETag") or info.get("etag") or "")
            size, mtime_ns = int(info.get("size") or 0), 0
            if isinstance(fs, LocalFileSystem):
                try:  # ns precision: the listing's float mtime can round a change away
                    stat = os.stat(p)
                    size, mtime_ns = stat.st_size, stat.st_mtime_ns
                except OSError:
                    pass   # vanished since the glob: refused when opened
            entries.setdefault(full, FileEntry(full, key, size, fmt, etag, mtime_ns))
    return list(entries.values())


def _splits_of(recipe: Recipe, src: SourceConfig, index: int, entry: FileEntry,
               deep: bool) -> list[Split]:
    if entry.format == "jsonl":
        step = recipe.split_bytes
        return [Split(index, start, min(start + step, entry.size))
                for start in range(0, entry.size, step)]
    if entry.format == "parquet":
        storage = Storage(src.name, src.storage_options)
        return [Split(index, g, g, rows)
                for g, rows in enumerate(row_groups(storage, entry)) if rows]
    if entry.format == "text":
        return [Split(index, 0, entry.size, 1)]
    if entry.format == "jsonl.zst" and deep:
        # Only `mixer index` scans (for remote objects it reads them whole); local and remote
        # copies thus always get the same splits, and the same stream.
        with Storage(src.name, src.storage_options).open(entry) as f:
            frames = scan_frames(f, entry.size)
        groups = group_frames(frames, recipe.split_bytes) if frames else []
        if len(groups) > 1:
            return [Split(index, start, end, -1, True, dstart, dend)
                    for start, end, dstart, dend in groups]
    return [Split(index, 0, entry.size, -1, seekable=False)]


def list_source(recipe: Recipe, src: SourceConfig, *, deep: bool = False) -> SourceTable:
    """Files (sorted by URL) and splits of a source. Bad or empty files raise or are counted.

    `deep` (used by `mixer index`) also scans .zst files for frames to split at; remote
    objects are read whole for it.
    """
    skipped: list[str] = []
    files: list[FileEntry] = []
    splits: list[Split] = []
    for entry in _expand(recipe, src, skipped):
        try:
            if entry.size == 0:
                raise DataError("empty shard (0 bytes)", source=src.name, file=entry.url,
                                location="byte offset 0")
            try:
                entry_splits = _splits_of(recipe, src, len(files), entry, deep)
            except DataError:
                raise
            except Exception as exc:
                raise DataError(f"cannot read file metadata: {exc}", source=src.name,
                                file=entry.url, location="footer") from None
            if not entry_splits:
                raise DataError("empty shard (no rows)", source=src.name, file=entry.url,
                                location="row 0")
        except DataError as err:
            if src.on_error == "raise":
                raise
            skipped.append(str(err))
            continue
        files.append(entry)
        splits.extend(entry_splits)
    if not files:
        raise DataError("no readable files", source=src.name, file=", ".join(src.globs))
    return SourceTable(src.name, files, splits, skipped)
