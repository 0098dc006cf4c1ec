"""Generate the bundled image+text sample (data/sample/images) and data/tokenizer_vlm.json.

Run from the repo root: `python data/make_image_sample.py` (`data/make_sample.py` runs it
too). Every picture is drawn here with PIL from a seeded generator, and its caption is written
from what was drawn, so the data has no license beyond this repository's and the outputs are
the same on every run of the same library versions. The outputs are committed; users never
need to run this.

The corpus is WebDataset: 8 tar shards of 15 samples. A sample is `<key>.png|jpg|webp` (or
`<key>.0.<ext>`, `<key>.1.<ext>` for two pictures), `<key>.txt` (the caption, where `<image>`
marks a picture's place when the caption has markers) and `<key>.json` (what was drawn; mixer
skips it). Pictures: flat shapes, transparent clip-art icons, gradients, grainy photo-like
landscapes, bar charts (palette PNG) and grayscale patterns, from 32x32 to 640x480.

`data/tokenizer_vlm.json` is `data/tokenizer.json` plus the added special tokens
`<|vision_start|>`, `<|image_pad|>`, `<|vision_end|>` (Qwen2-VL) and `<image>` (LLaVA); every
existing token keeps its id.
"""

from __future__ import annotations

import io
import json
import math
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter
from tokenizers import Tokenizer

HERE = Path(__file__).parent
OUT = HERE / "sample" / "images"
SEED = 20240611
SHARDS, PER_SHARD = 8, 15
VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<image>"]

COLOURS = {
    "red": (214, 39, 40), "orange": (255, 127, 14), "yellow": (240, 200, 20),
    "green": (44, 160, 44), "blue": (31, 119, 180), "purple": (148, 103, 189),
    "pink": (227, 119, 194), "brown": (140, 86, 75), "black": (20, 20, 20),
    "teal": (23, 190, 207), "gray": (127, 127, 127),
}
BACKGROUNDS = {"white": (255, 255, 255), "light gray": (225, 225, 225),
               "pale yellow": (250, 245, 210), "pale blue": (215, 230, 245),
               "mint": (215, 245, 225)}
SHAPES = ("circle", "square", "triangle", "star", "diamond")
SHAPE_SIZES = [(200, 150), (160, 160), (256, 192), (320, 240), (448, 336), (120, 90),
               (96, 128), (300, 200)]


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


NUMBERS = ["no", "one", "two", "three", "four", "five", "six"]


def _pick(rng: np.random.Generator, options):
    options = list(options)
    return options[int(rng.integers(len(options)))]


def _polygon(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    if shape == "triangle":
        angles, radii = [-90, 30, 150], [r] * 3
    elif shape == "diamond":
        angles, radii = [-90, 0, 90, 180], [r] * 4
    else:  # star
        angles = [-90 + 36 * i for i in range(10)]
        radii = [r if i % 2 == 0 else r * 0.45 for i in range(10)]
    return [(cx + q * math.cos(math.radians(a)), cy + q * math.sin(math.radians(a)))
            for a, q in zip(angles, radii)]


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float,
                fill) -> None:
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon(_polygon(shape, cx, cy, r), fill=fill)


def _place(x: float, y: float) -> str:
    col = "left" if x < 1 / 3 else "right" if x > 2 / 3 else "centre"
    row = "top" if y < 1 / 3 else "bottom" if y > 2 / 3 else "middle"
    if row == "middle" and col == "centre":
        return "in the centre"
    if row == "middle":
        return f"on the {col}"
    if col == "centre":
        return f"at the {row}"
    return f"at the {row} {col}"


def shapes(rng: np.random.Generator) -> tuple[Image.Image, str, dict]:
    w, h = _pick(rng, SHAPE_SIZES)
    bg_name = _pick(rng, BACKGROUNDS)
    image = Image.new("RGB", (w, h), BACKGROUNDS[bg_name])
    draw = ImageDraw.Draw(image)
    n = int(rng.integers(1, 4))
    cells = rng.permutation(9)[:n]
    items = []
    for cell in cells:
        shape, colour = _pick(rng, SHAPES), _pick(rng, [c for c in COLOURS if c != "gray"])
        x, y = (cell % 3 + 0.5) / 3, (cell // 3 + 0.5) / 3
        r = min(w, h) / 6 * float(rng.uniform(0.6, 0.95))
        _draw_shape(draw, shape, x * w, y * h, r, COLOURS[colour])
        items.append((_a(f"{colour} {shape}"), x, y))
    if n == 1:
        text = f"{items[0][0].capitalize()} {_place(items[0][1], items[0][2])}, on " \
               f"{_a(bg_name)} background."
    elif n == 2:
        (a, ax, ay), (b, bx, by) = items
        if abs(ax - bx) >= abs(ay - by):
            relation = "to the left of" if ax < bx else "to the right of"
        else:
            relation = "above" if ay < by else "below"
        text = f"{a.capitalize()} {relation} {b}, on {_a(bg_name)} background."
    else:
        parts = [f"{name} {_place(x, y)}" for name, x, y in items]
        text = f"Three shapes on {_a(bg_name)} background: {parts[0]}, {parts[1]} and {parts[2]}."
    return image, text, {"kind": "shapes", "shapes": [i[0] for i in items]}


def icon(rng: np.random.Generator) -> tuple[Image.Image, str, dict]:
    side = _pick(rng, [32, 32, 48, 64])
    shape, colour = _pick(rng, SHAPES), _pick(rng, COLOURS)
    image = Image.new("RGBA", (side, side), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    _draw_shape(draw, shape, side / 2, side / 2, side * 0.42, (*COLOURS[colour], 255))
    outline = rng.integers(2) == 1
    if outline:
        draw.ellipse((1, 1, side - 2, side - 2), outline=(20, 20, 20, 255), width=2)
    ring = " inside a thin black ring" if outline else ""
    text = f"A small {side}x{side} icon of {_a(colour)} {shape}{ring} on a transparent background."
    return image, text, {"kind": "icon", "shape": shape, "colour": colour}


def gradient(rng: np.random.Generator) -> tuple[Image.Image, str, dict]:
    w, h = _pick(rng, [(128, 128), (200, 100), (256, 256), (100, 200), (224, 168)])
    a, b = rng.permutation([c for c in COLOURS if c != "gray"])[:2]
    vertical = rng.integers(2) == 1
    t = np.linspace(0, 1, h if vertical else w)[:, None]
    ramp = (1 - t) * np.array(COLOURS[a]) + t * np.array(COLOURS[b])
    pixels = np.repeat(ramp[:, None, :], w, 1) if vertical else np.repeat(ramp[None], h, 0)
    image = Image.fromarray(pixels.astype(np.uint8), "RGB")
    where = ("at the top", "at the bottom") if vertical else ("on the left", "on the right")
    text = f"A smooth gradient from {a} {where[0]} to {b} {where[1]}."
    return image, text, {"kind": "gradient", "from": str(a), "to": str(b)}


def landscape(rng: np.random.Generator, size: tuple[int, int] | None = None
              ) -> tuple[Image.Image, str, dict]:
    w, h = size or _pick(rng, [(320, 240), (240, 180), (300, 225), (400, 300)])
    night = rng.integers(4) == 0
    top, bottom = ((10, 15, 50), (40, 50, 100)) if night else ((70, 130, 210), (190, 220, 245))
    t = np.linspace(0, 1, h)[:, None]
    sky = (1 - t) * np.array(top) + t * np.array(bottom)
    image = Image.fromarray(np.repeat(sky[:, None, :], w, 1).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    sx, sy, sr = w * float(rng.uniform(0.15, 0.85)), h * float(rng.uniform(0.12, 0.3)), h * 0.08
    draw.ellipse((sx - sr, sy - sr, sx + sr, sy + sr),
                 fill=(235, 235, 220) if night else (250, 210, 60))
    hills = int(rng.integers(1, 4))
    for i in range(hills):
        cx, base = w * (i + 0.5) / hills + float(rng.normal(0, w * 0.05)), h * 0.62
        green = (30 + 25 * i, 110 + 30 * i, 40) if not night else (15, 45 + 10 * i, 25)
        draw.ellipse((cx - w * 0.45, base - h * 0.12 * (1 + i % 2), cx + w * 0.45,
                      base + h * 0.9), fill=green)
    trees = int(rng.integers(0, 5))
    for _ in range(trees):
        tx, ty = w * float(rng.uniform(0.05, 0.95)), h * float(rng.uniform(0.7, 0.85))
        th = h * 0.14
        draw.polygon([(tx, ty - th), (tx - th * 0.35, ty), (tx + th * 0.35, ty)],
                     fill=(10, 60, 25))
    image = image.filter(ImageFilter.GaussianBlur(1.2))
    grain = rng.normal(0, 9, (h, w, 3))
    image = Image.fromarray(np.clip(np.asarray(image) + grain, 0, 255).astype(np.uint8), "RGB")
    light = "a pale moon in a dark night sky" if night else "a yellow sun in a light blue sky"
    hill = "one green hill" if hills == 1 else f"{NUMBERS[hills]} green hills"
    tree = "" if trees == 0 else ", with one dark green tree" if trees == 1 else \
        f", with {NUMBERS[trees]} dark green trees"
    text = f"A grainy photo-like landscape: {light} over {hill}{tree}."
    return image, text, {"kind": "landscape", "night": bool(night), "hills": hills,
                         "trees": trees}


def chart(rng: np.random.Generator) -> tuple[Image.Image, str, dict]:
    w, h = _pick(rng, [(240, 160), (320, 200), (200, 200)])
    n = int(rng.integers(3, 7))
    names = [str(c) for c in rng.permutation([c for c in COLOURS if c != "black"])[:n]]
    values = [int(v) for v in rng.integers(1, 10, n)]
    image = Image.new("RGB", (w, h), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    draw.line((10, h - 10, w - 10, h - 10), fill=(0, 0, 0), width=2)
    draw.line((10, 10, 10, h - 10), fill=(0, 0, 0), width=2)
    step = (w - 30) / n
    for i, (name, v) in enumerate(zip(names, values)):
        x0 = 20 + i * step
        draw.rectangle((x0, h - 11 - v * (h - 30) / 9, x0 + step * 0.7, h - 11),
                       fill=COLOURS[name])
    image = image.quantize(colors=16, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    top = max(values)
    tallest = [name for name, v in zip(names, values) if v == top]
    bars = ", ".join(f"{name} {v}" for name, v in zip(names, values))
    lead = (f"the {tallest[0]} bar is the tallest" if len(tallest) == 1
            else f"the {' and '.join(tallest)} bars are the tallest")
    text = f"A bar chart with {NUMBERS[n]} bars ({bars}); {lead}."
    return image, text, {"kind": "chart", "bars": dict(zip(names, values))}


def pattern(rng: np.random.Generator) -> tuple[Image.Image, str, dict]:
    side = _pick(rng, [64, 96, 128])
    cells = _pick(rng, [4, 6, 8])
    checker = rng.integers(2) == 1
    y, x = np.mgrid[0:side, 0:side] * cells // side
    mask = (x + y) % 2 if checker else x % 2
    image = Image.fromarray(np.where(mask == 0, 20, 235).astype(np.uint8), "L")
    text = (f"A grayscale checkerboard of {cells} by {cells} black and white squares."
            if checker else f"Vertical stripes: {cells} bands alternating black and white.")
    return image, text, {"kind": "pattern", "checker": bool(checker), "cells": cells}


KINDS = {"shapes": shapes, "icon": icon, "gradient": gradient, "landscape": landscape,
         "chart": chart, "pattern": pattern}
PLAN = ["shapes"] * 38 + ["icon"] * 18 + ["gradient"] * 12 + ["landscape"] * 14 + \
    ["chart"] * 14 + ["pattern"] * 10 + ["pair"] * 12 + ["big"] * 2


def _format(kind: str, image: Image.Image, rng: np.random.Generator) -> str:
    if kind == "landscape":
        return "jpg"
    if kind == "gradient":
        return "webp" if rng.integers(2) else "jpg"
    if kind == "shapes":
        return _pick(rng, ["png", "png", "webp"])
    return "png"


def encode(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    if fmt == "jpg":
        image.save(out, format="JPEG", quality=72, optimize=True)
    elif fmt == "webp":
        image.save(out, format="WEBP", quality=80, method=6)
    else:
        image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def _phrase(text: str) -> str:
    """`A red circle ...` -> `a red circle ...` (no final full stop)."""
    return text[0].lower() + text[1:].rstrip(".")


def sample(index: int, kind: str, rng: np.random.Generator) -> tuple[list, str, dict]:
    """([(image, fmt)], caption, metadata) of one sample."""
    if kind == "pair":
        kinds = [_pick(rng, ["shapes", "icon", "chart", "gradient", "pattern"]) for _ in "ab"]
        drawn = [KINDS[k](rng) for k in kinds]
        images = [(img, _format(k, img, rng)) for k, (img, _, _) in zip(kinds, drawn)]
        first, second = (_phrase(d[1]) for d in drawn)
        style = int(rng.integers(3))
        if style == 0:
            text = f"Two pictures. <image> The first shows {first}. <image> The second " \
                   f"shows {second}."
        elif style == 1:
            text = f"<image> <image> Left: {first}. Right: {second}."
        else:
            text = f"Which picture has more colours? <image> or <image> The first is " \
                   f"{first}; the second is {second}."
        return images, text, {"kind": "pair", "parts": [d[2] for d in drawn]}
    if kind == "big":
        image, text, meta = landscape(rng, (640, 480))
        return [(image, "jpg")], text, meta
    image, text, meta = KINDS[kind](rng)
    style = int(rng.integers(4))
    if style == 1:   # the marker inside the text: a prompt, then the picture, then its caption
        text = f"Describe the picture. <image> {text}"
    elif style == 2:
        text = f"{text} <image>"   # text first, then the picture
    return [(image, _format(kind, image, rng))], text, meta


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))


def make_images() -> dict[str, int]:
    rng = np.random.default_rng(SEED)
    plan = [PLAN[i] for i in rng.permutation(len(PLAN))]
    assert len(plan) == SHARDS * PER_SHARD
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.tar"):
        old.unlink()
    stats = {"samples": 0, "images": 0, "bytes": 0}
    for shard in range(SHARDS):
        path = OUT / f"pictures-{shard:04d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(shard * PER_SHARD, (shard + 1) * PER_SHARD):
                images, text, meta = sample(i, plan[i], np.random.default_rng([SEED, i]))
                key = f"pic{i:05d}"
                sizes = []
                for n, (image, fmt) in enumerate(images):
                    name = f"{key}.{fmt}" if len(images) == 1 else f"{key}.{n}.{fmt}"
                    _add(tar, name, encode(image, fmt))
                    sizes.append([image.width, image.height, image.mode, fmt])
                _add(tar, f"{key}.txt", text.encode())
                meta = {"id": i, "images": sizes, **meta}
                _add(tar, f"{key}.json", json.dumps(meta, sort_keys=True).encode())
                stats["samples"] += 1
                stats["images"] += len(images)
        stats["bytes"] += path.stat().st_size
    return stats


def make_vlm_tokenizer() -> Path:
    tok = Tokenizer.from_file(str(HERE / "tokenizer.json"))
    before = tok.get_vocab_size(with_added_tokens=True)
    tok.add_special_tokens(VISION_TOKENS)
    ids = [tok.token_to_id(t) for t in VISION_TOKENS]
    assert ids == list(range(before, before + len(VISION_TOKENS))), ids
    path = HERE / "tokenizer_vlm.json"
    tok.save(str(path), pretty=False)
    return path


def main() -> None:
    print(make_images())
    print(make_vlm_tokenizer())


if __name__ == "__main__":
    main()
