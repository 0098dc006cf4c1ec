"""LazyMedia: a document's image or video, its cost known from the header, its pixels made
on demand (`LazyImage` here, `LazyVideo` in `video.py`).

Packing needs only `tokens` (from the plan, which needs only the stored size); pixels are made
when a batch needs them, or earlier on a small per-process thread pool after `prefetch()`:
decoding, resizing and the table lookup run in PIL's C code with the GIL released, so a few
threads overlap them with the Python that packs. Pixels are a pure function of the bytes and
the plan, so they are the same whichever thread made them, and however many threads run.

Pixels made *ahead of need* -- prefetched for documents not yet packed, or kept after
`check()` proved an image decodes -- share one budget per process (`set_pixel_budget`,
default 256 MB): past it, prefetched images wait, and checked pixels are dropped, to be made
again when their batch needs them. Waiting images start as the budget frees, the soonest
needed first, so a process reads as far ahead as its budget holds. So a best_fit window of
hundreds of documents, or many lanes per worker each looking ahead, never hold all their
pixels at once. Only the batch being finished holds pixels outside the budget.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import math
import os
import threading
import weakref
from concurrent.futures import Future
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from mixer.core.document import MediaKind
from mixer.core.errors import DataError
from mixer.core.records import EncodedImage
from mixer.core.resources import PerProcess
from mixer.core.stages import MEDIA, idle, timed
from mixer.images.decode import decode_rgb, probe, where
from mixer.images.pool import PriorityPool
from mixer.images.processing import ImagePlan, Processing

_lock = threading.Lock()
_threads = min(4, os.cpu_count() or 1)
_pools: PerProcess[PriorityPool] = PerProcess()  # this process's decode pool
_budget = 256 << 20  # bytes of pixels a process may hold ahead of need
_held = [os.getpid(), 0]  # [pid, bytes held ahead of need in that process]
# Re-entrant: a handle's finalizer (`_unreserve`) may run from the garbage collector while
# this thread is inside `_reserve`; nothing between the read and the write of `_held[1]`
# allocates, so the nested update is never lost.
_budget_lock = threading.RLock()
# Images prefetched past the budget: (priority, ticket, weak handle), started as it frees.
_waiting: list[tuple[int, int, weakref.ref]] = []
_tickets = itertools.count(1)


def set_pixel_budget(nbytes: int) -> None:
    """Bytes of pixels each process may make and hold ahead of need (default 256 MB; see
    the module docstring). Set it before building loaders: workers inherit it."""
    global _budget
    if nbytes < 0:
        raise ValueError(f"the pixel budget must be at least 0, got {nbytes}")
    _budget = nbytes
    start_waiting()


def pixel_budget() -> int:
    """Bytes of pixels each process may hold ahead of need."""
    return _budget


def held_ahead() -> int:
    """Bytes of pixels this process holds ahead of need now (made or being made)."""
    with _budget_lock:
        return _held[1] if _held[0] == os.getpid() else 0


def _reserve(nbytes: int, ahead: bool) -> bool:
    pid = os.getpid()
    # Images made ahead leave a quarter of the budget to the documents being built now
    # (`check`), which would otherwise be made twice: checked, dropped, made for the batch.
    limit = _budget - _budget // 4 if ahead else _budget
    with _budget_lock:
        if _held[0] != pid:  # a forked child: the parent's holdings are not its own
            _held[0], _held[1] = pid, 0
        if _held[1] + nbytes > limit:
            return False
        _held[1] += nbytes
        return True


def _unreserve(pid: int, nbytes: int) -> None:
    with _budget_lock:
        if _held[0] == pid:
            _held[1] -= nbytes


def set_decode_threads(threads: int) -> None:
    """Threads of each process's image pool (default min(4, cpu count)). The current pool is
    dropped (its queued work is still done) and the next prefetch makes one of this size."""
    global _threads
    if threads < 1:
        raise ValueError(f"decode threads must be at least 1, got {threads}")
    with _lock:
        _threads = threads
        pool = _pools.pop("decode")
        if pool is not None:
            pool.shutdown()


def decode_threads() -> int:
    """Threads of each process's image pool."""
    return _threads


def _decode_pool() -> PriorityPool:
    with _lock:
        return _pools.get("decode", lambda: PriorityPool(_threads))


_stopping = threading.Event()  # set at interpreter exit: long jobs (videos) end early


def stopping() -> bool:
    """Whether this process is exiting (a job made of many steps should give up)."""
    return _stopping.is_set()


def _stop_at_exit() -> None:
    _stopping.set()
    pool = _pools.pop("decode")
    if pool is not None:
        pool.stop(timeout=10.0)


atexit.register(_stop_at_exit)


def _after_fork_in_child() -> None:
    # The parent's pool threads do not exist here, and its lock may have been held at fork.
    global _lock, _budget_lock
    _lock = threading.Lock()
    _budget_lock = threading.RLock()
    _held[0], _held[1] = os.getpid(), 0  # the parent's holdings are not this process's
    _waiting.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def start_waiting() -> None:
    """Start the images waiting for the pixel budget, soonest needed first, while it holds
    them and the pool has no more jobs queued than threads (called where either may have
    freed: a release, a new prefetch, a job done). Started only as threads take them, the
    queued jobs do not hold the budget that a document being checked now needs."""
    if not _waiting or _stopping.is_set():  # (no pool made for nothing, none at exit)
        return
    pool = _decode_pool()
    starting = []
    with _budget_lock:
        while _waiting and pool.queued() + len(starting) < _threads:
            priority, ticket, ref = _waiting[0]
            image = ref()
            if image is None or image._ticket != ticket:
                heapq.heappop(_waiting)  # dropped, released, or made as needed meanwhile
                continue
            if not image._reserve(ahead=True):
                break
            heapq.heappop(_waiting)
            image._ticket = None
            starting.append((priority, image))
    # Submitted outside the budget's lock: a finalizer run by the collector on a pool thread
    # that holds the pool's lock takes the budget's lock.
    for priority, image in starting:
        image._start(priority, ahead=True)


class _Plan(Protocol):
    @property
    def tokens(self) -> int: ...
    @property
    def rows(self) -> int: ...


class _Processing(Protocol):
    row_shape: tuple[int, ...]


PlanT = TypeVar("PlanT", bound=_Plan)
ProcessingT = TypeVar("ProcessingT", bound=_Processing)


class LazyMedia(Generic[PlanT, ProcessingT]):
    """An image or video of a document (implements `mixer.core.document.MediaHandle`): the
    budgeted, prefetching machinery; subclasses make the pixels (`_make`)."""

    kind: MediaKind

    def __init__(
        self,
        encoded: EncodedImage,
        size: tuple[int, int],
        plan: PlanT,
        processing: ProcessingT,
        extra_tokens: int,
        source: str,
        file: str,
        max_source_pixels: int,
    ) -> None:
        self.encoded = encoded
        self._size = size
        self.plan = plan
        self.processing = processing
        self.extra_tokens = extra_tokens  # tokens the layout wraps around the placeholders
        self.source = source
        self.file = file
        self.max_source_pixels = max_source_pixels
        self._future: tuple[int, Future[np.ndarray]] | None = None  # (pid, pending pixels)
        self._pixels: np.ndarray | None = None
        self._reserved: weakref.finalize | None = None  # its share of the budget, if held
        self._ticket: int | None = None  # its entry in the waiting heap, while it waits

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the stored image, from its header."""
        return self._size

    @property
    def tokens(self) -> int:
        """Sequence tokens of the image: its placeholders and the layout's wrapping tokens."""
        return self.plan.tokens + self.extra_tokens

    @property
    def rows(self) -> int:
        """Rows the image adds to the batch's `pixel_values`."""
        return self.plan.rows

    @property
    def nbytes(self) -> int:
        """Bytes of the image's pixels (known from the plan, before they are made)."""
        return self.plan.rows * math.prod(self.processing.row_shape) * 4

    def _compute(self) -> np.ndarray:
        with timed(MEDIA):
            return self._make()

    def _make(self) -> np.ndarray:
        raise NotImplementedError

    def _reserve(self, *, ahead: bool = False) -> bool:
        """Count the pixels against the process's budget (True: within it)."""
        if self._reserved is None:
            if not _reserve(self.nbytes, ahead):
                return False
            # Given back when released, or when the handle is dropped without a release.
            self._reserved = weakref.finalize(self, _unreserve, os.getpid(), self.nbytes)
            self._reserved.atexit = False
        return True

    def prefetch(self, priority: int = 0, *, needed: bool = False) -> bool:
        """Start making the pixels on the process's image pool (no-op if started or made).
        `priority`: when they are needed (e.g. a global batch index); lower runs first.

        Ahead of need (the default) only within the process's pixel budget: past it the image
        waits, and starts when the budget frees and no image needed sooner waits (see
        `start_waiting`). `needed`: the pixels are wanted now (a document being checked, a
        batch being finished), so they are made whatever the budget. Always True (the image
        is started or waits)."""
        if self._future is not None or self._pixels is not None:
            return True
        if needed:
            self._start(priority, ahead=False)
            return True
        with _budget_lock:
            if self._ticket is None:
                self._ticket = next(_tickets)
                heapq.heappush(_waiting, (priority, self._ticket, weakref.ref(self)))
        start_waiting()
        return True

    def _start(self, priority: int, *, ahead: bool) -> None:
        self._ticket = None  # (an entry left in the waiting heap is stale)
        job = self._compute_ahead if ahead else self._compute
        self._future = (os.getpid(), _decode_pool().submit(priority, job))

    def _compute_ahead(self) -> np.ndarray:
        try:
            return self._compute()
        finally:
            start_waiting()  # this job's thread is about to take the next one

    def _made(self) -> np.ndarray:
        pending, self._future, self._ticket = self._future, None, None
        if pending is not None and pending[0] == os.getpid() and not pending[1].cancel():
            with idle():  # running or done: wait for it (its thread counts `media`)
                return pending[1].result()
        # Not prefetched, still queued behind work needed later (taken back and made here
        # rather than waited for), or prefetched by a parent before fork.
        return self._compute()

    def check(self) -> None:
        """Make sure the pixels can be made: raises the `DataError` of bytes that do not
        decode. The pixels are kept for the batch only within the process's budget (else
        `pixels()` makes them again then)."""
        if self._pixels is None:
            pixels = self._made()
            if self._reserve():
                self._pixels = pixels

    def pixels(self) -> np.ndarray:
        """The model's input for the image (see `processing`): waits for the prefetch, or
        makes it here. Raises the `DataError` of bytes that do not decode."""
        if self._pixels is None:
            self._pixels = self._made()
        return self._pixels

    def release(self) -> None:
        """Drop the pixels (made or being made); `pixels()` would make them again."""
        if self._future is not None:
            self._future[1].cancel()
        self._future = None
        self._pixels = None
        self._ticket = None
        if self._reserved is not None:
            self._reserved()  # gives its bytes back to the budget (once)
            self._reserved = None
            start_waiting()

    def __getstate__(self) -> dict[str, Any]:
        # Pickled without pixels or pending work (a Future does not pickle); remade on need.
        state = self.__dict__.copy()
        state["_future"] = state["_pixels"] = state["_reserved"] = state["_ticket"] = None
        return state


class LazyImage(LazyMedia[ImagePlan, Processing]):
    """An image of a document."""

    kind: MediaKind = "image"

    @classmethod
    def probe(
        cls,
        encoded: EncodedImage,
        processing: Processing,
        *,
        extra_tokens: int,
        source: str,
        file: str,
        max_source_pixels: int,
        max_pixels: int | None = None,
    ) -> LazyImage:
        """The image's handle from its header alone (see `decode.probe`); an image the layout
        cannot plan (qwen2_vl: aspect ratio past 200) raises `DataError` too."""
        size = probe(encoded, source=source, file=file, max_source_pixels=max_source_pixels)
        try:
            plan = processing.plan(*size, max_pixels)
        except ValueError as exc:
            raise DataError(
                f"image of {size[0]}x{size[1]}: {exc}",
                source=source,
                file=file,
                location=where(encoded),
                reason="bad_image",
            ) from exc
        return cls(
            encoded,
            size,
            plan,
            processing,
            extra_tokens=extra_tokens,
            source=source,
            file=file,
            max_source_pixels=max_source_pixels,
        )

    def replan(self, plan: ImagePlan) -> LazyImage:
        """The same image under another plan (e.g. one of `processing.lower_plans`)."""
        return LazyImage(
            self.encoded,
            self._size,
            plan,
            self.processing,
            extra_tokens=self.extra_tokens,
            source=self.source,
            file=self.file,
            max_source_pixels=self.max_source_pixels,
        )

    def _make(self) -> np.ndarray:
        image = decode_rgb(
            self.encoded,
            source=self.source,
            file=self.file,
            max_source_pixels=self.max_source_pixels,
        )
        return self.processing.pixels(image, self.plan)

    def __repr__(self) -> str:
        w, h = self._size
        return (
            f"LazyImage({self.encoded.member!r}, {w}x{h} -> {self.plan.width}x"
            f"{self.plan.height}, {self.tokens} tokens)"
        )
