"""A compact, generic encoding of the lanes of a loader state: one column per field.

A 1,024-rank × 8-worker job has 8,192 lanes whose states have the same fields; written as
one JSON object per lane, their keys are most of the bytes. The lanes are instead grouped
by their set of fields (paths to the leaves of the nested dicts); a group stores its paths
once and one column per path: a constant (`["=", v]`), integers as offsets from their minimum
(`["+", min, width, digits]`: each offset `width` base-64 digits of one string; small when
lanes advance together, and a byte offset of 10⁹ takes 5 characters instead of 11), or the
values (`["*", [v, ...]]`). Nothing here knows a field's name, so lane states may gain fields
freely. Decoding gives back exactly the dicts that were encoded (`true` stays `true`, not 1).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from mixer.core.errors import StateError

CODEC = "columns"
_DIGITS = np.frombuffer(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", dtype=np.uint8
)
_VALUE = np.full(256, 255, dtype=np.uint8)
_VALUE[_DIGITS] = np.arange(64, dtype=np.uint8)
_MAX_WIDTH = 10  # 60 bits: offsets of counters below 2**63 that lanes actually hold


def _to_digits(offsets: list[int]) -> tuple[int, str] | None:
    """(width, digits) of non-negative offsets, or None when one needs over 60 bits."""
    width = max(1, (max(offsets).bit_length() + 5) // 6)
    if width > _MAX_WIDTH:
        return None
    shifts = np.arange(6 * (width - 1), -1, -6, dtype=np.uint64)
    values = np.array(offsets, dtype=np.uint64)[:, None] >> shifts
    return width, _DIGITS[(values & np.uint64(63)).astype(np.intp)].tobytes().decode()


def _from_digits(width: int, digits: str, count: int) -> list[int] | None:
    raw = np.frombuffer(digits.encode(), dtype=np.uint8)
    if len(raw) != width * count:  # also refuses non-ASCII characters
        return None
    values = _VALUE[raw]
    if count and values.max() == 255:
        return None
    shifts = np.arange(6 * (width - 1), -1, -6, dtype=np.uint64)
    return (values.reshape(count, width).astype(np.uint64) << shifts).sum(axis=1).tolist()


def _leaves(
    value: Mapping[str, Any], prefix: tuple[str, ...], out: list[tuple[tuple[str, ...], Any]]
) -> None:
    for key in sorted(value):
        item = value[key]
        if isinstance(item, dict) and item:
            _leaves(item, prefix + (key,), out)
        else:
            out.append((prefix + (key,), item))


def _column(values: list[Any]) -> list[Any]:
    first = values[0]
    if isinstance(first, (str, int, float, type(None))):
        kind = type(first)
        if all(type(v) is kind and v == first for v in values) and (
            kind is not float or len({math.copysign(1.0, v) for v in values}) == 1
        ):
            return ["=", first]  # (-0.0 == 0.0, but each is given back as written)
        if kind is int and all(type(v) is int for v in values):
            low = min(values)
            digits = _to_digits([v - low for v in values])
            if digits is not None:
                return ["+", low, *digits]
    return ["*", values]


def encodable(lanes: Any) -> bool:
    """Whether `lanes` is a dict of lane key → dict or None (what loaders write)."""
    return isinstance(lanes, dict) and all(
        isinstance(k, str) and (v is None or isinstance(v, dict)) for k, v in lanes.items()
    )


def encode_lanes(lanes: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any]:
    """`{"codec": "columns", "empty": [lane keys of None], "groups": [...]}`."""
    groups: dict[tuple, tuple[list[str], list[list[Any]]]] = {}
    empty = []
    for key, state in lanes.items():
        if state is None:
            empty.append(key)
            continue
        leaves: list[tuple[tuple[str, ...], Any]] = []
        _leaves(state, (), leaves)
        paths = tuple(path for path, _ in leaves)
        keys, rows = groups.setdefault(paths, ([], []))
        keys.append(key)
        rows.append([value for _, value in leaves])
    out = []
    for paths, (keys, rows) in groups.items():
        columns = [_column([row[i] for row in rows]) for i in range(len(paths))]
        out.append({"lanes": keys, "paths": [list(p) for p in paths], "columns": columns})
    return {"codec": CODEC, "empty": empty, "groups": out}


def _damaged(where: str, what: str) -> StateError:
    return StateError(f"loader state is damaged at ['lanes']{where}: {what}")


def _values(column: Any, count: int, where: str) -> list[Any]:
    if not isinstance(column, list) or not column or column[0] not in ("=", "+", "*"):
        raise _damaged(where, 'not a column (["=", v], ["+", min, width, digits], ["*", values])')
    kind = column[0]
    if kind == "=" and len(column) == 2:
        return [column[1]] * count
    if (
        kind == "+"
        and len(column) == 4
        and type(column[1]) is int
        and type(column[2]) is int
        and 1 <= column[2] <= _MAX_WIDTH
        and isinstance(column[3], str)
    ):
        offsets = _from_digits(column[2], column[3], count)
        if offsets is not None:
            return [column[1] + v for v in offsets]
    if kind == "*" and len(column) == 2 and isinstance(column[1], list) and len(column[1]) == count:
        return column[1]
    raise _damaged(where, f"a {kind!r} column of the wrong shape for {count} lanes")


def _tree(paths: list[list[str]], where: str) -> dict[str, Any]:
    """Nested dict of the paths whose leaves are column indices."""
    root: dict[str, Any] = {}
    for index, path in enumerate(paths):
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise _damaged(where, f"path {path} crosses a value")
        if path[-1] in node:
            raise _damaged(where, f"path {path} appears twice or crosses a value")
        node[path[-1]] = index
    return root


def _build(tree: dict[str, Any], row: Sequence[Any]) -> dict[str, Any]:
    return {
        key: _build(sub, row) if isinstance(sub, dict) else row[sub] for key, sub in tree.items()
    }


def decode_lanes(data: Any, keep: Collection[str] | None = None) -> dict[str, Any]:
    """The lanes dict that `encode_lanes` encoded; `StateError` naming the place otherwise.

    `keep`: build only these lanes' states; the others map to `{}` (a loader needs its own
    lanes, and building 8,192 lane dicts on every rank would cost each what one needs).
    """
    if not isinstance(data, dict) or data.get("codec") != CODEC:
        raise _damaged("", f"expected lanes encoded as {{'codec': {CODEC!r}, ...}}")
    empty, groups = data.get("empty"), data.get("groups")
    if not isinstance(empty, list) or not isinstance(groups, list):
        raise _damaged("", "'empty' and 'groups' must be lists")
    lanes: dict[str, Any] = {}

    def claim(key: Any, where: str) -> None:
        if not isinstance(key, str) or key in lanes:
            raise _damaged(where, f"lane key {key!r} is not a string or appears twice")

    for key in empty:
        claim(key, "['empty']")
        lanes[key] = None
    for g, group in enumerate(groups):
        where = f"['groups'][{g}]"
        if not isinstance(group, dict):
            raise _damaged(where, "not an object")
        keys, paths, columns = group.get("lanes"), group.get("paths"), group.get("columns")
        if not (
            isinstance(keys, list)
            and isinstance(paths, list)
            and isinstance(columns, list)
            and len(paths) == len(columns)
        ):
            raise _damaged(where, "needs lists 'lanes', 'paths' and as many 'columns'")
        if not all(isinstance(p, list) and p and all(isinstance(k, str) for k in p) for p in paths):
            raise _damaged(where, "a path is not a non-empty list of strings")
        tree = _tree(paths, where)
        values = [_values(c, len(keys), f"{where}['columns'][{i}]") for i, c in enumerate(columns)]
        for j, (key, row) in enumerate(zip(keys, zip(*values) if values else [()] * len(keys))):
            claim(key, f"{where}['lanes'][{j}]")
            lanes[key] = _build(tree, row) if keep is None or key in keep else {}
    return lanes
