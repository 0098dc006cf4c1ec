"""From records (text + stored images and videos) to documents whose vision tokens are in place.

For each record: the text is cut at the recipe's image and video markers (each marker is the
next image, or video; a kind without markers comes first: images, then videos), the pieces
are tokenized in one batch, each image's header is probed and planned (resized size, grid,
tokens) without decoding, and the layout's placeholder span goes where the image belongs. A
document longer than `seq_len` (or over the per-batch caps) gets the largest lower image
resolution that fits (never below `min_pixels`), else, at the lowest, loses the text after
its last image; if it still does not fit it is rejected as oversize (counted, never an
error). A document whose images alone exceed the per-batch caps is oversize too. Videos are
probed from their container headers alike (`video_decode`) and lowered first: their
per-frame pixel budget, then their frames (`VideoProcessing.lowered`).
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from mixer.config.images import ImageSettings
from mixer.core.document import Document, Placement, Rejected
from mixer.core.errors import DataError, SkipReason
from mixer.core.stages import MEDIA, timed
from mixer.images.decode import probe
from mixer.images.handle import LazyImage
from mixer.images.processing import ImagePlan
from mixer.images.video import LazyVideo, VideoPlan, VideoProcessing, probe_error
from mixer.images.video_decode import VideoInfo, probe_video, video_error
from mixer.sources import EncodedAudio, EncodedImage, EncodedVideo
from mixer.tokenize import Encoder


@dataclass(frozen=True)
class VisionTokens:
    """How a layout writes an image into the token sequence."""

    placeholder: int  # repeated plan.tokens times
    before: tuple[int, ...] = ()  # e.g. <|vision_start|>
    after: tuple[int, ...] = ()  # e.g. <|vision_end|>
    lead: ClassVar[str] = ""  # text the layout writes before the span, tokenized with the text

    @property
    def ids(self) -> tuple[int, ...]:
        return (self.placeholder, *self.before, *self.after)

    @property
    def extra(self) -> int:
        return len(self.before) + len(self.after)

    def span(self, plan: ImagePlan | VideoPlan) -> np.ndarray:
        return np.array(
            [*self.before, *[self.placeholder] * plan.tokens, *self.after], dtype=np.int64
        )

    def length(self, plan: ImagePlan | VideoPlan) -> int:
        """Tokens of `span(plan)`."""
        return plan.tokens + self.extra


class ImageDocuments:
    """The document builder of one source under an image layout."""

    def __init__(
        self,
        *,
        settings: ImageSettings,
        processing,
        encoder: Encoder,
        vision: VisionTokens,
        vision_names: dict[int, str],
        seq_len: int,
        source: str,
        videos: VideoProcessing | None = None,
        video_vision: VisionTokens | None = None,
    ) -> None:
        self.settings = settings
        self.processing = processing
        self.videos = videos
        self.video_vision = video_vision
        self.encoder = encoder
        self.vision = vision
        self.vision_names = vision_names
        self.seq_len = seq_len
        self.source = source
        ids = set(vision.ids) | set(video_vision.ids if video_vision is not None else ())
        self._vision_ids = np.array(sorted(ids), dtype=np.int64)

    # -- one chunk of records ------------------------------------------------------------------
    def build(
        self,
        texts: list[str],
        images: list[tuple[EncodedImage, ...]],
        files: list[str],
        locations: list[str],
    ) -> list[Document | Rejected]:
        """Documents of records (texts, stored images and videos, files, where each text
        lies); a record that cannot be one is `Rejected` with a `DataError` naming its text's
        place (errors about the text) or its image or video member (errors about a medium)."""
        with timed(MEDIA):  # (headers probed and planned; the tokenizer's calls: `encode`)
            return self._build(texts, images, files, locations)

    def _build(
        self,
        texts: list[str],
        images: list[tuple[EncodedImage, ...]],
        files: list[str],
        locations: list[str],
    ) -> list[Document | Rejected]:
        parts: list[tuple[list[str], tuple[EncodedImage, ...]] | Rejected] = []
        for text, media, file, where in zip(texts, images, files, locations):
            clips = [m for m in media if isinstance(m, EncodedAudio)]
            if clips:  # (an image layout has no audio; the `audio:` block's layout has)
                first = clips[0]
                parts.append(
                    self._error(
                        f"the sample has {len(clips)} audio clip(s) but the recipe has no "
                        "`audio:` block (an image layout carries no audio)",
                        file,
                        f"member {first.member} at byte offset {first.offset}",
                        "bad_audio",
                    )
                )
                continue
            videos = [m for m in media if isinstance(m, EncodedVideo)]
            if videos and self.videos is None:
                parts.append(
                    Rejected(
                        video_error(
                            f"the sample has {len(videos)} video(s) but the recipe has no "
                            "images.video block (add one to train on videos)",
                            videos[0],
                            self.source,
                            file,
                        )
                    )
                )
                continue
            pieces, placed = self._split(text, media)
            if isinstance(pieces, str) or isinstance(placed, str):
                reason = placed if isinstance(placed, str) else "bad_image"  # (both are, then)
                parts.append(self._error(str(pieces), file, where, reason))
            else:
                parts.append((self._with_leads(pieces, placed), placed))
        flat = [piece for p in parts if not isinstance(p, Rejected) for piece in p[0]]
        encoded = iter(self.encoder.encode_raw(flat) if flat else [])
        out: list[Document | Rejected] = []
        for p, file, where in zip(parts, files, locations):
            if isinstance(p, Rejected):
                out.append(p)
                continue
            pieces = [next(encoded) for _ in p[0]]
            out.append(self._document(pieces, p[1], file, where))
        return out

    def _split(
        self, text: str, media: tuple[EncodedImage, ...]
    ) -> tuple[list[str], tuple[EncodedImage, ...]] | tuple[str, SkipReason]:
        """(text pieces, media in their order), or (error message, reason). Each kind of
        medium is placed by its markers, one per medium; a kind whose markers the text does
        not hold comes first (images, then videos), before the text."""
        videos = tuple(m for m in media if isinstance(m, EncodedVideo))
        imgs = tuple(m for m in media if not isinstance(m, EncodedVideo))
        marker, video_marker = self.settings.marker, self.settings.video_marker
        count = text.count(marker)
        if count > len(imgs):
            return (
                f"sample without an image where one is required: the text holds {count} "
                f"image marker(s) {marker!r} but the sample has {len(imgs)} image(s)",
                "bad_image",
            )
        if count and count != len(imgs):
            return (
                f"the text holds {count} image marker(s) {marker!r} but the sample has "
                f"{len(imgs)} image(s): each marker stands for one image",
                "bad_image",
            )
        video_count = text.count(video_marker) if self.videos is not None else 0
        if video_count and video_count != len(videos):
            return (
                f"the text holds {video_count} video marker(s) {video_marker!r} but the "
                f"sample has {len(videos)} video(s): each marker stands for one video",
                "bad_video",
            )
        first = (() if count else imgs) + (() if video_count else videos)
        if not count and not video_count:
            return [""] * len(first) + [text], first
        wanted = [m for m, n in ((marker, count), (video_marker, video_count)) if n]
        pieces = re.split("(" + "|".join(map(re.escape, wanted)) + ")", text)
        queues = {marker: iter(imgs), video_marker: iter(videos)}
        placed = tuple(next(queues[m]) for m in pieces[1::2])
        return [""] * len(first) + pieces[0::2], first + placed

    def _with_leads(self, pieces: list[str], media: tuple[EncodedImage, ...]) -> list[str]:
        """The text pieces with each video's `lead` after the piece before it."""
        lead = self.video_vision.lead if self.video_vision is not None else ""
        if not lead:
            return pieces
        return [
            piece + lead if i < len(media) and isinstance(media[i], EncodedVideo) else piece
            for i, piece in enumerate(pieces)
        ]

    def _tokens(self, plan) -> VisionTokens:
        """How the plan's medium is written: the video tokens for a video, else the image's."""
        if isinstance(plan, VideoPlan) and self.video_vision is not None:
            return self.video_vision
        return self.vision

    def _error(
        self, message: str, file: str, where: str, reason: SkipReason = "bad_image"
    ) -> Rejected:
        return Rejected(
            DataError(message, source=self.source, file=file, location=where, reason=reason)
        )

    # -- one record ----------------------------------------------------------------------------
    def _document(
        self, pieces: list[list[int]], media: tuple[EncodedImage, ...], file: str, where: str
    ) -> Document | Rejected:
        for piece in pieces:
            found = np.intersect1d(np.asarray(piece, dtype=np.int64), self._vision_ids)
            if found.size:
                name = self.vision_names[int(found[0])]
                return self._error(
                    f"the text holds the image token {name!r} itself; only the "
                    "image marker may stand for an image",
                    file,
                    where,
                )
        sizes: list = []
        for medium in media:
            try:
                sizes.append(
                    self._video_info(medium, file)
                    if isinstance(medium, EncodedVideo)
                    else self._image_size(medium, file)
                )
            except DataError as exc:
                return Rejected(exc)
        return self._fit(pieces, media, sizes, file)

    def _image_size(self, image: EncodedImage, file: str) -> tuple[int, int]:
        size = probe(
            image, source=self.source, file=file, max_source_pixels=self.settings.max_source_pixels
        )
        try:
            self.processing.plan(*size)
        except ValueError as exc:  # a shape the layout cannot plan (aspect ratio)
            raise DataError(
                f"image of {size[0]}x{size[1]}: {exc}",
                source=self.source,
                file=file,
                location=f"member {image.member} at byte offset {image.offset}",
                reason="bad_image",
            ) from exc
        return size

    def _video_info(self, video: EncodedImage, file: str) -> VideoInfo:
        assert self.videos is not None  # (`build` rejected the sample otherwise)
        info = probe_video(
            video,
            source=self.source,
            file=file,
            max_source_pixels=self.settings.max_source_pixels,
            max_source_frames=self.videos.video.max_source_frames,
        )
        try:
            self.videos.plan(info)
        except ValueError as exc:
            raise probe_error(exc, video, info, self.source, file) from exc
        return info

    def _media_plans(self, sizes: list) -> Iterator[list]:
        """Plans for all media, largest first: the videos lowered (`VideoProcessing.lowered`)
        with the images at their recipe plans, then the images lowered (`_plans`) with the
        videos at their lowest."""
        kinds = [isinstance(size, VideoInfo) for size in sizes]
        image_sizes = [size for size, video in zip(sizes, kinds) if not video]
        infos = [size for size, video in zip(sizes, kinds) if video]

        def merged(image_plans: list, video_plans: list) -> list:
            images, videos = iter(image_plans), iter(video_plans)
            return [next(videos) if video else next(images) for video in kinds]

        image_plans = self._plans(image_sizes)
        base = next(image_plans)
        lowest: list = []
        if infos:
            assert self.videos is not None  # (`build` rejected the sample otherwise)
        for lowest in self.videos.lowered(infos) if self.videos and infos else [[]]:
            yield merged(base, lowest)
        for plans in image_plans:
            yield merged(plans, lowest)

    def _plans(self, sizes: list[tuple[int, int]]) -> Iterator[list[ImagePlan]]:
        """Plans for all images at once, largest first: the recipe's, then at each common
        pixel budget (from max_pixels down to min_pixels) where some image's plan shrinks,
        every image's plan at that budget -- each distinct combination once, so the first
        that fits is the largest resolution that fits. An image never goes below
        min_pixels (nor below its recipe plan, when smart_resize already put that under
        min_pixels): past that it keeps its smallest plan at or above it."""
        base = [self.processing.plan(w, h) for w, h in sizes]
        yield base
        if self.settings.layout == "llava" or not sizes:
            return  # llava: one resolution
        floors = [min(self.settings.min_pixels, plan.width * plan.height) for plan in base]
        steps = [self.processing.lower_steps(i, w, h) for i, (w, h) in enumerate(sizes)]
        current = list(base)
        for _, group in itertools.groupby(heapq.merge(*steps), key=lambda step: step[0]):
            changed = False
            for _, i, _, plan in group:
                if plan.width * plan.height >= floors[i]:
                    current[i], changed = plan, True
            if changed:
                yield list(current)

    def _fits_caps(self, plans: list) -> bool:
        caps = self.settings
        videos = sum(isinstance(p, VideoPlan) for p in plans)
        if caps.max_images_per_batch is not None and (
            len(plans) - videos > caps.max_images_per_batch
        ):
            return False
        if caps.max_videos_per_batch is not None and videos > caps.max_videos_per_batch:
            return False
        patches = sum(p.rows for p in plans)
        return caps.max_patches_per_batch is None or patches <= caps.max_patches_per_batch

    def _fit(
        self, pieces: list[list[int]], media: tuple[EncodedImage, ...], sizes: list, file: str
    ) -> Document | Rejected:
        bos, eos = self.encoder.info.bos_id, self.encoder.info.eos_id
        head = [bos] if bos is not None else []
        if not media:  # text only: packers may cut it like any text document
            return self._assemble(head, pieces, media, sizes, [], file, eos)
        text_tokens = sum(len(p) for p in pieces) + len(head) + 1
        last: list = []
        for plans in self._media_plans(sizes):
            last = plans
            media_tokens = sum(self._tokens(p).length(p) for p in plans)
            if self._fits_caps(plans) and text_tokens + media_tokens <= self.seq_len:
                return self._assemble(head, pieces, media, sizes, plans, file, eos)
        media_tokens = sum(self._tokens(p).length(p) for p in last)
        through_last = text_tokens - len(pieces[-1]) - 1 + media_tokens
        if self._fits_caps(last) and through_last <= self.seq_len:
            # Cut the text after the last medium (no EOS then: the document is truncated).
            document = self._assemble(head, pieces, media, sizes, last, file, eos)
            return Document(document.tokens[: self.seq_len], document.images, document.meta)
        first = media[0]
        videos = sum(isinstance(m, EncodedVideo) for m in media)
        what = f"{len(media) - videos} image(s)" + (f" and {videos} video(s)" if videos else "")
        return Rejected(
            DataError(
                f"document of {text_tokens + media_tokens} tokens with {what} does "
                f"not fit seq_len {self.seq_len} (or the per-batch image caps) even at the lowest "
                "resolution",
                source=self.source,
                file=file,
                location=f"member {first.member} at byte offset {first.offset}",
                reason="bad_video" if videos else "bad_image",
            ),
            oversize=True,
        )

    def _handle(self, medium: EncodedImage, size, plan, file: str) -> LazyImage | LazyVideo:
        if isinstance(plan, VideoPlan):
            assert self.videos is not None  # (a video plan is made only with video settings)
            return LazyVideo(
                medium,
                size,
                plan,
                self.videos,
                extra_tokens=self._tokens(plan).length(plan) - plan.tokens,
                source=self.source,
                file=file,
            )
        return LazyImage(
            medium,
            size,
            plan,
            self.processing,
            extra_tokens=self._tokens(plan).length(plan) - plan.tokens,
            source=self.source,
            file=file,
            max_source_pixels=self.settings.max_source_pixels,
        )

    def _assemble(
        self,
        head: list[int],
        pieces: list[list[int]],
        media: tuple[EncodedImage, ...],
        sizes: list,
        plans: list,
        file: str,
        eos: int,
    ) -> Document:
        chunks: list[np.ndarray] = [np.array(head, dtype=np.int64)]
        placements = []
        at = len(head)
        for i, piece in enumerate(pieces):
            chunks.append(np.array(piece, dtype=np.int64))
            at += len(piece)
            if i < len(media):
                span = self._tokens(plans[i]).span(plans[i])
                handle = self._handle(media[i], sizes[i], plans[i], file)
                placements.append(Placement(handle, at, len(span)))
                chunks.append(span)
                at += len(span)
        chunks.append(np.array([eos], dtype=np.int64))
        if not placements:
            return Document(np.concatenate(chunks))
        grids = [plan.grid_thw for plan in plans]
        return Document(np.concatenate(chunks), tuple(placements), {"grids": grids})
