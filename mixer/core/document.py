"""Documents: what a source stream hands its packer.

A document is its token ids (image placeholders already expanded) plus zero or more images.
An image is a lazy handle: it knows its pixel size from the file header and its cost in
sequence tokens before any pixel is decoded, so packing can plan a row without decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict

import numpy as np

if TYPE_CHECKING:
    from mixer.core.errors import DataError
    from mixer.core.records import EncodedImage


MediaKind = Literal["image", "video", "audio"]
"""Which batch keys a medium goes to: images, videos or audio features."""


class MediaPlan(Protocol):
    """What a medium becomes, known before its pixels are made."""

    @property
    def tokens(self) -> int:
        """Placeholder tokens of the medium."""
        ...

    @property
    def rows(self) -> int:
        """Rows of `pixel_values` (or `pixel_values_videos`)."""
        ...


class MediaHandle(Protocol):
    """An image or a video of a document, decoded only when its pixels are needed."""

    @property
    def kind(self) -> MediaKind:
        """Which batch keys the medium goes to: images, videos or audio features."""
        ...

    @property
    def plan(self) -> MediaPlan:
        """Its plan (size after resizing, grid, tokens)."""
        ...

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the stored image, read from its header."""
        ...

    @property
    def tokens(self) -> int:
        """Sequence tokens the image takes in its document (placeholders included)."""
        ...

    @property
    def rows(self) -> int:
        """Rows the image adds to the batch's `pixel_values`."""
        ...

    def prefetch(self, priority: int = 0, *, needed: bool = False) -> bool:
        """Start decoding in the background (no-op once started); lower priority first.
        Ahead of need (not `needed`) only within the process's pixel budget: False when
        the budget refused it."""
        ...

    def check(self) -> None:
        """Raise the image's `DataError` now if it does not decode."""
        ...

    def pixels(self) -> Any:
        """The model's input for this image (decoded, resized, normalized)."""
        ...

    def release(self) -> None:
        """Drop the pixels made so far."""
        ...


@dataclass(frozen=True)
class Placement:
    """Where an image's tokens sit in its document: `tokens[start:start + length]`."""

    image: MediaHandle
    start: int
    length: int


@dataclass
class Document:
    """Token ids of one document (EOS appended) and the images placed in them."""

    tokens: np.ndarray
    images: tuple[Placement, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)  # what a layout needs to rebuild it

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def cost(self) -> int:
        """Sequence tokens the document takes (image tokens included)."""
        return len(self.tokens)

    @property
    def patches(self) -> int:
        """Rows its images and videos add to the batch's pixels (patches; 1 per image where
        fixed-size)."""
        return sum(p.image.rows for p in self.images)

    @property
    def videos(self) -> int:
        """How many of its `images` are videos (handles whose `kind` is "video")."""
        return sum(p.image.kind == "video" for p in self.images)

    @property
    def counts(self) -> tuple[int, int, int]:
        """(images, patches, videos) as the batch caps count them."""
        videos = self.videos
        return len(self.images) - videos, self.patches, videos

    @property
    def splittable(self) -> bool:
        """Whether a packer may cut it across rows (never when it holds images)."""
        return not self.images


class _StreamPosition(TypedDict):
    epoch: int
    window: int
    slot: int
    index: int
    offset: int
    pos: int
    skipped: int
    done: int  # 0 or 1


class StreamState(_StreamPosition, total=False):
    """A source stream's position before its next document: plain ints (JSON as it is)."""

    oversize: int  # image recipes: oversize documents seen
    reasons: dict[str, int]  # skipped records per reason, when any


class DocumentSource(Protocol):
    """What a packer draws documents from (a `SourceStream`, or any resumable iterator)."""

    name: str  # the source's name (errors name it)
    lane: int

    @property
    def done(self) -> bool:
        """True once `next_document` has returned None for good."""
        ...

    def next_document(self) -> Document | None: ...

    def state_dict(self) -> StreamState: ...

    def load_state_dict(self, state: StreamState | None) -> None: ...


@dataclass
class Budget:
    """What is left of a batch's image caps (`None`: no cap); patches count image and video
    rows alike."""

    images: int | None = None
    patches: int | None = None
    videos: int | None = None

    def allows(self, images: int, patches: int, videos: int = 0) -> bool:
        return (
            (self.images is None or images <= self.images)
            and (self.patches is None or patches <= self.patches)
            and (self.videos is None or videos <= self.videos)
        )

    def take(self, images: int, patches: int, videos: int = 0) -> None:
        if self.images is not None:
            self.images -= images
        if self.patches is not None:
            self.patches -= patches
        if self.videos is not None:
            self.videos -= videos


class DocumentBuilder(Protocol):
    """Turns records with images into documents (`mixer.images.documents`)."""

    def build(
        self,
        texts: list[str],
        images: list[tuple[EncodedImage, ...]],
        files: list[str],
        locations: list[str],
    ) -> list[Document | Rejected]:
        """Documents (or rejections) of records: their texts, stored images, files, and
        where each record's text lies (what an error about the text names)."""
        ...


@dataclass(frozen=True)
class Rejected:
    """A record that became no document: an error, or (`oversize`) too long to fit a row."""

    error: DataError
    oversize: bool = False
