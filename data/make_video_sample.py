"""Generate the bundled video+text sample (data/sample/videos) and data/tokenizer_video.json.

Run from the repo root: `python data/make_video_sample.py` (needs PyAV, the `video` extra).
Every clip is drawn here with numpy from a seeded generator (a shape moving across a plain
background), encoded with PyAV (H.264 in mp4, VP9 in webm), and its caption is written from
what was drawn, so the data has no license beyond this repository's. The outputs are
committed; users never need to run this.

The corpus is WebDataset: 2 tar shards of 8 samples. A sample is `<key>.mp4|webm` (or
`<key>.0.<ext>`, `<key>.1.<ext>` for two clips), `<key>.txt` (the caption; `<video>` marks a
clip's place where the caption has markers). Clips are 2 to 4 seconds at 10 or 15 fps,
96x96 to 160x120 pixels.

`data/tokenizer_video.json` is `data/tokenizer_vlm.json` plus the added special token
`<|video_pad|>` (Qwen2-VL's video placeholder); every existing token keeps its id.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import av
import numpy as np
from tokenizers import Tokenizer

HERE = Path(__file__).parent
OUT = HERE / "sample" / "videos"
SEED = 20261205
SHARDS, PER_SHARD = 2, 8
COLOURS = {"red": (214, 39, 40), "orange": (255, 127, 14), "green": (44, 160, 44),
           "blue": (31, 119, 180), "purple": (148, 103, 189), "black": (20, 20, 20)}
BACKGROUNDS = {"white": (255, 255, 255), "pale yellow": (250, 245, 210),
               "pale blue": (215, 230, 245)}
SIZES = [(96, 96), (128, 96), (160, 120)]
MOVES = {"left to right": ((0.15, 0.5), (0.85, 0.5)), "right to left": ((0.85, 0.5), (0.15, 0.5)),
         "top to bottom": ((0.5, 0.15), (0.5, 0.85)), "bottom to top": ((0.5, 0.85), (0.5, 0.15)),
         "across the diagonal": ((0.15, 0.15), (0.85, 0.85))}


def _pick(rng: np.random.Generator, options):
    options = list(options)
    return options[int(rng.integers(len(options)))]


def _clip(rng: np.random.Generator) -> tuple[bytes, str, str]:
    """One clip (encoded), its caption and its member suffix."""
    width, height = _pick(rng, SIZES)
    rate = _pick(rng, (10, 15))
    seconds = int(rng.integers(2, 5))
    colour, background, move = _pick(rng, COLOURS), _pick(rng, BACKGROUNDS), _pick(rng, MOVES)
    shape = _pick(rng, ("square", "disc"))
    (x0, y0), (x1, y1) = MOVES[move]
    r = min(width, height) // 8
    ys, xs = np.mgrid[0:height, 0:width]
    frames = []
    for f in range(rate * seconds):
        a = f / (rate * seconds - 1)
        cx, cy = (x0 + a * (x1 - x0)) * width, (y0 + a * (y1 - y0)) * height
        inside = ((np.abs(xs - cx) <= r) & (np.abs(ys - cy) <= r) if shape == "square"
                  else (xs - cx) ** 2 + (ys - cy) ** 2 <= r * r)
        img = np.empty((height, width, 3), dtype=np.uint8)
        img[:] = BACKGROUNDS[background]
        img[inside] = COLOURS[colour]
        frames.append(img)
    codec, fmt, ext = _pick(rng, [("libx264", "mp4", "mp4"), ("libx264", "mp4", "mp4"),
                                  ("libvpx-vp9", "webm", "webm")])
    out = io.BytesIO()
    with av.open(out, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.gop_size = rate
        if codec == "libvpx-vp9":
            stream.options = {"deadline": "realtime", "cpu-used": "8"}
        for img in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    article = "an" if colour[0] in "aeiou" else "a"
    caption = (f"{article} {colour} {shape} moves {move} over a {background} background "
               f"for {seconds} seconds")
    return out.getvalue(), caption, ext


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 0
    tar.addfile(info, io.BytesIO(data))


def make_videos() -> Path:
    rng = np.random.default_rng(SEED)
    OUT.mkdir(parents=True, exist_ok=True)
    for shard in range(SHARDS):
        with tarfile.open(OUT / f"clips-{shard:04d}.tar", "w",
                          format=tarfile.USTAR_FORMAT) as tar:
            for i in range(PER_SHARD):
                key = f"clip{shard * PER_SHARD + i:05d}"
                clips = [_clip(rng) for _ in range(1 + int(rng.random() < 0.25))]
                for n, (data, _, ext) in enumerate(clips):
                    _add(tar, f"{key}.{ext}" if len(clips) == 1 else f"{key}.{n}.{ext}", data)
                if len(clips) == 2:
                    text = (f"First clip: <video> {clips[0][1]}. Second clip: <video> "
                            f"{clips[1][1]}.")
                else:
                    text = f"In this clip {clips[0][1]}."
                _add(tar, f"{key}.txt", text.encode())
    return OUT


def make_video_tokenizer() -> Path:
    tok = Tokenizer.from_file(str(HERE / "tokenizer_vlm.json"))
    tok.add_special_tokens(["<|video_pad|>"])
    path = HERE / "tokenizer_video.json"
    tok.save(str(path), pretty=False)
    return path


if __name__ == "__main__":
    print(make_videos())
    print(make_video_tokenizer())
