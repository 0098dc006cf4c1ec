"""`json.loads` for records, with a nesting bound that does not depend on the caller's stack.

Python's `json` parser counts its nesting against the interpreter's recursion limit (3.11) or
its C recursion budget (3.12): on its own, whether it accepts a deeply nested record depends
on how deep the code that calls it sits (a DataLoader worker, a trainer's callback), and so
would the stream. Here a record nested deeper than `MAX_NESTING` arrays or objects (orjson's
own bound) is malformed, and one that may come near it is parsed on a fresh thread with room
for that many levels.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from typing import Any

MAX_NESTING = 1024
SHALLOW = 64  # at most this many '[' and '{': parsed where it is (any stack has that room)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


class TooDeep(ValueError):
    """A record nested deeper than MAX_NESTING arrays or objects."""


def nesting(text: str) -> int:
    """The deepest nesting of arrays and objects in `text`, brackets inside strings aside."""
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def problem(exc: ValueError, what: str) -> str:
    """What is wrong, placed in `what` ("the record"): json's own "line 2 column 1" counts
    lines inside the value, which read as the file's lines next to the file's offset."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at character {exc.pos} of {what}"
    return str(exc)


def loads(data: str | bytes) -> Any:
    """`json.loads(data)`, except that a record nested deeper than MAX_NESTING raises
    `TooDeep`, whatever the depth of the caller's stack."""
    text = (
        data.decode(json.detect_encoding(data), "surrogatepass")
        if isinstance(data, bytes | bytearray)
        else data
    )
    if text.count("[") + text.count("{") <= SHALLOW:
        return json.loads(text)
    if nesting(text) > MAX_NESTING:
        raise TooDeep(f"nested too deeply to parse (over {MAX_NESTING} arrays or objects)")
    with _ROOM:
        return _on_fresh_thread(text)


class _Room:
    """While held (one thread at a time: the limit is the interpreter's), the recursion limit
    is raised by MAX_NESTING and a margin, for a thread started meanwhile."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._limit = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        self._limit = sys.getrecursionlimit()
        sys.setrecursionlimit(self._limit + MAX_NESTING + 64)

    def __exit__(self, *exc: object) -> None:
        sys.setrecursionlimit(self._limit)
        self._lock.release()


_ROOM = _Room()


def _on_fresh_thread(text: str) -> Any:
    out: dict[str, Any] = {}

    def parse() -> None:
        try:
            out["value"] = json.loads(text)
        except BaseException as exc:  # handed to the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=parse, name="mixer-deep-json")
    thread.start()
    thread.join()
    if "error" in out:
        raise out.pop("error")
    return out["value"]
