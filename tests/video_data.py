"""Video+text test data: small real videos written with PyAV, in WebDataset tars.

Frame f of video (doc, index) is seeded noise over a gradient, so every frame differs and the
lossless codecs (libx264rgb qp=0 in mp4, ffv1 in mkv) give it back bit for bit; yuv420p h264
and vp9/webm are lossy (their decoded frames come from PyAV itself).
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
from helpers import doc_text

VIDEO_TOKEN = "<|video_pad|>"
# codec -> (container format, pixel format, options, member suffix)
CODECS = {
    "libx264rgb": ("mp4", "rgb24", {"qp": "0"}, "mp4"),
    "ffv1": ("matroska", "bgr0", {}, "mkv"),
    "libx264": ("mp4", "yuv420p", {}, "mp4"),
    "libvpx-vp9": ("webm", "yuv420p", {"deadline": "realtime", "cpu-used": "8"}, "webm"),
}


def frame(doc: int, index: int, f: int, width: int, height: int) -> np.ndarray:
    rng = np.random.default_rng([doc, index, f])
    ramp = np.add.outer(np.arange(height) * 3, np.arange(width) * 2)[..., None] + f * 7
    noise = rng.integers(0, 64, (height, width, 3))
    return ((ramp + noise) % 256).astype(np.uint8)


def encode_video(
    frames: list[np.ndarray], codec: str = "libx264rgb", rate: int = 10, gop: int = 6
) -> bytes:
    fmt, pix, options, _ = CODECS[codec]
    height, width = frames[0].shape[:2]
    out = io.BytesIO()
    with av.open(out, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, pix
        stream.gop_size = gop
        stream.options = dict(options)
        for rgb in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def decoded(data: bytes) -> tuple[np.ndarray, float]:
    """All frames of a video decoded by PyAV (rgb24), and its container frame rate."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        rate = float(stream.average_rate)
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)]), rate


@dataclass
class Clip:
    """A video of a sample: its size, frame count, rate and codec."""

    width: int = 32
    height: int = 32
    frames: int = 12
    rate: int = 10
    codec: str = "libx264rgb"

    def data(self, doc: int, index: int) -> bytes:
        return encode_video(
            [frame(doc, index, f, self.width, self.height) for f in range(self.frames)],
            self.codec,
            self.rate,
        )


@dataclass
class VideoSample:
    doc: int
    length: int
    clips: list[Clip] = field(default_factory=list)
    marker: bool = False  # "<video>" markers spread through the caption
    text: str | None = None  # the caption as given (instead of the words and markers)

    def caption(self) -> str:
        if self.text is not None:
            return self.text
        words = doc_text(self.doc, self.length).split()
        if not self.marker:
            return " ".join(words)
        out = []
        for i, word in enumerate(words):
            if i < len(self.clips):
                out.append("<video>")
            out.append(word)
        return " ".join(out + ["<video>"] * max(0, len(self.clips) - len(words)))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def write_video_tar(path: Path, samples: list[VideoSample]) -> Path:
    """One WebDataset shard: `<key>.txt` plus `<key>.<ext>` / `<key>.<n>.<ext>` videos."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for s in samples:
            key = f"s{s.doc:06d}"
            for i, clip in enumerate(s.clips):
                ext = CODECS[clip.codec][3]
                _add(
                    tar,
                    f"{key}.{ext}" if len(s.clips) == 1 else f"{key}.{i}.{ext}",
                    clip.data(s.doc, i),
                )
            _add(tar, f"{key}.txt", s.caption().encode())
    return path
