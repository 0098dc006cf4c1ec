"""Stored audio bytes (PyAV): the clip as 16 kHz mono float32 samples.

`decode_clip` opens the container from memory, takes its first audio stream, refuses a clip
whose header declares more than `max_source_seconds` before decoding anything, and decodes it
in order: every frame is converted to float planar samples at 16 kHz by FFmpeg's swresample
(no conversion of the rate where it already is 16 kHz, so a 16-bit PCM file's samples are
exactly `int16 / 32768`), and channels are averaged into mono (librosa's `to_mono`). Decoding
stops once the samples reach `limit`: a clip is never held longer than its use.

Every failure (no audio stream, truncated or undecodable bytes, a codec FFmpeg lacks, no
samples) is a `DataError` with reason `bad_audio` naming source, file, member and offset.
PyAV (`av`, the optional extra `video`) is imported on first use.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from mixer.config.audio import SAMPLING_RATE
from mixer.core.errors import DataError
from mixer.core.records import EncodedImage


def where(encoded: EncodedImage) -> str:
    """The location part of a clip's errors: its member and the member's byte offset."""
    return f"member {encoded.member} at byte offset {encoded.offset}"


def audio_error(message: str, encoded: EncodedImage, source: str, file: str) -> DataError:
    return DataError(message, source=source, file=file, location=where(encoded), reason="bad_audio")


def _av() -> Any:
    import av  # (the optional extra `video`; checked when the recipe is validated)

    return av


def _errors() -> tuple[type[BaseException], ...]:
    av = _av()
    return (av.FFmpegError, ValueError, IndexError, EOFError, OSError, StopIteration)


def declared_seconds(container: Any, stream: Any) -> float | None:
    """The clip's duration as its header declares it (None when it declares none)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # (AV_TIME_BASE)
    return None


def decode_clip(
    encoded: EncodedImage, *, source: str, file: str, max_source_seconds: float, limit: int
) -> tuple[np.ndarray, bool]:
    """(samples, longer): the clip's first `limit` samples at 16 kHz mono (float32), and
    whether it has more than that. `DataError` (bad_audio) for bytes that are no clip, a
    header declaring more than `max_source_seconds`, or no samples at all."""
    if not encoded.data:
        raise audio_error("empty audio (0 bytes)", encoded, source, file)
    av = _av()
    try:
        container = av.open(io.BytesIO(encoded.data), mode="r")
    except _errors() as exc:
        raise audio_error(f"not a readable audio file: {exc}", encoded, source, file) from exc
    try:
        if not container.streams.audio:
            raise audio_error("the file has no audio stream", encoded, source, file)
        stream = container.streams.audio[0]
        seconds = declared_seconds(container, stream)
        if seconds is not None and seconds > max_source_seconds:
            raise audio_error(
                f"a clip of {seconds:.1f} s (as its header declares) is longer than "
                f"audio.max_source_seconds ({max_source_seconds:g})",
                encoded,
                source,
                file,
            )
        parts, longer = _decode(container, stream, limit)
    except _errors() as exc:
        raise audio_error(f"undecodable audio: {exc}", encoded, source, file) from exc
    finally:
        container.close()
    samples = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    if not samples.size:
        raise audio_error("the clip has no audio samples", encoded, source, file)
    return samples, longer


def _decode(container: Any, stream: Any, limit: int) -> tuple[list[np.ndarray], bool]:
    av = _av()
    resampler = None
    parts: list[np.ndarray] = []
    total = 0

    def keep(frames: list[Any]) -> bool:  # True once past the limit
        nonlocal total
        for frame in frames:
            planes = frame.to_ndarray()  # (channels, n) float32, planar
            parts.append(planes[0] if len(planes) == 1 else planes.mean(axis=0, dtype=np.float32))
            total += planes.shape[1]
        return total > limit

    for frame in container.decode(stream):
        if resampler is None:
            resampler = av.AudioResampler(format="fltp", layout=frame.layout, rate=SAMPLING_RATE)
        if keep(resampler.resample(frame)):
            return _trimmed(parts, limit), True
    if resampler is not None and keep(resampler.resample(None)):
        return _trimmed(parts, limit), True
    return parts, False


def _trimmed(parts: list[np.ndarray], limit: int) -> list[np.ndarray]:
    """The first `limit` samples of `parts` (the last part was cut to the limit already)."""
    out, count = [], 0
    for part in parts:
        if count >= limit:
            break
        out.append(part[: limit - count])
        count += len(out[-1])
    return out
