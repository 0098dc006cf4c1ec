"""Shared types of the storage layer: files, splits, records and the reader protocol."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from mixer.core.errors import DataError


@dataclass(frozen=True)
class FileEntry:
    """One listed object of a source."""

    url: str  # what fsspec opens
    key: str  # path relative to the glob's fixed prefix: identical locally and on S3
    size: int
    format: str
    etag: str = ""  # from the listing or manifest; a changed object is refused on open
    mtime_ns: int = 0  # local files: modification time at listing; a changed file is refused
    dtype: str = ""  # npy: the recipe's `token_dtype` (what a headerless file holds)
    index: FileEntry | None = None  # megatron: the `.idx` beside the `.bin`, checked alike

    def fingerprint(self) -> list:
        """What identifies this file in a state's fingerprint: key and size (plus the token
        dtype and the index's size where they apply); never the URL scheme or version."""
        row: list = [self.key, self.size]
        if self.dtype:
            row.append(self.dtype)
        if self.index is not None:
            row.append(self.index.size)
        return row

    @property
    def version(self) -> str:
        """What identifies this exact content besides its size: ETag, else mtime."""
        return f"etag:{self.etag}" if self.etag else f"mtime:{self.mtime_ns}"


@dataclass(frozen=True)
class Split:
    """A unit of reading: a whole file, a byte range of a plain file, or a parquet row group.

    `start`/`end` are bytes for byte-range splits, compressed bytes for groups of zstd frames
    (whose decompressed range is `dstart`/`dend`), and the row-group index (start == end) for
    parquet. `records` is the exact record count when known from metadata, else -1.
    """

    file: int  # index into the source's file list
    start: int
    end: int
    records: int = -1
    seekable: bool = True  # False for whole compressed files: resume decompresses from 0
    dstart: int = 0
    dend: int = -1  # >= 0 only for zstd frame groups

    def to_list(self) -> list[int]:
        return [
            self.file,
            self.start,
            self.end,
            self.records,
            int(self.seekable),
            self.dstart,
            self.dend,
        ]

    @classmethod
    def from_list(cls, values: list[int]) -> Split:
        return cls(values[0], values[1], values[2], values[3], bool(values[4]), *values[5:])


@dataclass(frozen=True)
class EncodedImage:
    """An image as stored (JPEG/PNG/WebP bytes), and where it was found (for errors)."""

    data: bytes
    member: str  # e.g. the tar member's name
    offset: int  # byte offset of the member's header in the file


@dataclass(frozen=True)
class EncodedVideo(EncodedImage):
    """A video as stored (mp4, webm, mkv, mov or avi bytes); it travels with a record's images
    (after them) and the document builder tells it apart by its type."""


@dataclass(frozen=True)
class EncodedAudio(EncodedImage):
    """An audio clip as stored (wav, flac, mp3, ogg or opus bytes); it travels with a record's
    images (after them and its videos) and the document builder tells it apart by its type."""


@dataclass(frozen=True)
class Record:
    """One document (or the error in its place) and where it starts.

    `index` counts records from the start of the split, `offset` is the byte offset of the
    record in the file (decompressed bytes for compressed files; row number for parquet).
    `images` are the document's images in order, then its videos (`EncodedVideo`), then its
    audio clips (`EncodedAudio`); `text` places them where it holds the recipe's image (video,
    audio) marker, else they come before it.
    `location` says where the text lies in words, for errors found after reading (e.g. a
    webdataset sample's text member); None: the format's description of `offset`.

    A pre-tokenized record (`format: megatron`/`npy`, or a token-cache hit) has `tokens`
    (the document's final ids, EOS included) instead of `text`, and `chars`: the size that
    counts against the shuffle window's byte budget in place of the text's length.

    `consumed` is how many stored bytes of the file the reader had consumed when it yielded
    the record, where `offset` does not count stored bytes (whole compressed files); -1 where
    it does. Metrics measure progress inside such a split by it.
    """

    index: int
    offset: int
    text: str | None
    error: DataError | None = None
    images: tuple[EncodedImage, ...] = ()
    location: str | None = None
    tokens: Any = None  # np.ndarray of token ids, or None for a text record
    chars: int = 0
    consumed: int = -1

    @property
    def size(self) -> int:
        """What the record counts against the shuffle window's byte budget."""
        return len(self.text) if self.text is not None else self.chars


class Reader(Protocol):
    """Turns one split into records, starting at a cursor (record index, offset).

    Readers of pre-tokenized formats also take `tokenizer` (a `TokenizerInfo`: EOS, BOS,
    vocabulary size); the others are never passed it.
    """

    def __call__(
        self,
        *,
        storage: Any,
        entry: FileEntry,
        split: Split,
        source: str,
        text_field: str,
        max_bytes: int,
        index: int,
        offset: int,
    ) -> Iterator[Record]: ...
