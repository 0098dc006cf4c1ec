"""Images per second: mixer's decode + process path vs transformers' image processors.

    python benchmarks/images.py [--images 300] [--repeat 3] [--seed 0]

Generates JPEGs of mixed photo-like sizes (smooth gradients, shapes and grain, quality 85), then
times, on one thread, for each layout:
  - mixer from bytes: header probe and plan (`LazyImage.probe`), decode, resize, normalize and
    patch (`LazyImage.pixels`), exactly what a loader worker does per image;
  - the transformers processor (`Qwen2VLImageProcessorPil`, `CLIPImageProcessorPil` with
    LLaVA-1.5's shortest edge 336 and crop 336) given `PIL.Image.open(bytes)`, so it decodes
    too -- the same work;
  - both given already-decoded RGB images (the processing alone).
Each row is the best of `--repeat` passes over all images. To add a measurement, write a
function returning a row dict and list it in `MEASUREMENTS`.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mixer.cli import format_table  # noqa: E402
from mixer.images.decode import to_rgb  # noqa: E402
from mixer.images.handle import LazyImage  # noqa: E402
from mixer.images.processing import processing_for  # noqa: E402
from mixer.recipe import ImageSettings  # noqa: E402
from mixer.sources.base import EncodedImage  # noqa: E402

# (width, height) of typical web and photo images; drawn uniformly.
SIZES = [(640, 480), (480, 640), (1024, 768), (500, 375), (1280, 720), (800, 1200),
         (256, 256), (1920, 1080), (333, 500), (1600, 1200), (720, 720), (300, 200)]


def photo(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A photo-like RGB image: gradients, a few filled shapes, grain."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = [rng.uniform(0, 255) + rng.uniform(-1, 1) * 120 * x / width
            + rng.uniform(-1, 1) * 120 * y / height for _ in range(3)]
    img = Image.fromarray(np.clip(np.stack(base, -1), 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(8):
        x0, x1 = sorted(rng.integers(0, width, 2).tolist())
        y0, y1 = sorted(rng.integers(0, height, 2).tolist())
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=fill)
    grain = rng.normal(0, 6, (height, width, 3))
    return Image.fromarray(np.clip(np.asarray(img) + grain, 0, 255).astype(np.uint8))


def make_jpegs(count: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        width, height = SIZES[int(rng.integers(len(SIZES)))]
        buf = io.BytesIO()
        photo(rng, width, height).save(buf, "JPEG", quality=85)
        out.append(buf.getvalue())
    return out


def settings_for(layout: str) -> ImageSettings:
    return ImageSettings(layout=layout)


def transformers_processor(settings: ImageSettings):
    if settings.layout == "qwen2_vl":
        from transformers import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil(
            patch_size=settings.patch_size, merge_size=settings.merge_size,
            temporal_patch_size=settings.temporal_patch_size,
            size={"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels},
            image_mean=list(settings.image_mean), image_std=list(settings.image_std))
    from transformers import CLIPImageProcessorPil

    side = settings.image_size
    return CLIPImageProcessorPil(size={"shortest_edge": side},
                                 crop_size={"height": side, "width": side},
                                 image_mean=list(settings.image_mean),
                                 image_std=list(settings.image_std))


def best_rate(items: list, fn: Callable, repeat: int) -> float:
    """Images per second of `fn` over `items`, best of `repeat` passes."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, time.perf_counter() - start)
    return len(items) / best


def mixer_from_bytes(settings: ImageSettings, jpegs: list[bytes], repeat: int) -> float:
    processing = processing_for(settings)
    encoded = [EncodedImage(data, f"{i:06d}.jpg", 0) for i, data in enumerate(jpegs)]

    def one(enc: EncodedImage) -> None:
        LazyImage.probe(enc, processing, extra_tokens=0, source="bench", file="bench.tar",
                        max_source_pixels=settings.max_source_pixels).pixels()

    return best_rate(encoded, one, repeat)


def processor_from_bytes(settings: ImageSettings, jpegs: list[bytes], repeat: int) -> float:
    processor = transformers_processor(settings)
    return best_rate(jpegs, lambda data: processor(Image.open(io.BytesIO(data))), repeat)


def decoded(jpegs: list[bytes]) -> list[Image.Image]:
    out = []
    for data in jpegs:
        image = Image.open(io.BytesIO(data))
        image.load()
        out.append(to_rgb(image))
    return out


def mixer_decoded(settings: ImageSettings, images: list[Image.Image], repeat: int) -> float:
    processing = processing_for(settings)
    return best_rate(images, lambda im: processing.pixels(im, processing.plan(*im.size)), repeat)


def processor_decoded(settings: ImageSettings, images: list[Image.Image], repeat: int) -> float:
    processor = transformers_processor(settings)
    return best_rate(images, processor, repeat)


def throughput_rows(layout: str, jpegs: list[bytes], repeat: int) -> list[dict]:
    settings = settings_for(layout)
    images = decoded(jpegs)
    ours, theirs = (mixer_from_bytes(settings, jpegs, repeat),
                    processor_from_bytes(settings, jpegs, repeat))
    ours_p, theirs_p = (mixer_decoded(settings, images, repeat),
                        processor_decoded(settings, images, repeat))
    return [
        {"layout": layout, "input": "JPEG bytes", "path": "mixer", "rate": ours,
         "ms": 1000 / ours, "speedup": ours / theirs},
        {"layout": layout, "input": "JPEG bytes", "path": "transformers", "rate": theirs,
         "ms": 1000 / theirs, "speedup": 1.0},
        {"layout": layout, "input": "decoded RGB", "path": "mixer", "rate": ours_p,
         "ms": 1000 / ours_p, "speedup": ours_p / theirs_p},
        {"layout": layout, "input": "decoded RGB", "path": "transformers", "rate": theirs_p,
         "ms": 1000 / theirs_p, "speedup": 1.0},
    ]


MEASUREMENTS: dict[str, Callable[[list[bytes], int], list[dict]]] = {
    "qwen2_vl": lambda jpegs, repeat: throughput_rows("qwen2_vl", jpegs, repeat),
    "llava": lambda jpegs, repeat: throughput_rows("llava", jpegs, repeat),
}

COLUMNS = [("layout", "layout"), ("input", "input"), ("path", "path"),
           ("rate", "images/s (1 thread)"), ("ms", "ms/image"), ("speedup", "vs transformers")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=sorted(MEASUREMENTS), action="append",
                        help="run only these measurements (repeatable)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    jpegs = make_jpegs(args.images, args.seed)
    megapixels = sum(np.prod(Image.open(io.BytesIO(d)).size) for d in jpegs) / len(jpegs) / 1e6
    print(f"{len(jpegs)} JPEGs, {megapixels:.2f} Mpx and "
          f"{sum(map(len, jpegs)) / len(jpegs) / 1024:.0f} KiB on average\n")
    rows = []
    for name in args.only or list(MEASUREMENTS):
        rows += MEASUREMENTS[name](jpegs, args.repeat)
    print(format_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
