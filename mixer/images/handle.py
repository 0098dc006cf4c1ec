"""LazyImage: a document's image, its cost known from the header, its pixels made on demand.

Packing needs only `tokens` (from the plan, which needs only the stored size); pixels are made
when a batch needs them, or earlier on a small per-process thread pool after `prefetch()`:
decoding, resizing and the table lookup run in PIL's C code with the GIL released, so a few
threads overlap them with the Python that packs. Pixels are a pure function of the bytes and
the plan, so they are the same whichever thread made them, and however many threads run.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from typing import Any

import numpy as np

from mixer.errors import DataError
from mixer.images.decode import decode_rgb, probe, where
from mixer.images.pool import PriorityPool
from mixer.images.processing import ImagePlan, Processing
from mixer.sources.base import EncodedImage

_lock = threading.Lock()
_threads = min(4, os.cpu_count() or 1)
_pool: tuple[int, PriorityPool] | None = None


def set_decode_threads(threads: int) -> None:
    """Threads of each process's image pool (default min(4, cpu count)). The current pool is
    dropped (its queued work is still done) and the next prefetch makes one of this size."""
    global _threads, _pool
    if threads < 1:
        raise ValueError(f"decode threads must be at least 1, got {threads}")
    with _lock:
        _threads = threads
        if _pool is not None and _pool[0] == os.getpid():
            _pool[1].shutdown()
        _pool = None


def decode_threads() -> int:
    """Threads of each process's image pool."""
    return _threads


def _decode_pool() -> PriorityPool:
    global _pool
    with _lock:
        if _pool is None or _pool[0] != os.getpid():   # never reuse a pool across fork
            _pool = (os.getpid(), PriorityPool(_threads))
        return _pool[1]


def _after_fork_in_child() -> None:
    # The parent's pool threads do not exist here, and its lock may have been held at fork.
    global _lock, _pool
    _lock = threading.Lock()
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class LazyImage:
    """An image of a document (implements `mixer.document.ImageHandle`)."""

    def __init__(self, encoded: EncodedImage, size: tuple[int, int], plan: ImagePlan,
                 processing: Processing, extra_tokens: int, source: str, file: str,
                 max_source_pixels: int) -> None:
        self.encoded = encoded
        self._size = size
        self.plan = plan
        self.processing = processing
        self.extra_tokens = extra_tokens      # tokens the layout wraps around the placeholders
        self.source = source
        self.file = file
        self.max_source_pixels = max_source_pixels
        self._future: tuple[int, Future[np.ndarray]] | None = None   # (pid, pending pixels)
        self._pixels: np.ndarray | None = None

    @classmethod
    def probe(cls, encoded: EncodedImage, processing: Processing, *, extra_tokens: int,
              source: str, file: str, max_source_pixels: int,
              max_pixels: int | None = None) -> LazyImage:
        """The image's handle from its header alone (see `decode.probe`); an image the layout
        cannot plan (qwen2_vl: aspect ratio past 200) raises `DataError` too."""
        size = probe(encoded, source=source, file=file, max_source_pixels=max_source_pixels)
        try:
            plan = processing.plan(*size, max_pixels)
        except ValueError as exc:
            raise DataError(f"image of {size[0]}x{size[1]}: {exc}", source=source, file=file,
                            location=where(encoded)) from exc
        return cls(encoded, size, plan, processing, extra_tokens=extra_tokens, source=source,
                   file=file, max_source_pixels=max_source_pixels)

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

    def replan(self, plan: ImagePlan) -> LazyImage:
        """The same image under another plan (e.g. one of `processing.lower_plans`)."""
        return LazyImage(self.encoded, self._size, plan, self.processing,
                         extra_tokens=self.extra_tokens, source=self.source, file=self.file,
                         max_source_pixels=self.max_source_pixels)

    def _compute(self) -> np.ndarray:
        image = decode_rgb(self.encoded, source=self.source, file=self.file,
                           max_source_pixels=self.max_source_pixels)
        return self.processing.pixels(image, self.plan)

    def prefetch(self, priority: int = 0) -> None:
        """Start making the pixels on the process's image pool (no-op if started or made).
        `priority`: when they are needed (e.g. a global batch index); lower runs first."""
        if self._future is None and self._pixels is None:
            self._future = (os.getpid(), _decode_pool().submit(priority, self._compute))

    def pixels(self) -> np.ndarray:
        """The model's input for the image (see `processing`): waits for the prefetch, or
        makes it here. Raises the `DataError` of bytes that do not decode."""
        if self._pixels is None:
            pending, self._future = self._future, None
            if pending is not None and pending[0] == os.getpid() and not pending[1].cancel():
                self._pixels = pending[1].result()   # running or done: wait for it
            else:
                # Not prefetched, still queued behind work needed later (taken back and made
                # here rather than waited for), or prefetched by a parent before fork.
                self._pixels = self._compute()
        return self._pixels

    def release(self) -> None:
        """Drop the pixels (made or being made); `pixels()` would make them again."""
        if self._future is not None:
            self._future[1].cancel()
        self._future = None
        self._pixels = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled without pixels or pending work (a Future does not pickle); remade on need.
        state = self.__dict__.copy()
        state["_future"] = state["_pixels"] = None
        return state

    def __repr__(self) -> str:
        w, h = self._size
        return (f"LazyImage({self.encoded.member!r}, {w}x{h} -> {self.plan.width}x"
                f"{self.plan.height}, {self.tokens} tokens)")
