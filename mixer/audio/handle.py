"""AudioPlan and LazyAudio: a document's clip, its cost known once decoded, its features made
on demand.

A clip's tokens depend on its exact sample count at 16 kHz, which only decoding gives (mp3 and
ogg headers estimate durations), so the document builder decodes each clip once to plan it
and keeps only the plan; the features are made when a batch needs them, or earlier on the
image pool after `prefetch()`, under the same per-process budget as pixels (`LazyImage`,
`mixer.images.handle`): the clip is decoded again there and its log-mel computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from mixer.audio.decode import audio_error, decode_clip
from mixer.audio.features import audio_tokens, feature_frames, log_mel
from mixer.config.audio import CHUNK_SAMPLES, N_FRAMES, N_MELS, SAMPLING_RATE, AudioSettings
from mixer.core.document import MediaKind
from mixer.core.records import EncodedImage
from mixer.images.handle import LazyImage


@dataclass(frozen=True)
class AudioPlan:
    """What a clip becomes: its samples at 16 kHz (after the 30 s cut), mask frames, tokens."""

    samples: int
    frames: int  # ones in its feature_attention_mask row
    tokens: int  # <|AUDIO|> placeholders
    cut: bool = False  # the stored clip is longer than 30 s and was cut
    rows: int = 1  # one input_features entry: the encoder's cost is the same for every clip

    @classmethod
    def of(cls, samples: int, cut: bool = False) -> AudioPlan:
        frames = feature_frames(samples)
        return cls(samples, frames, audio_tokens(frames), cut)

    @property
    def seconds(self) -> float:
        return self.samples / SAMPLING_RATE


class AudioProcessing:
    """Decoding and features of clips under the recipe's `audio:` block."""

    row_shape: tuple[int, ...] = (N_MELS, N_FRAMES)

    def __init__(self, settings: AudioSettings) -> None:
        self.settings = settings

    def samples(self, encoded: EncodedImage, source: str, file: str) -> tuple[np.ndarray, bool]:
        """The clip's samples as its features use them (its first 30 s at 16 kHz, mono) and
        whether it was cut; `DataError` (bad_audio) for a clip that is no clip, or over 30 s
        under `long_clips: refuse`."""
        samples, longer = decode_clip(
            encoded,
            source=source,
            file=file,
            max_source_seconds=self.settings.max_source_seconds,
            limit=CHUNK_SAMPLES,
        )
        if longer and self.settings.long_clips == "refuse":
            raise audio_error(
                "the clip is longer than 30 s (audio.long_clips: refuse; `cut` keeps its "
                "first 30 s, as Qwen2AudioProcessor does)",
                encoded,
                source,
                file,
            )
        return samples, longer

    def plan(self, encoded: EncodedImage, source: str, file: str) -> AudioPlan:
        samples, cut = self.samples(encoded, source, file)
        return AudioPlan.of(len(samples), cut)

    def empty_features(self) -> np.ndarray:
        return np.zeros((0, *self.row_shape), dtype=np.float32)


class LazyAudio(LazyImage):
    """A clip of a document: a `LazyImage` whose pixels are its (128, 3000) log-mel features."""

    kind: MediaKind = "audio"

    def __init__(
        self,
        encoded: EncodedImage,
        plan: AudioPlan,
        processing: AudioProcessing,
        extra_tokens: int,
        source: str,
        file: str,
    ) -> None:
        super().__init__(
            encoded,
            (plan.samples, 1),
            cast(Any, plan),  # (a LazyImage's plan and processing, as far as it uses them)
            cast(Any, processing),
            extra_tokens=extra_tokens,
            source=source,
            file=file,
            max_source_pixels=0,
        )
        self.clip_plan = plan
        self.audio = processing

    def _make(self) -> np.ndarray:  # (timed as `media` by LazyImage._compute)
        plan, processing = self.clip_plan, self.audio
        samples, _ = processing.samples(self.encoded, self.source, self.file)
        if len(samples) != plan.samples:
            raise audio_error(
                f"decoded {len(samples)} samples, not the {plan.samples} of the first decoding",
                self.encoded,
                self.source,
                self.file,
            )
        return log_mel(samples)

    def __repr__(self) -> str:
        plan = self.clip_plan
        return f"LazyAudio({self.encoded.member!r}, {plan.seconds:.2f} s, {self.tokens} tokens)"
