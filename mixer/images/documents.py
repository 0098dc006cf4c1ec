"""From records (text + stored images) to documents whose image tokens are in place.

For each record: the text is cut at the recipe's image marker (each marker is the next image;
without a marker, all images come first), the pieces are tokenized in one batch, each image's
header is probed and planned (resized size, grid, tokens) without decoding, and the layout's
placeholder span goes where the image belongs. A document longer than `seq_len` (or over the
per-batch caps) gets the largest lower image resolution that fits (never below `min_pixels`),
else, at the lowest, loses the text after its last image; if it still does not fit it is
rejected as oversize (counted, never an error). A document whose images alone exceed the
per-batch caps is oversize too.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from mixer.config.images import ImageSettings
from mixer.core.document import Document, Placement, Rejected
from mixer.core.errors import DataError
from mixer.images.decode import probe
from mixer.images.handle import LazyImage
from mixer.images.processing import ImagePlan
from mixer.sources import EncodedImage
from mixer.tokenize import Encoder


@dataclass(frozen=True)
class VisionTokens:
    """How a layout writes an image into the token sequence."""

    placeholder: int                # repeated plan.tokens times
    before: tuple[int, ...] = ()    # e.g. <|vision_start|>
    after: tuple[int, ...] = ()     # e.g. <|vision_end|>

    @property
    def ids(self) -> tuple[int, ...]:
        return (self.placeholder, *self.before, *self.after)

    @property
    def extra(self) -> int:
        return len(self.before) + len(self.after)

    def span(self, plan: ImagePlan) -> np.ndarray:
        return np.array([*self.before, *[self.placeholder] * plan.tokens, *self.after],
                        dtype=np.int64)


class ImageDocuments:
    """The document builder of one source under an image layout."""

    def __init__(self, *, settings: ImageSettings, processing, encoder: Encoder,
                 vision: VisionTokens, vision_names: dict[int, str], seq_len: int,
                 source: str) -> None:
        self.settings = settings
        self.processing = processing
        self.encoder = encoder
        self.vision = vision
        self.vision_names = vision_names
        self.seq_len = seq_len
        self.source = source
        self._vision_ids = np.array(sorted(set(vision.ids)), dtype=np.int64)

    # -- one chunk of records ------------------------------------------------------------------
    def build(self, texts: list[str], images: list[tuple[EncodedImage, ...]],
              files: list[str], locations: list[str]) -> list[Document | Rejected]:
        """Documents of records (texts, stored images, files, where each text lies); a
        record that cannot be one is `Rejected` with a `DataError` naming its text's place
        (errors about the text) or its image member (errors about an image)."""
        marker = self.settings.marker
        parts: list[list[str] | Rejected] = []
        for text, imgs, file, where in zip(texts, images, files, locations):
            count = text.count(marker)
            if count > len(imgs):
                parts.append(self._error(
                    f"sample without an image where one is required: the text holds {count} "
                    f"image marker(s) {marker!r} but the sample has {len(imgs)} image(s)",
                    file, where))
            elif count and count != len(imgs):
                parts.append(self._error(
                    f"the text holds {count} image marker(s) {marker!r} but the sample has "
                    f"{len(imgs)} image(s): each marker stands for one image", file, where))
            elif count:
                parts.append(text.split(marker))
            else:
                parts.append([""] * len(imgs) + [text])   # images first, then the text
        flat = [piece for p in parts if not isinstance(p, Rejected) for piece in p]
        encoded = iter(self.encoder.encode_raw(flat) if flat else [])
        out: list[Document | Rejected] = []
        for p, imgs, file, where in zip(parts, images, files, locations):
            if isinstance(p, Rejected):
                out.append(p)
                continue
            pieces = [next(encoded) for _ in p]
            out.append(self._document(pieces, imgs, file, where))
        return out

    def _error(self, message: str, file: str, where: str) -> Rejected:
        return Rejected(DataError(message, source=self.source, file=file, location=where,
                                  reason="bad_image"))

    # -- one record ----------------------------------------------------------------------------
    def _document(self, pieces: list[list[int]], imgs: tuple[EncodedImage, ...],
                  file: str, where: str) -> Document | Rejected:
        for piece in pieces:
            found = np.intersect1d(np.asarray(piece, dtype=np.int64), self._vision_ids)
            if found.size:
                name = self.vision_names[int(found[0])]
                return self._error(f"the text holds the image token {name!r} itself; only the "
                                   "image marker may stand for an image", file, where)
        sizes = []
        for image in imgs:
            try:
                size = probe(image, source=self.source, file=file,
                             max_source_pixels=self.settings.max_source_pixels)
                self.processing.plan(*size)
            except DataError as exc:
                return Rejected(exc)
            except ValueError as exc:   # a shape the layout cannot plan (aspect ratio)
                return Rejected(DataError(f"image of {size[0]}x{size[1]}: {exc}",
                                          source=self.source, file=file,
                                          location=f"member {image.member} at byte offset "
                                          f"{image.offset}", reason="bad_image"))
            sizes.append(size)
        return self._fit(pieces, imgs, sizes, file)

    def _plans(self, sizes: list[tuple[int, int]]) -> Iterator[list[ImagePlan]]:
        """Plans for all images at once, largest first: the recipe's, then at each common
        pixel budget (from max_pixels down to min_pixels) where some image's plan shrinks,
        every image's plan at that budget -- each distinct combination once, so the first
        that fits is the largest resolution that fits. An image never goes below
        min_pixels (nor below its recipe plan, when smart_resize already put that under
        min_pixels): past that it keeps its smallest plan at or above it."""
        base = [self.processing.plan(w, h) for w, h in sizes]
        yield base
        if self.settings.layout != "qwen2_vl" or not sizes:
            return   # llava: one resolution
        floors = [min(self.settings.min_pixels, plan.width * plan.height) for plan in base]
        steps = [((-budget, i, plan) for budget, plan in
                  itertools.islice(self.processing.iter_budgeted_plans(w, h), 1, None))
                 for i, (w, h) in enumerate(sizes)]
        current = list(base)
        for _, group in itertools.groupby(heapq.merge(*steps), key=lambda step: step[0]):
            changed = False
            for _, i, plan in group:
                if plan.width * plan.height >= floors[i]:
                    current[i], changed = plan, True
            if changed:
                yield list(current)

    def _fits_caps(self, plans: list[ImagePlan]) -> bool:
        caps = self.settings
        if caps.max_images_per_batch is not None and len(plans) > caps.max_images_per_batch:
            return False
        patches = sum(p.rows for p in plans)
        return caps.max_patches_per_batch is None or patches <= caps.max_patches_per_batch

    def _fit(self, pieces: list[list[int]], imgs: tuple[EncodedImage, ...],
             sizes: list[tuple[int, int]], file: str) -> Document | Rejected:
        bos, eos = self.encoder.info.bos_id, self.encoder.info.eos_id
        head = [bos] if bos is not None else []
        if not imgs:   # text only: packers may cut it like any text document
            return self._assemble(head, pieces, imgs, sizes, [], file, eos)
        text_tokens = sum(len(p) for p in pieces) + len(head) + 1
        last: list[ImagePlan] = []
        for plans in self._plans(sizes):
            last = plans
            image_tokens = sum(p.tokens + self.vision.extra for p in plans)
            if self._fits_caps(plans) and text_tokens + image_tokens <= self.seq_len:
                return self._assemble(head, pieces, imgs, sizes, plans, file, eos)
        image_tokens = sum(p.tokens + self.vision.extra for p in last)
        through_last_image = text_tokens - len(pieces[-1]) - 1 + image_tokens
        if self._fits_caps(last) and through_last_image <= self.seq_len:
            # Cut the text after the last image (no EOS then: the document is truncated).
            document = self._assemble(head, pieces, imgs, sizes, last, file, eos)
            return Document(document.tokens[:self.seq_len], document.images, document.meta)
        first = imgs[0]
        return Rejected(DataError(
            f"document of {text_tokens + image_tokens} tokens with {len(imgs)} image(s) does "
            f"not fit seq_len {self.seq_len} (or the per-batch image caps) even at the lowest "
            "resolution", source=self.source, file=file,
            location=f"member {first.member} at byte offset {first.offset}",
            reason="bad_image"), oversize=True)

    def _assemble(self, head: list[int], pieces: list[list[int]],
                  imgs: tuple[EncodedImage, ...], sizes: list[tuple[int, int]],
                  plans: list[ImagePlan], file: str, eos: int) -> Document:
        chunks: list[np.ndarray] = [np.array(head, dtype=np.int64)]
        placements = []
        at = len(head)
        for i, piece in enumerate(pieces):
            chunks.append(np.array(piece, dtype=np.int64))
            at += len(piece)
            if i < len(imgs):
                span = self.vision.span(plans[i])
                handle = LazyImage(imgs[i], sizes[i], plans[i], self.processing,
                                   extra_tokens=self.vision.extra, source=self.source,
                                   file=file, max_source_pixels=self.settings.max_source_pixels)
                placements.append(Placement(handle, at, len(span)))
                chunks.append(span)
                at += len(span)
        chunks.append(np.array([eos], dtype=np.int64))
        if not placements:
            return Document(np.concatenate(chunks))
        grids = [plan.grid_thw for plan in plans]
        return Document(np.concatenate(chunks), tuple(placements), {"grids": grids})
