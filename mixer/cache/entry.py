"""A token-cache entry on disk: its format (the commit, sealed with a CRC-32 of its fields) and
the checks a loaded entry passes; `CachedSplit`: an entry as loaded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from mixer.cache.blocks import TokenFile, crc
from mixer.core.errors import REASONS


@dataclass(frozen=True)
class CachedSplit:
    """An entry whose .json, .idx and .rec are checked: its tokens, index and record table."""

    tokens: TokenFile
    starts: np.ndarray  # int64[D + 1]: element offset of each document, then the end
    records: np.ndarray  # int64[R, 4]
    errors: list[list[Any]]
    key: str


CACHE_FORMAT = 4  # 3: the commit carries a CRC-32 of its fields; 4: errors keep their reason


BIN_BLOCK = 1 << 18  # bytes of .bin per CRC: what a resume inside a split over-reads at most


def seal_commit(commit: dict[str, Any]) -> bytes:
    """A commit's bytes: its fields plus `check`, a CRC-32 of them, so that a changed byte
    anywhere in it (an error's message too) is found."""
    fields = {name: value for name, value in commit.items() if name != "check"}
    return json.dumps({**fields, "check": crc(_canonical(fields))}).encode()


def open_commit(data: bytes) -> dict[str, Any]:
    """The fields of a sealed commit; ValueError when it is not one or fails its check."""
    try:
        commit = json.loads(data)
    except RecursionError:
        raise ValueError("commit nested too deeply") from None
    if not isinstance(commit, dict):
        raise ValueError("commit is not a JSON object")
    check = commit.pop("check", None)
    if type(check) is not int or check != crc(_canonical(commit)):
        raise ValueError("commit does not match its check")
    return commit


def _canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True).encode()


def _count(value: Any) -> bool:
    """Whether `value` is a non-negative int (not a bool)."""
    return type(value) is int and value >= 0


def _is_error(value: Any) -> bool:
    """Whether `value` is an error row: [message, same_file, file, location, reason]."""
    return (
        isinstance(value, list)
        and len(value) == 5
        and isinstance(value[0], str)
        and type(value[1]) is bool
        and all(v is None or isinstance(v, str) for v in value[2:4])
        and value[4] in REASONS
    )


def _check_commit(commit: dict[str, Any]) -> None:
    """Every field of a commit of this format present, of its type and in range."""
    if commit.get("v") != CACHE_FORMAT:
        raise ValueError(f"cache format {commit.get('v')!r}")
    if not (_count(commit.get("records")) and _count(commit.get("documents"))):
        raise ValueError("record or document count is not a count")
    for part in ("idx", "rec"):
        value = commit.get(part)
        if not (isinstance(value, list) and len(value) == 2 and all(map(_count, value))):
            raise ValueError(f"{part} size and checksum are not counts")
    tokens = commit.get("bin")
    if not (isinstance(tokens, list) and len(tokens) == 3):
        raise ValueError("bin is not [size, block, checksums]")
    size, block, crcs = tokens
    if not (
        _count(size)
        and _count(block)
        and block > 0
        and block % 8 == 0
        and isinstance(crcs, list)
        and len(crcs) == -(-size // block)
        and all(_count(c) and c <= 0xFFFFFFFF for c in crcs)
    ):
        raise ValueError("bin's size, block and checksums do not agree")
    errors = commit.get("errors")
    if not (isinstance(errors, list) and all(map(_is_error, errors))):
        raise ValueError("errors are not [message, same file, file, location, reason] rows")


def _check_records(records: np.ndarray, documents: int, errors: int) -> None:
    """The record table as a writer lays it out: indices rising, no negative text length,
    documents numbered 0, 1, ... and errors -1, -2, ..., in order, each once."""
    index, numbers = records[:, 0], records[:, 3]
    if len(records) and (index[0] < 0 or np.any(np.diff(index) <= 0)):
        raise ValueError("record indices do not rise")
    if np.any(records[:, 2] < 0):
        raise ValueError("negative text length in the record table")
    if not (
        np.array_equal(numbers[numbers >= 0], np.arange(documents))
        and np.array_equal(numbers[numbers < 0], -1 - np.arange(errors))
    ):
        raise ValueError("record table does not number its documents and errors in order")
