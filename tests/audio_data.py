"""Audio+text test data: real clips (espeak-ng speech, generated tones) in WebDataset tars.

Speech comes from `espeak-ng` (22.05 kHz mono WAV) where it is installed, else from a
speech-like signal made with numpy (a voiced source at a gliding pitch through two moving
formants, syllable envelopes). Tones are numpy sines. Clips are encoded with Python's `wave`
(16-bit PCM) or PyAV (FLAC, MP3, Ogg Vorbis, Ogg Opus); `pcm_waveform` gives the exact float
waveform any decoder returns for a 16-bit PCM file.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import wave
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
from helpers import doc_text

AUDIO_TOKENS = ("<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>")
HAS_ESPEAK = shutil.which("espeak-ng") is not None
# suffix -> (container format, codec, options)
CODECS = {
    "flac": ("flac", "flac", {}),
    "mp3": ("mp3", "libmp3lame", {}),
    "ogg": ("ogg", "vorbis", {"strict": "-2"}),  # FFmpeg's own encoder: stereo only
    "opus": ("ogg", "libopus", {}),
}


def tone(seconds: float, rate: int = 16000, freq: float = 440.0, amp: float = 0.3) -> np.ndarray:
    """A sine with a short fade in and out, quantized to 16-bit levels (float32)."""
    t = np.arange(int(round(seconds * rate))) / rate
    fade = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.01) if len(t) > 1 else np.ones(len(t))
    x = amp * np.sin(2 * np.pi * freq * t) * fade
    return (np.round(x * 32767) / 32768).astype(np.float32)


def _synthetic_speech(seed: int, rate: int, seconds: float = 1.6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    pitch = 110 + 30 * np.sin(2 * np.pi * 0.7 * t + seed)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    source = sum(np.sin(k * phase) / k for k in range(1, 20))
    f1 = 500 + 200 * np.sin(2 * np.pi * 2.1 * t)
    f2 = 1500 + 500 * np.sin(2 * np.pi * 1.3 * t + 1)
    carrier = np.sin(2 * np.pi * np.cumsum(f1) / rate) + 0.5 * np.sin(
        2 * np.pi * np.cumsum(f2) / rate
    )
    envelope = np.clip(np.sin(2 * np.pi * 3.0 * t + rng.random()), 0, None) ** 2
    x = 0.2 * source * (0.6 + 0.4 * carrier) * envelope / 3
    return (np.round(np.clip(x, -1, 1) * 32767) / 32768).astype(np.float32)


def speech(text: str, seed: int = 0) -> tuple[np.ndarray, int]:
    """(waveform float32, rate) of `text` spoken by espeak-ng (or its numpy stand-in)."""
    if not HAS_ESPEAK:
        return _synthetic_speech(seed, 22050), 22050
    wav = subprocess.run(
        ["espeak-ng", "--stdout", "-s", "190", text], check=True, capture_output=True
    ).stdout
    with wave.open(io.BytesIO(_fix_stream_header(wav))) as w:
        rate = w.getframerate()
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return (data.astype(np.float32) / 32768).astype(np.float32), rate


def _fix_stream_header(wav: bytes) -> bytes:
    """espeak-ng writes sizes of 0x7fffffff to stdout (it cannot seek back): set the real ones."""
    data = bytearray(wav)
    at = data.find(b"data")
    size = len(data) - at - 8
    data[4:8] = (len(data) - 8).to_bytes(4, "little")
    data[at + 4 : at + 8] = size.to_bytes(4, "little")
    return bytes(data)


def pcm_waveform(x: np.ndarray) -> np.ndarray:
    """What a decoder gives for `x` written as 16-bit PCM: its levels / 32768."""
    return (np.clip(np.round(x * 32768), -32768, 32767).astype(np.int16) / 32768).astype(np.float32)


def encode_wav(x: np.ndarray, rate: int, channels: int = 1) -> bytes:
    """16-bit PCM WAV of `x` ((n,) or (channels, n))."""
    levels = np.clip(np.round(np.atleast_2d(x) * 32768), -32768, 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(levels.shape[0])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(levels.T.tobytes())
    return out.getvalue()


def encode(x: np.ndarray, rate: int, suffix: str) -> bytes:
    """`x` (float32 mono) encoded as a `suffix` file (wav, flac, mp3, ogg, opus)."""
    if suffix == "wav":
        return encode_wav(x, rate)
    fmt, codec, options = CODECS[suffix]
    if codec == "libopus" and rate not in (8000, 12000, 16000, 24000, 48000):
        raise ValueError(f"opus does not take {rate} Hz")
    layout = "stereo" if codec == "vorbis" else "mono"
    planes = np.repeat(x[None], 2 if layout == "stereo" else 1, axis=0)
    out = io.BytesIO()
    with av.open(out, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        stream.codec_context.options = dict(options)
        step = stream.codec_context.frame_size or 4096
        for at in range(0, len(x), step):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(planes[:, at : at + step], dtype=np.float32),
                format="fltp",
                layout=layout,
            )
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def declare_flac_samples(data: bytes, samples: int) -> bytes:
    """A FLAC whose STREAMINFO declares `samples` (the frames stay those of `data`)."""
    out = bytearray(data)
    assert out[:4] == b"fLaC"
    body = 8  # "fLaC" and the metadata block header
    value = int.from_bytes(out[body + 10 : body + 18], "big")
    value = (value & ~((1 << 36) - 1)) | samples
    out[body + 10 : body + 18] = value.to_bytes(8, "big")
    return bytes(out)


@dataclass
class Clip:
    data: bytes
    suffix: str


@dataclass
class Sample:
    doc: int
    length: int  # words of caption
    clips: list[Clip] = field(default_factory=list)
    marker: bool = False  # "<audio>" markers in the caption, one per clip, between words
    text: str | None = None  # the caption as given

    def caption(self) -> str:
        if self.text is not None:
            return self.text
        words = doc_text(self.doc, self.length).split()
        if not self.marker:
            return " ".join(words)
        out = []
        for i, word in enumerate(words):
            if i < len(self.clips):
                out.append("<audio>")
            out.append(word)
        return " ".join(out + ["<audio>"] * max(0, len(self.clips) - len(words)))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 0
    tar.addfile(info, io.BytesIO(data))


def write_tar(path: Path, samples: list[Sample]) -> Path:
    """One WebDataset shard: `<key>.<ext>` (or `<key>.<n>.<ext>`) per clip, `<key>.txt`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for s in samples:
            key = f"s{s.doc:06d}"
            for i, clip in enumerate(s.clips):
                name = f"{key}.{clip.suffix}" if len(s.clips) == 1 else f"{key}.{i}.{clip.suffix}"
                _add(tar, name, clip.data)
            _add(tar, f"{key}.txt", s.caption().encode())
    return path
