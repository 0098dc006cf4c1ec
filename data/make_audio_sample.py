"""Generate the bundled audio+text sample (data/sample/audio) and data/tokenizer_audio.json.

Run from the repo root: `python data/make_audio_sample.py` (needs PyAV, the `video` extra).
Every clip is made here with numpy from a seeded generator (a steady tone, a chord, a rising
or falling sweep, a few notes in a row, or a hummed vowel: a buzz at a gliding pitch through
two formants), encoded with PyAV, and its caption is written from what was made, so the data
has no license beyond this repository's. The outputs are committed; users never need to run
this.

The corpus is WebDataset: 2 tar shards of 6 samples. A sample is `<key>.<ext>` (or
`<key>.0.<ext>`, `<key>.1.<ext>` for two clips) and `<key>.txt` (the caption; `<audio>` marks
a clip's place where the caption has markers). Clips are 0.6 to 2.5 seconds (FLAC at most
0.8, WAV 0.6) in five encodings: 16 kHz FLAC (decoded exactly, no resampling), 8 kHz WAV,
22.05 kHz MP3, 22.05 kHz stereo Ogg Vorbis and 48 kHz Ogg Opus (all resampled to 16 kHz mono
by the loader). Encoders and muxers run bit-exact (no random Ogg serial numbers), so the
script makes the same bytes on every run.

`data/tokenizer_audio.json` is a byte-level BPE of 1,024 tokens trained on the captions and
the bundled prose (data/sample/prose), with the special tokens `<|endoftext|>`, `<pad>` and
Qwen2-Audio's `<|audio_bos|>`, `<|AUDIO|>`, `<|audio_eos|>`: small enough to bundle.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import av
import numpy as np
import zstandard
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).parent
OUT = HERE / "sample" / "audio"
SEED = 20261207
SHARDS, PER_SHARD = 2, 6
NOTES = {"C": 261.63, "D": 293.66, "E": 329.63, "F": 349.23, "G": 392.00, "A": 440.00, "B": 493.88}
VOWELS = {"ah": (730, 1090), "ee": (270, 2290), "oo": (300, 870), "eh": (530, 1840)}
# name -> (suffix, container, codec, rate, layout, bit rate, seconds at most)
ENCODINGS = [
    ("flac", "flac", "flac", 16000, "mono", None, 0.8),
    ("wav", "wav", "pcm_s16le", 8000, "mono", None, 0.6),
    ("mp3", "mp3", "libmp3lame", 22050, "mono", 24000, 2.5),
    ("ogg", "ogg", "vorbis", 22050, "stereo", 32000, 2.0),
    ("opus", "ogg", "libopus", 48000, "mono", 16000, 2.5),
]


def _pick(rng: np.random.Generator, options):
    options = list(options)
    return options[int(rng.integers(len(options)))]


def _fade(t: np.ndarray) -> np.ndarray:
    return np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.02)


def _signal(rng: np.random.Generator, seconds: float, rate: int) -> tuple[np.ndarray, str]:
    """(waveform, what it is) of one clip."""
    t = np.arange(int(seconds * rate)) / rate
    kind = _pick(rng, ("tone", "chord", "sweep", "notes", "vowel"))
    if kind == "tone":
        note = _pick(rng, NOTES)
        x = np.sin(2 * np.pi * NOTES[note] * t)
        what = f"a steady {note} at {NOTES[note]:.0f} hertz"
    elif kind == "chord":
        root = _pick(rng, ("C", "F", "G"))
        names = list(NOTES)
        i = names.index(root)
        chord = [names[i], names[(i + 2) % 7], names[(i + 4) % 7]]
        x = sum(np.sin(2 * np.pi * NOTES[n] * t) for n in chord) / 3
        what = f"{'an' if root == 'F' else 'a'} {root} major chord ({', '.join(chord)})"
    elif kind == "sweep":
        low, high = 200.0, float(_pick(rng, (800, 1200, 2000)))
        up = bool(rng.integers(2))
        f0, f1 = (low, high) if up else (high, low)
        phase = 2 * np.pi * np.cumsum(f0 + (f1 - f0) * t / seconds) / rate
        x = np.sin(phase)
        what = f"a sweep {'rising' if up else 'falling'} from {f0:.0f} to {f1:.0f} hertz"
    elif kind == "notes":
        tune = [_pick(rng, NOTES) for _ in range(int(rng.integers(3, 6)))]
        step = len(t) // len(tune)
        x = np.zeros(len(t))
        for k, note in enumerate(tune):
            seg = slice(k * step, (k + 1) * step)
            x[seg] = np.sin(2 * np.pi * NOTES[note] * t[seg]) * _fade(t[seg] - t[seg][0])
        what = f"the notes {' '.join(tune)}"
    else:
        vowel = _pick(rng, VOWELS)
        f1, f2 = VOWELS[vowel]
        pitch = 120 + 25 * np.sin(2 * np.pi * 0.8 * t)
        phase = 2 * np.pi * np.cumsum(pitch) / rate
        x = sum(
            np.sin(k * phase)
            / k
            * (
                np.exp(-(((k * pitch - f1) / 90) ** 2))
                + 0.5 * np.exp(-(((k * pitch - f2) / 120) ** 2))
            )
            for k in range(1, 30)
        )
        x = x / np.abs(x).max()
        what = f"a hummed {vowel!r} vowel"
    x = 0.3 * x * _fade(t)
    return (np.round(x * 32767) / 32768).astype(np.float32), what


def _encode(x: np.ndarray, fmt: str, codec: str, rate: int, layout: str, bit_rate) -> bytes:
    planes = np.repeat(x[None], 2 if layout == "stereo" else 1, axis=0)
    out = io.BytesIO()
    with av.open(out, "w", format=fmt, options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        stream.codec_context.flags |= av.codec.context.Flags.bitexact
        if bit_rate:
            stream.bit_rate = bit_rate
        if codec == "vorbis":
            stream.codec_context.options = {"strict": "-2"}
        sample_format = "s16" if codec == "pcm_s16le" else "fltp"
        step = stream.codec_context.frame_size or 4096
        for at in range(0, len(x), step):
            chunk = np.ascontiguousarray(planes[:, at : at + step], dtype=np.float32)
            if sample_format == "s16":
                chunk = np.round(chunk * 32768).clip(-32768, 32767).astype(np.int16).reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(chunk, format=sample_format, layout=layout)
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def _clip(rng: np.random.Generator) -> tuple[bytes, str, str]:
    """One clip (encoded), its caption and its member suffix."""
    suffix, fmt, codec, rate, layout, bit_rate, longest = _pick(rng, ENCODINGS)
    seconds = round(float(rng.uniform(0.6, longest)), 1)
    x, what = _signal(rng, seconds, rate)
    return _encode(x, fmt, codec, rate, layout, bit_rate), f"{what} for {seconds:g} seconds", suffix


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 0
    tar.addfile(info, io.BytesIO(data))


def make_audio() -> list[str]:
    """Write the shards; the captions (for the tokenizer)."""
    rng = np.random.default_rng(SEED)
    OUT.mkdir(parents=True, exist_ok=True)
    captions = []
    for shard in range(SHARDS):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(PER_SHARD):
                key = f"sound{shard * PER_SHARD + i:05d}"
                clips = [_clip(rng) for _ in range(1 + int(rng.random() < 0.3))]
                for n, (data, _, ext) in enumerate(clips):
                    _add(tar, f"{key}.{ext}" if len(clips) == 1 else f"{key}.{n}.{ext}", data)
                if len(clips) == 2:
                    text = f"First <audio> {clips[0][1]}, then <audio> {clips[1][1]}."
                elif rng.random() < 0.5:
                    text = f"This recording is {clips[0][1]}."
                else:
                    text = f"Listen: <audio> It is {clips[0][1]}."
                _add(tar, f"{key}.txt", text.encode())
                captions.append(text)
            end = tar.offset  # the last member's end (padded to 512 bytes)
        # the two zero blocks that end a tar, without tarfile's padding to 10 KiB records
        (OUT / f"sounds-{shard:04d}.tar").write_bytes(buffer.getvalue()[: end + 1024])
    return captions


def make_audio_tokenizer(captions: list[str]) -> Path:
    prose = []
    for file in sorted((HERE / "sample" / "prose").glob("*.jsonl.zst")):
        text = zstandard.ZstdDecompressor().stream_reader(file.open("rb")).read().decode()
        prose += [json.loads(line)["text"] for line in text.splitlines()]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<pad>", "<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(captions * 20 + prose, trainer)
    path = HERE / "tokenizer_audio.json"
    tok.save(str(path), pretty=False)
    return path


if __name__ == "__main__":
    captions = make_audio()
    print(OUT, sum(f.stat().st_size for f in OUT.iterdir()), "bytes")
    print(make_audio_tokenizer(captions))
