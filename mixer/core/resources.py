"""Per-process resources: values made at most once per process and key, never shared with a
forked child (filesystem clients and thread pools are not fork-safe; a child makes its own)."""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """A table of per-process resources: `get(key, make)` returns this process's value for
    `key`, made by `make()` the first time this process asks (a forked child starts empty)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._values: dict[Hashable, T] = {}

    def _own(self) -> dict[Hashable, T]:
        if self._pid != os.getpid():   # inherited through fork: the parent's, not ours
            self._pid, self._values = os.getpid(), {}
        return self._values

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        values = self._own()
        value = values.get(key)
        if value is None:
            value = values[key] = make()
        return value

    def peek(self, key: Hashable) -> T | None:
        """This process's value for `key`, if it made one."""
        return self._own().get(key)

    def pop(self, key: Hashable) -> T | None:
        """Forget (and return) this process's value for `key`."""
        return self._own().pop(key, None)

    def clear(self) -> None:
        self._own().clear()
