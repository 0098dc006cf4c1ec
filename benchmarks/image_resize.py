"""Images per second under `images.resize: pil` and `torchvision`, against both processors.

    python benchmarks/image_resize.py [--images 120] [--repeat 3] [--seed 0]

For each layout (qwen2_vl, llava) and each `images.resize` value, times mixer from JPEG bytes
(`LazyImage.probe` + `pixels`, what a loader worker does per image) and the transformers
processor it equals (`...Pil` for pil, the torchvision one for torchvision; needs torchvision)
given `PIL.Image.open(bytes)`. The JPEGs are `benchmarks/images.py`'s photo-like mix. torch
runs on one thread (`torch.set_num_threads(1)`, as in a DataLoader worker); rates are images
per CPU-second of this process, best of `--repeat` alternating passes (`images.best_rates`).
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

from PIL import Image

sys.path.append(str(Path(__file__).resolve().parent.parent))
sys.path.append(str(Path(__file__).resolve().parent))
from images import best_rates, make_jpegs, mixer_from_bytes  # noqa: E402

from mixer.config.images import ImageSettings  # noqa: E402
from mixer.tools.tables import format_table  # noqa: E402

COLUMNS = [
    ("layout", "layout"),
    ("resize", "images.resize"),
    ("path", "path"),
    ("rate", "images/s per core"),
    ("ms", "CPU ms/image"),
    ("speedup", "vs its processor"),
]


def processor(settings: ImageSettings):
    """The transformers processor whose pixels mixer's equal under these settings."""
    import transformers

    torchvision = settings.resize == "torchvision"
    if settings.layout == "llava":
        kind = (
            transformers.CLIPImageProcessor if torchvision else transformers.CLIPImageProcessorPil
        )
        side = settings.image_size
        return kind(
            size={"shortest_edge": side},
            crop_size={"height": side, "width": side},
            image_mean=list(settings.image_mean),
            image_std=list(settings.image_std),
        )
    kind = (
        transformers.Qwen2VLImageProcessor if torchvision else transformers.Qwen2VLImageProcessorPil
    )
    return kind(
        patch_size=settings.patch_size,
        merge_size=settings.merge_size,
        temporal_patch_size=settings.temporal_patch_size,
        size={"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels},
        image_mean=list(settings.image_mean),
        image_std=list(settings.image_std),
    )


def rows_for(layout: str, jpegs: list[bytes], repeat: int) -> list[dict]:
    rows = []
    for resize in ("pil", "torchvision"):
        settings = ImageSettings(layout=layout, resize=resize)
        theirs = processor(settings)
        fns = {
            "mixer": mixer_from_bytes(settings),
            "transformers": lambda data, p=theirs: p(Image.open(io.BytesIO(data))),
        }
        rates = best_rates(jpegs, fns, repeat)
        for path, rate in rates.items():
            rows.append(
                {
                    "layout": layout,
                    "resize": resize,
                    "path": path,
                    "rate": rate,
                    "ms": 1000 / rate,
                    "speedup": rate / rates["transformers"],
                }
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=120)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    jpegs = make_jpegs(args.images, args.seed)
    rows = []
    for layout in ("qwen2_vl", "llava"):
        rows += rows_for(layout, jpegs, args.repeat)
    print(format_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
