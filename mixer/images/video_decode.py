"""Stored video bytes (PyAV): their header facts, and the RGB frames at chosen indices.

`probe_video` opens the container from memory and reads its first video stream's size,
frame rate and frame count: the count the container declares, else (mkv and webm often
declare 0) the stream's packets counted by demuxing, never by decoding. A header over
`max_source_pixels` per frame or `max_source_frames` is refused before any frame is decoded.

`decode_frames` decodes only the frames asked for, in order: it demuxes the packets once to
learn each frame's presentation timestamp and the keyframes, then for each wanted frame
seeks to the keyframe before it (unless the decoder already stands between that keyframe and
the frame) and decodes forward to it. Each frame is handed to `keep` as soon as it is decoded
(the caller resizes it), so memory holds a few frames, whatever the video's length. Frames
are converted to rgb24 by FFmpeg's swscale, as PyAV's `to_ndarray(format="rgb24")` does.

Every failure (no video stream, truncated or undecodable bytes, a codec FFmpeg lacks, zero
frames) is a `DataError` with reason `bad_video` naming source, file, member and offset.
PyAV (`av`, the optional extra `video`) is imported on first use.
"""

from __future__ import annotations

import bisect
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mixer.core.errors import DataError
from mixer.core.records import EncodedImage


@dataclass(frozen=True)
class VideoInfo:
    """What a video's header says: frame size, frames, and the container's frame rate."""

    width: int
    height: int
    frames: int
    fps: float


def where(encoded: EncodedImage) -> str:
    """The location part of a video's errors: its member and the member's byte offset."""
    return f"member {encoded.member} at byte offset {encoded.offset}"


def video_error(message: str, encoded: EncodedImage, source: str, file: str) -> DataError:
    return DataError(message, source=source, file=file, location=where(encoded), reason="bad_video")


def _av() -> Any:
    import av  # (the optional extra `video`; checked when the recipe is validated)

    return av


def _errors() -> tuple[type[BaseException], ...]:
    av = _av()
    return (av.FFmpegError, ValueError, IndexError, EOFError, OSError, StopIteration)


def _open(encoded: EncodedImage) -> tuple[Any, Any]:
    """The container and its first video stream (IndexError when it has none)."""
    container = _av().open(io.BytesIO(encoded.data), mode="r")
    try:
        return container, container.streams.video[0]
    except BaseException:
        container.close()
        raise


def probe_video(
    encoded: EncodedImage, *, source: str, file: str, max_source_pixels: int, max_source_frames: int
) -> VideoInfo:
    """The header facts of a stored video (see the module docstring); `DataError` when the
    bytes are no video, it has no frames, or it is over the recipe's limits."""
    if not encoded.data:
        raise video_error("empty video (0 bytes)", encoded, source, file)
    try:
        container, stream = _open(encoded)
        with container:
            width, height = stream.codec_context.width, stream.codec_context.height
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            frames = stream.frames or sum(
                1 for packet in container.demux(stream) if packet.size and packet.pts is not None
            )
    except _errors() as exc:
        raise video_error(f"cannot read the video: {exc}", encoded, source, file) from exc
    if width <= 0 or height <= 0:
        raise video_error(f"video of size {width}x{height} has no pixels", encoded, source, file)
    if width * height > max_source_pixels:
        raise video_error(
            f"video frames of {width}x{height} = {width * height:,} pixels are "
            f"more than images.max_source_pixels ({max_source_pixels:,})",
            encoded,
            source,
            file,
        )
    if frames <= 0:
        raise video_error("video without frames", encoded, source, file)
    if frames > max_source_frames:
        raise video_error(
            f"video of {frames:,} frames is longer than "
            f"images.video.max_source_frames ({max_source_frames:,})",
            encoded,
            source,
            file,
        )
    if not rate or float(rate) <= 0:
        raise video_error("video without a frame rate", encoded, source, file)
    return VideoInfo(width, height, frames, float(rate))


def _timeline(container: Any, stream: Any) -> tuple[list[int], list[int]]:
    """Presentation timestamps of the stream's frames in order, and those of its keyframes."""
    pts, keys = [], []
    for packet in container.demux(stream):
        if packet.size and packet.pts is not None:
            pts.append(packet.pts)
            if packet.is_keyframe:
                keys.append(packet.pts)
    pts.sort()
    keys.sort()
    return pts, keys


def _seeking(
    container: Any, stream: Any, wanted: list[int], keep: Callable[[int, np.ndarray], None]
) -> bool:
    """Decode the `wanted` frame indices (ascending) by seeking; False when the timeline does
    not allow it (the caller then decodes from the start)."""
    pts, keys = _timeline(container, stream)
    if not keys or len(pts) <= wanted[-1]:
        return False
    frames = None
    last = None  # pts of the last frame decoded since the last seek
    for i, index in enumerate(wanted):
        target = pts[index]
        k = bisect.bisect_right(keys, target) - 1
        key = keys[max(k, 0)]
        if frames is None or last is None or key > last or last >= target:
            container.seek(key, stream=stream, backward=True)
            frames, last = container.decode(stream), None
        for frame in frames:
            if frame.pts is None:
                return False
            last = frame.pts
            if last >= target:
                break
        if last != target:
            return False
        keep(i, frame.to_ndarray(format="rgb24"))
    return True


def decode_frames(
    encoded: EncodedImage,
    indices: list[int],
    keep: Callable[[int, np.ndarray], None],
    *,
    source: str,
    file: str,
) -> None:
    """Decode the frames at `indices` (ascending, presentation order) and hand each to
    `keep(i, rgb)` (i: its place in `indices`; rgb: (height, width, 3) uint8)."""
    try:
        container, stream = _open(encoded)
        with container:
            if _seeking(container, stream, indices, keep):
                return
        container, stream = _open(encoded)
        with container:  # no usable timestamps: decode from the start, keeping the wanted
            at = 0
            for n, frame in enumerate(container.decode(stream)):
                if n == indices[at]:
                    keep(at, frame.to_ndarray(format="rgb24"))
                    at += 1
                    if at == len(indices):
                        return
    except _errors() as exc:
        raise video_error(f"cannot decode the video: {exc}", encoded, source, file) from exc
    raise video_error(
        f"the video ends before frame {indices[at]} (its header declared more)",
        encoded,
        source,
        file,
    )
