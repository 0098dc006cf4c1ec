"""List a source once (sorted, deterministic) and cut its files into splits."""

from __future__ import annotations

import functools
import os
import random
from dataclasses import dataclass, field, replace

from fsspec.implementations.local import LocalFileSystem

from mixer.config.recipe import Recipe, SourceConfig
from mixer.core.errors import DataError
from mixer.core.records import FileEntry, Split
from mixer.sources.formats.registry import FORMATS, SplitRequest, infer_format
from mixer.sources.storage import RetryPolicy, Storage, call_with_retries, filesystem, redact


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
        return [f.fingerprint() for f in self.files]


NO_FILES = "path matches no files"  # (a source whose files are not there, yet or at all)


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
            found = call_with_retries(
                functools.partial(fs.glob, path, detail=True),
                describe="list",
                policy=RetryPolicy(),
                rng=random.Random(path),
            )
        except Exception as exc:  # 403, missing bucket, unreachable endpoint
            raise DataError(
                redact(f"cannot list: {type(exc).__name__}: {exc}", src.storage_options),
                source=src.name,
                file=pattern,
                reason="unreadable",
            ) from None
        files = sorted((p, info) for p, info in found.items() if info.get("type") != "directory")
        if not files:
            err = DataError(NO_FILES, source=src.name, file=pattern, reason="unreadable")
            if src.on_error == "raise":
                raise err
            skipped.append(str(err))
            continue
        prefix = _fixed_prefix(path)
        companions = _companions(src, [p for p, _ in files])
        for p, info in files:
            if p in companions:
                continue  # a .bin's .idx matched by the same glob: listed with its .bin
            full = p if isinstance(fs, LocalFileSystem) else fs.unstrip_protocol(p)
            fmt = src.format or infer_format(p)
            if fmt is None:
                raise DataError(
                    "cannot infer the format from the file name; set sources[].format",
                    source=src.name,
                    file=full,
                    reason="unreadable",
                )
            key = p[len(prefix) :] if p.startswith(prefix) else p
            etag = str(info.get("ETag") or info.get("etag") or "")
            size, mtime_ns = int(info.get("size") or 0), 0
            if isinstance(fs, LocalFileSystem):
                try:  # ns precision: the listing's float mtime can round a change away
                    stat = os.stat(p)
                    size, mtime_ns = stat.st_size, stat.st_mtime_ns
                except OSError:
                    pass  # vanished since the glob: refused when opened
            dtype = (src.token_dtype or "") if FORMATS[fmt].pretokenized else ""
            entries.setdefault(full, FileEntry(full, key, size, fmt, etag, mtime_ns, dtype))
    return list(entries.values())


def _companions(src: SourceConfig, paths: list[str]) -> set[str]:
    """The paths among `paths` that are another listed file's companion."""
    out = set()
    for p in paths:
        fmt = src.format or infer_format(p)
        companion = FORMATS[fmt].companion if fmt else None
        if companion is not None:
            try:
                out.add(companion(p))
            except ValueError:
                pass  # not a .bin: refused when it is listed
    return out


def _with_companion(src: SourceConfig, entry: FileEntry) -> FileEntry:
    """The entry with the file its format lists alongside (a `.bin`'s `.idx`), stat'ed now."""
    companion = FORMATS[entry.format].companion
    if companion is None:
        return entry
    try:
        url = companion(entry.url)
    except ValueError as exc:
        raise DataError(str(exc), source=src.name, file=entry.url, reason="unreadable") from None
    fs, path = filesystem(url, src.storage_options, src.name)
    try:
        info = call_with_retries(
            functools.partial(fs.info, path),
            describe="stat",
            policy=RetryPolicy(),
            rng=random.Random(path),
        )
    except FileNotFoundError:
        raise DataError(
            "its companion file is missing (a .bin needs its .idx beside it)",
            source=src.name,
            file=url,
            reason="unreadable",
        ) from None
    except Exception as exc:
        raise DataError(
            redact(f"cannot stat: {type(exc).__name__}: {exc}", src.storage_options),
            source=src.name,
            file=url,
            reason="unreadable",
        ) from None
    size, mtime_ns = int(info.get("size") or 0), 0
    if isinstance(fs, LocalFileSystem):
        try:
            stat = os.stat(path)
            size, mtime_ns = stat.st_size, stat.st_mtime_ns
        except OSError:
            pass  # vanished since: refused when opened
    etag = str(info.get("ETag") or info.get("etag") or "")
    suffix = url[len(entry.url.rsplit(".", 1)[0]) :]
    key = entry.key.rsplit(".", 1)[0] + suffix
    return replace(entry, index=FileEntry(url, key, size, entry.format, etag, mtime_ns))


def _splits_of(
    recipe: Recipe, src: SourceConfig, index: int, entry: FileEntry, deep: bool
) -> list[Split]:
    storage = Storage(src.name, src.storage_options)
    return FORMATS[entry.format].splits(
        SplitRequest(index, entry, storage, recipe.split_bytes, deep)
    )


def list_source(recipe: Recipe, src: SourceConfig, *, deep: bool = False) -> SourceTable:
    """Files (sorted by URL) and splits of a source. Bad or empty files raise or are counted.

    `deep` (used by `mixer index`) also scans .zst files for frames to split at; remote
    objects are read whole for it.
    """
    skipped: list[str] = []
    files: list[FileEntry] = []
    splits: list[Split] = []
    found = _expand(recipe, src, skipped)
    for entry in found:
        try:
            if entry.size == 0:
                raise DataError(
                    "empty shard (0 bytes)",
                    source=src.name,
                    file=entry.url,
                    location="byte offset 0",
                    reason="unreadable",
                )
            entry = _with_companion(src, entry)
            try:
                entry_splits = _splits_of(recipe, src, len(files), entry, deep)
            except DataError:
                raise
            except Exception as exc:
                raise DataError(
                    f"cannot read file metadata: {exc}",
                    source=src.name,
                    file=entry.url,
                    location="footer",
                    reason="unreadable",
                ) from None
            if not entry_splits:
                raise DataError(
                    "empty shard (no rows)",
                    source=src.name,
                    file=entry.url,
                    location="row 0",
                    reason="unreadable",
                )
        except DataError as err:
            if src.on_error == "raise":
                raise
            skipped.append(str(err))
            continue
        files.append(entry)
        splits.extend(entry_splits)
    if not files:  # (with on_error: skip; every path matching nothing is still NO_FILES)
        raise DataError(
            "no readable files" if found else NO_FILES,
            source=src.name,
            file=", ".join(src.globs),
            reason="unreadable",
        )
    return SourceTable(src.name, files, splits, skipped)
