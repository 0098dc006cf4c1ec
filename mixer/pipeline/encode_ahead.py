"""Tokenizing a window in chunks (doubling text budgets), with the next chunks encoding ahead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mixer.core.document import Document, DocumentBuilder
from mixer.core.stages import idle
from mixer.pipeline.window import Window
from mixer.tokenize.encoding import (
    CHUNK_MIN_BYTES,
    ENCODED_HELD,
    TEXT_AHEAD,
    TEXT_CHUNKS_AHEAD,
    TOKENIZE_BYTES,
    TOKENIZE_DOCS,
    chunk_full,
    encoding_pool,
    encoding_thread,
    needed_thread,
    next_budget,
)


class EncodeAhead:
    """Fills a window's items' `encoded` chunk by chunk, keeping later chunks in flight."""

    def __init__(
        self, encode: Callable[[list[str]], list[np.ndarray]], documents: DocumentBuilder | None
    ) -> None:
        self.encode_texts = encode
        self.documents = documents  # builds (image) documents instead of encoding text

    def encode(self, win: Window, start: int, stop: int) -> list[Any]:
        """Tokens (or built documents) of window items [start, stop); pre-tokenized items
        pass through as they are."""
        items = win.items
        todo = [i for i in range(start, stop) if isinstance(items[i].text, str)]
        out: list[Any] = [
            None
            if isinstance(item.text, str)
            else item.text
            if self.documents is None
            else Document(item.text)
            for item in items[start:stop]
        ]
        if not todo:
            return out
        if self.documents is None:
            encoded = self.encode_texts([items[i].text for i in todo])
        else:
            encoded = self.documents.build(
                [items[i].text for i in todo],
                [items[i].images for i in todo],
                [items[i].file for i in todo],
                [items[i].location for i in todo],
            )
        for i, item in zip(todo, encoded):
            out[i - start] = item
        return out

    def chunk_stop(self, win: Window, start: int, room: int | None = None) -> int:
        """End of the tokenizer chunk at `start`, by the chunk rule (`tokenize.encoding`) under
        the window's next budget, or under `room` where smaller (down to `CHUNK_MIN_BYTES`);
        image documents keep whole `TOKENIZE_DOCS` chunks."""
        stop = min(start + TOKENIZE_DOCS, len(win.items))
        if self.documents is not None:
            return stop
        budget = win.chunk_bytes
        win.chunk_bytes = next_budget(budget)
        if room is not None:
            budget = max(CHUNK_MIN_BYTES, min(budget, room))
        size = 0
        for i in range(start, stop):
            size += len(win.items[i].text)
            if chunk_full(i + 1 - start, size, budget):
                return i + 1
        return stop

    def tokenize_from(self, win: Window, start: int) -> None:
        """Encode the chunk at `start` into the items; keep the following chunks encoding
        meanwhile (`TEXT_CHUNKS_AHEAD` of text, one of built documents)."""
        win.packing = None  # (the chunk before is packed: its share given back)
        if not (win.ahead and win.ahead[0][0] == start):
            if win.ahead or start != win.encoded_end:
                for _, _, queued, _ in win.ahead:
                    queued.cancel()
                win.ahead = []  # a jump (a resume inside the window): start over from here
                win.chunk_bytes = TOKENIZE_BYTES
            # (else the process's budget of text ahead left this chunk to be encoded now)
            self.submit_ahead(win, start, 1, needed=True)
        if win.ahead:
            _, stop, future, _ = win.ahead.pop(0)  # (its share of the budget given back)
            # Not started yet (the threads are busy with other chunks): encode it now rather
            # than wait behind them (here, or before them on fastokens' one encoding thread).
            if self.documents is None and future.cancel():
                encoded = self._encode_needed(win, start, stop)
            else:
                with idle():  # (the encoding thread counts its own stage)
                    encoded = future.result()
        else:  # pre-tokenized items only: nothing was submitted, they pass through
            encoded = self.encode(win, start, self.chunk_stop(win, start))
        stop = win.encoded_end = start + len(encoded)
        if self.documents is None:
            win.packing = ENCODED_HELD.hold(_text_size(win, start, stop), force=True)
        for i in range(start, stop):
            item = win.items[i]
            item.encoded = encoded[i - start]
            if item.origin is not None:
                item.origin[0].add_tokens(item.origin[1], item.encoded)
            item.text = ""  # free the text once tokenized
            item.images = ()
        self.submit_ahead(win, stop, 1 if self.documents is not None else TEXT_CHUNKS_AHEAD)

    def _encode_needed(self, win: Window, start: int, stop: int) -> list[Any]:
        """Encode a text chunk needed now: here, or on `needed_thread` where there is one."""
        thread = needed_thread()
        if thread is None:
            return self.encode(win, start, stop)
        with idle():
            return thread.submit(
                self.encode, win, start, stop, units=_text_size(win, start, stop), urgent=True
            ).result()

    def submit_ahead(self, win: Window, start: int, chunks: int, *, needed: bool = False) -> None:
        """Queue chunks after those already queued, from `start`, until `chunks` are. Text
        chunks queue only within the process's `TEXT_AHEAD` budget, unless `needed` now, and
        are cut to the room left in its `ENCODED_HELD`."""
        pool = encoding_thread() if self.documents is not None else encoding_pool()
        at = win.ahead[-1][1] if win.ahead else start
        while len(win.ahead) < chunks and at < len(win.items):
            budget = win.chunk_bytes
            # Cut to the room left for tokens held before packing (where there is little, the
            # streams take small chunks rather than none ahead).
            stop = self.chunk_stop(win, at, ENCODED_HELD.room() if self.documents is None else None)
            if not any(isinstance(item.text, str) for item in win.items[at:stop]):
                break  # pre-tokenized items: nothing to encode
            size = _text_size(win, at, stop)
            held = None
            if not needed and self.documents is None:
                held = TEXT_AHEAD.hold(size)
                if held is None:
                    win.chunk_bytes = budget  # cut again, the same, when it is needed
                    break
            win.ahead.append((at, stop, pool.submit(self.encode, win, at, stop, units=size), held))
            at = stop


def _text_size(win: Window, start: int, stop: int) -> int:
    """Characters of text of the window's items [start, stop) (what the budgets count)."""
    return sum(len(item.text) for item in win.items[start:stop] if isinstance(item.text, str))
