"""From records (text + stored audio clips) to documents whose audio tokens are in place.

For each record: the text is cut at the recipe's audio marker (each marker is the next clip;
without markers the clips come first, before the text), the pieces are tokenized in one
batch, each clip is decoded once to learn its exact length at 16 kHz (`AudioProcessing.plan`),
and `<|audio_bos|>`, the clip's `<|AUDIO|>` placeholders and `<|audio_eos|>` go where the
clip belongs. A document longer than `seq_len` loses the text after its last clip (no EOS
then); one that still does not fit, or holds more clips than `max_audio_per_batch`, is
rejected as oversize (counted, never an error). A clip's placeholders are as many as
Qwen2AudioProcessor writes for it; its encoder cost (one 30 s input_features entry) is the
same for every clip, so `max_audio_per_batch` is the per-batch budget of it.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from mixer.audio.handle import AudioPlan, AudioProcessing, LazyAudio
from mixer.config.audio import AudioSettings
from mixer.core.document import Document, Placement, Rejected
from mixer.core.errors import DataError, SkipReason, bad_media
from mixer.core.records import EncodedAudio, EncodedImage, EncodedVideo
from mixer.images.documents import VisionTokens
from mixer.tokenize import Encoder


class AudioDocuments:
    """The document builder of one source under the audio layout."""

    def __init__(
        self,
        *,
        settings: AudioSettings,
        processing: AudioProcessing,
        encoder: Encoder,
        tokens: VisionTokens,
        token_names: dict[int, str],
        seq_len: int,
        source: str,
    ) -> None:
        self.settings = settings
        self.processing = processing
        self.encoder = encoder
        self.tokens = tokens
        self.token_names = token_names
        self.seq_len = seq_len
        self.source = source
        self._audio_ids = np.array(sorted(token_names), dtype=np.int64)

    def build(
        self,
        texts: list[str],
        images: list[tuple[EncodedImage, ...]],
        files: list[str],
        locations: list[str],
    ) -> list[Document | Rejected]:
        """Documents of records (texts, stored clips, files, where each text lies); a record
        that cannot be one is `Rejected` with a `DataError` naming its text's place (errors
        about the text) or its clip's member (errors about a clip)."""
        parts: list[tuple[list[str], tuple[EncodedImage, ...]] | Rejected] = []
        for text, media, file, where in zip(texts, images, files, locations):
            parts.append(self._split(text, media, file, where))
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
        self, text: str, media: tuple[EncodedImage, ...], file: str, where: str
    ) -> tuple[list[str], tuple[EncodedImage, ...]] | Rejected:
        others = [m for m in media if not isinstance(m, EncodedAudio)]
        if others:
            what = "video" if isinstance(others[0], EncodedVideo) else "image"
            return self._error(
                f"the sample has {len(others)} {what}(s) but the recipe's audio layout "
                "carries no pixels (an `images:` block does)",
                file,
                f"member {others[0].member} at byte offset {others[0].offset}",
                bad_media(what),
            )
        marker = self.settings.marker
        count = text.count(marker)
        if count and count != len(media):
            return self._error(
                f"the text holds {count} audio marker(s) {marker!r} but the sample has "
                f"{len(media)} clip(s): each marker stands for one clip",
                file,
                where,
            )
        if not count:
            return [""] * len(media) + [text], media
        return text.split(marker), media

    def _error(
        self, message: str, file: str, where: str, reason: SkipReason = "bad_audio"
    ) -> Rejected:
        return Rejected(
            DataError(message, source=self.source, file=file, location=where, reason=reason)
        )

    def _document(
        self, pieces: list[list[int]], clips: tuple[EncodedImage, ...], file: str, where: str
    ) -> Document | Rejected:
        for piece in pieces:
            found = np.intersect1d(np.asarray(piece, dtype=np.int64), self._audio_ids)
            if found.size:
                name = self.token_names[int(found[0])]
                return self._error(
                    f"the text holds the audio token {name!r} itself; only the audio "
                    "marker may stand for a clip",
                    file,
                    where,
                )
        try:
            plans = [self.processing.plan(clip, self.source, file) for clip in clips]
        except DataError as exc:
            return Rejected(exc)
        return self._fit(pieces, clips, plans, file)

    def _fit(
        self,
        pieces: list[list[int]],
        clips: tuple[EncodedImage, ...],
        plans: list[AudioPlan],
        file: str,
    ) -> Document | Rejected:
        bos, eos = self.encoder.info.bos_id, self.encoder.info.eos_id
        head = [bos] if bos is not None else []
        document = self._assemble(head, pieces, clips, plans, file, eos)
        if not clips:
            return document
        cap = self.settings.max_audio_per_batch
        if cap is None or len(clips) <= cap:
            if len(document) <= self.seq_len:
                return document
            through_last = len(document) - len(pieces[-1]) - 1
            if through_last <= self.seq_len:  # the text after the last clip is cut (no EOS)
                return Document(document.tokens[: self.seq_len], document.images, document.meta)
        first = clips[0]
        return Rejected(
            DataError(
                f"document of {len(document)} tokens with {len(clips)} audio clip(s) does not "
                f"fit seq_len {self.seq_len} (or audio.max_audio_per_batch)",
                source=self.source,
                file=file,
                location=f"member {first.member} at byte offset {first.offset}",
                reason="bad_audio",
            ),
            oversize=True,
        )

    def _assemble(
        self,
        head: list[int],
        pieces: list[list[int]],
        clips: tuple[EncodedImage, ...],
        plans: list[AudioPlan],
        file: str,
        eos: int,
    ) -> Document:
        chunks: list[np.ndarray] = [np.array(head, dtype=np.int64)]
        placements = []
        at = len(head)
        for i, piece in enumerate(pieces):
            chunks.append(np.array(piece, dtype=np.int64))
            at += len(piece)
            if i < len(clips):
                span = self.tokens.span(cast(Any, plans[i]))  # (it reads `tokens` alone)
                handle = LazyAudio(
                    clips[i],
                    plans[i],
                    self.processing,
                    extra_tokens=self.tokens.extra,
                    source=self.source,
                    file=file,
                )
                placements.append(Placement(handle, at, len(span)))
                chunks.append(span)
                at += len(span)
        chunks.append(np.array([eos], dtype=np.int64))
        return Document(np.concatenate(chunks), tuple(placements))
