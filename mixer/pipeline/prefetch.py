"""Image prefetch ahead of the reading position, and the check of a built document's images."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mixer.core.document import Document, Rejected
from mixer.core.errors import DataError
from mixer.pipeline.cursor import Cursor
from mixer.pipeline.settings import StreamSettings
from mixer.pipeline.window import Window


class ImagePrefetch:
    """Starts decoding images `prefetch_tokens` ahead; checks the document at the position."""

    def __init__(self, settings: StreamSettings, clock: Callable[[], int] | None) -> None:
        self.on_error = settings.on_error
        self.prefetch_tokens = settings.prefetch_tokens
        # When is a document needed? `clock()` is the global batch the lane makes next; a
        # document `batch_tokens` further on is needed `lanes_per_batch` global batches later.
        self.clock = clock or (lambda: 0)
        self.batch_tokens = max(settings.batch_tokens, 1)
        self.lanes_per_batch = settings.lanes_per_batch

    def prefetch(self, win: Window, pos: int) -> None:
        """Start decoding the images of the documents after `pos`, up to `prefetch_tokens`
        tokens ahead, so a large image is ready before its batch is assembled."""
        item = win.items[pos].encoded
        if win.prefetch_end <= pos:
            win.prefetch_end, win.prefetch_tokens = pos + 1, 0
        elif isinstance(item, Document):
            win.prefetch_tokens -= len(item)
        ahead: list[Any] = []
        first = win.ahead[0] if win.ahead else None
        if first is not None and first[2].done() and not first[2].exception():
            ahead = first[2].result()  # the next chunk, built in the background
        while win.prefetch_end < len(win.items) and win.prefetch_tokens < self.prefetch_tokens:
            document = win.items[win.prefetch_end].encoded
            if document is None and ahead and first is not None:
                at = win.prefetch_end - first[0]
                document = ahead[at] if 0 <= at < len(ahead) else None
            if document is None:
                break
            if isinstance(document, Document):
                if document.images:
                    need = (
                        self.clock()
                        + (win.prefetch_tokens // self.batch_tokens) * self.lanes_per_batch
                    )
                    started = [placement.image.prefetch(need) for placement in document.images]
                    if not all(started):
                        break  # the process's pixel budget is spent: try again next time
                win.prefetch_tokens += len(document)
            win.prefetch_end += 1

    def built(self, win: Window, cursor: Cursor) -> Document | None:
        """The built document at the cursor's position with its images checked to decode
        (their pixels kept within the process's pixel budget; decoding of the next ones
        started within it too), or None when it was rejected (counted, or raised)."""
        self.prefetch(win, cursor.pos)
        item = win.items[cursor.pos].encoded
        if isinstance(item, Rejected):
            if item.oversize:
                cursor.oversize += 1
            elif self.on_error == "raise":
                raise item.error
            else:
                cursor.skip(item.error.reason)
            return None
        try:
            for placement in item.images:
                placement.image.prefetch(self.clock(), needed=True)
            for placement in item.images:
                placement.image.check()  # decoded now: a corrupt image is this record's error
        except DataError as exc:
            if self.on_error == "raise":
                raise
            cursor.skip(exc.reason)
            del exc
            return None
        return item
