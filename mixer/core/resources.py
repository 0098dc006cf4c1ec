"""Per-process resources: values made at most once per process and key, never shared with a
forked child (filesystem clients and thread pools are not fork-safe; a child makes its own),
and a per-process limit on how many of a kind of resource are open at once (`OpenLimit`)."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """A table of per-process resources: `get(key, make)` returns this process's value for
    `key`, made by `make()` the first time this process asks (a forked child starts empty)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._values: dict[Hashable, T] = {}

    def _own(self) -> dict[Hashable, T]:
        if self._pid != os.getpid():  # inherited through fork: the parent's, not ours
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


class Suspendable(Protocol):
    """A resource that can give up what it holds while idle and take it up again later."""

    def suspend(self, cheap_only: bool = False) -> bool:
        """Give up the held resources; False if it is in use now, or (`cheap_only`) if
        taking them up again would cost much (then it stays open)."""
        ...


class OpenLimit:
    """At most `limit` resources open at once in this process, least recently used first out.

    `touch(item)` marks an item open and most recently used; past the limit, the least
    recently used others are suspended until the limit holds (one in use stays open and is
    passed over). Past `soft` (when smaller), only those cheap to take up again are
    (`suspend(cheap_only=True)`): few are kept open where that costs nothing, more where
    it would. Items are held weakly, so a dropped one needs no `forget`. A forked child
    starts with none open (the parent's items are not the child's to suspend)."""

    def __init__(self, limit: int, soft: int | None = None) -> None:
        self.limit = limit
        self.soft = limit if soft is None else soft
        self.suspended = 0  # suspensions in this process (a measure of the bound's cost)
        self._pid = os.getpid()
        self._open: OrderedDict[int, weakref.ref[Suspendable]] = OrderedDict()
        # Re-entrant: the garbage collector may close a dropped item (`forget`) on a thread
        # that holds it, inside `_shrink`.
        self._lock = threading.RLock()

    def _own(self) -> OrderedDict[int, weakref.ref[Suspendable]]:
        if self._pid != os.getpid():
            self._pid, self._open, self._lock = os.getpid(), OrderedDict(), threading.RLock()
            self.suspended = 0
        return self._open

    def touch(self, item: Suspendable) -> None:
        with self._lock:
            items = self._own()
            key = id(item)
            if key in items:
                items.move_to_end(key)
                return
            items[key] = weakref.ref(item, lambda _, key=key: self._gone(key))
            if len(items) > min(self.soft, self.limit):
                self._shrink(key, min(self.soft, self.limit), cheap_only=True)
            if len(items) > self.limit:
                self._shrink(key, self.limit, cheap_only=False)

    def _shrink(self, keep: int, limit: int, cheap_only: bool) -> None:
        for key in [k for k in self._open if k != keep]:
            if len(self._open) <= limit:
                return
            ref = self._open.get(key)  # (a collected item's callback may have removed it)
            other = ref() if ref is not None else None
            if other is None or other.suspend(cheap_only):
                self._open.pop(key, None)
                self.suspended += other is not None

    def forget(self, item: Suspendable) -> None:
        """`item` closed or suspended itself: it is open no more."""
        with self._lock:
            self._own().pop(id(item), None)

    def _gone(self, key: int) -> None:
        if self._pid == os.getpid():
            self._open.pop(key, None)

    def open_count(self) -> int:
        """How many items are open in this process."""
        return len(self._own())


class Held:
    """A share of a `ByteBudget`: given back when this object is collected."""

    __slots__ = ("nbytes", "__weakref__")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class ByteBudget:
    """Bytes that a kind of resource may hold in this process, all of its holders together.

    `hold(nbytes)` counts `nbytes` against the limit if they fit and returns a `Held` that
    gives them back when it is collected (None if they do not fit): kept beside what it
    accounts for, it is never leaked on any path that drops that (taken, taken back, a
    window abandoned by a resume). A forked child starts with none held (the parent's
    holders are not the child's)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pid = os.getpid()
        self._held = 0
        # Re-entrant: a finalizer (`_give`) may run from the garbage collector on a thread
        # that is inside `hold`.
        self._lock = threading.RLock()

    def _own(self) -> None:
        if self._pid != os.getpid():
            self._pid, self._held, self._lock = os.getpid(), 0, threading.RLock()

    def hold(self, nbytes: int, *, force: bool = False) -> Held | None:
        """A share of `nbytes`, if the limit allows (`force`: past it too, for what is
        held already and must be counted)."""
        self._own()
        with self._lock:
            if self._held + nbytes > self.limit and not force:
                return None
            self._held += nbytes
        held = Held(nbytes)
        weakref.finalize(held, self._give, os.getpid(), nbytes).atexit = False
        return held

    def _give(self, pid: int, nbytes: int) -> None:
        if pid == self._pid == os.getpid():
            with self._lock:
                self._held -= nbytes

    def held(self) -> int:
        """Bytes held in this process now."""
        self._own()
        return self._held

    def room(self) -> int:
        """Bytes that may still be held in this process now."""
        return max(0, self.limit - self.held())


class FreedMemory:
    """Gives the memory that glibc's malloc keeps after `free` back to the system, at most
    once per `interval` seconds (`malloc_trim`; a no-op where the C library has none).

    The data path frees much of what it allocates soon after (window texts, decompression
    buffers, the tokenizer's working memory on the encoding threads, each thread in a malloc
    arena of its own), and glibc keeps freed pages of its arenas mapped: tens of MB of
    resident memory that no one uses (measured by benchmarks/memory.py)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.trims = 0
        self._next = 0.0
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._looked_up = False
        self._trim: Callable[[int], int] | None = None

    def _function(self) -> Callable[[int], int] | None:
        if not self._looked_up:  # (ctypes only once it is needed: `import mixer` stays light)
            self._looked_up = True
            try:
                import ctypes

                # the symbols the process has loaded (not `ctypes.util.find_library`, which
                # runs ldconfig in a subprocess: a fork of the whole process)
                self._trim = ctypes.CDLL(None).malloc_trim
            except (OSError, AttributeError):  # not glibc
                self._trim = None
        return self._trim

    def maybe_release(self) -> None:
        """Trim, unless it was done less than `interval` seconds ago (or is under way)."""
        now = time.monotonic()
        if now < self._next:
            return
        if self._pid != os.getpid():  # forked: the parent's lock may have been held
            self._pid, self._lock = os.getpid(), threading.Lock()
        if not self._lock.acquire(blocking=False):
            return
        try:
            trim = self._function()
            if trim is not None:
                trim(0)
                self.trims += 1
            self._next = time.monotonic() + self.interval
        finally:
            self._lock.release()


FREED_MEMORY = FreedMemory(1.0)
