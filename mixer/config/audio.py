"""The recipe's `audio:` block: how audio members become log-mel features and sequence tokens.

The feature values are those of transformers' `WhisperFeatureExtractor(feature_size=128)` as
`Qwen2AudioProcessor` calls it (16 kHz mono, 25 ms windows every 10 ms, every clip padded to
30 s); those are the model's, not the recipe's, so they are constants here.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import Field, model_validator

from mixer.config.fields import Float, Int, _Frozen

SAMPLING_RATE = 16000
N_MELS = 128
N_FFT = 400
HOP_LENGTH = 160
CHUNK_SECONDS = 30
CHUNK_SAMPLES = CHUNK_SECONDS * SAMPLING_RATE  # 480000
N_FRAMES = CHUNK_SAMPLES // HOP_LENGTH  # 3000: the frames of every clip's input_features


class AudioSettings(_Frozen):
    """The `audio:` block (docs/recipes.md, docs/audio.md)."""

    layout: Literal["qwen2_audio"] = Field(description="Batch layout and audio tokens.")
    marker: str = Field(
        default="<audio>",
        min_length=1,
        description="Where the text holds it, each marker is the next clip; without markers "
        "the clips come first.",
    )
    long_clips: Literal["cut", "refuse"] = Field(
        default="cut",
        description="A clip over 30 s: cut to its first 30 s (as the processor does), or "
        "refused as bad_audio.",
    )
    max_audio_per_batch: Int | None = Field(
        default=None, ge=1, description="Cap on clips per rank batch (null: none)."
    )
    max_source_seconds: Float = Field(
        default=3600.0,
        gt=0,
        le=1 << 24,
        description="A stored clip whose header declares more seconds is refused (bad_audio).",
    )

    @model_validator(mode="after")
    def _decoder(self) -> AudioSettings:
        if importlib.util.find_spec("av") is None:
            raise ValueError(
                "decoding audio needs PyAV, the optional extra 'video': "
                "pip install 'mixer[video]' (or pip install av)"
            )
        return self
