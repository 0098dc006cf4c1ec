"""Images per second: mixer's decode + process path vs transformers' image processors.

    python benchmarks/images.py [--images 300] [--repeat 3] [--seed 0] [--only trainer]

Generates JPEGs of mixed photo-like sizes (smooth gradients, shapes and grain, quality 85), then
times, on one thread, for each layout:
  - mixer from bytes: header probe and plan (`LazyImage.probe`), decode, resize, normalize and
    patch (`LazyImage.pixels`), exactly what a loader worker does per image;
  - the transformers processor (`Qwen2VLImageProcessorPil`, `CLIPImageProcessorPil` with
    LLaVA-1.5's shortest edge 336 and crop 336) given `PIL.Image.open(bytes)`, so it decodes
    too -- the same work;
  - both given already-decoded RGB images (the processing alone).
Each rate is the best of `--repeat` passes over all images, in CPU seconds of this (single-
threaded) process, the paths' passes alternating, so a busy machine biases neither. To add a
measurement, write a function returning row dicts and list it in `MEASUREMENTS`.

`--only latency`: the time between batches, loader flat out, on a skewed mix (clip art PNGs
plus `--big-share` 4K JPEG photos), qwen2_vl, num_workers 0 and 2. `--only trainer`: what a
trainer waits at num_workers 2 on that mix when each step computes (sleeps) for the loader's
mean batch time / busy (`--busy 0.7,0.9`: 30 % and 10 % slack): waits as a share of the wall
time, p50, p99 and max.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

# Appended, not inserted: `PYTHONPATH=<a copy of another mixer/'s parent>` times that copy.
sys.path.append(str(Path(__file__).resolve().parent.parent))
from mixer.config.images import ImageSettings  # noqa: E402
from mixer.core.records import EncodedImage  # noqa: E402
from mixer.images.decode import to_rgb  # noqa: E402
from mixer.images.handle import LazyImage  # noqa: E402
from mixer.images.processing import processing_for  # noqa: E402
from mixer.tools.tables import format_table  # noqa: E402

# (width, height) of typical web and photo images; drawn uniformly.
SIZES = [
    (640, 480),
    (480, 640),
    (1024, 768),
    (500, 375),
    (1280, 720),
    (800, 1200),
    (256, 256),
    (1920, 1080),
    (333, 500),
    (1600, 1200),
    (720, 720),
    (300, 200),
]


def photo(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A photo-like RGB image: gradients, a few filled shapes, grain."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = [
        rng.uniform(0, 255)
        + rng.uniform(-1, 1) * 120 * x / width
        + rng.uniform(-1, 1) * 120 * y / height
        for _ in range(3)
    ]
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
            patch_size=settings.patch_size,
            merge_size=settings.merge_size,
            temporal_patch_size=settings.temporal_patch_size,
            size={"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels},
            image_mean=list(settings.image_mean),
            image_std=list(settings.image_std),
        )
    from transformers import CLIPImageProcessorPil

    side = settings.image_size
    return CLIPImageProcessorPil(
        size={"shortest_edge": side},
        crop_size={"height": side, "width": side},
        image_mean=list(settings.image_mean),
        image_std=list(settings.image_std),
    )


def best_rates(items: list, fns: dict[str, Callable], repeat: int) -> dict[str, float]:
    """Images per CPU-second of each fn over `items`, best of `repeat` passes. Passes of the
    fns alternate, and CPU time (not wall time) is counted, so that other processes on the
    machine bias no path: the rates are per core."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.process_time()
            for item in items:
                fn(item)
            best[name] = min(best[name], time.process_time() - start)
    return {name: len(items) / seconds for name, seconds in best.items()}


def mixer_from_bytes(settings: ImageSettings) -> Callable[[bytes], object]:
    """LazyImage.probe + pixels: what a loader worker does per stored image."""
    processing = processing_for(settings)

    def one(data: bytes) -> object:
        return LazyImage.probe(
            EncodedImage(data, "000000.jpg", 0),
            processing,
            extra_tokens=0,
            source="bench",
            file="bench.tar",
            max_source_pixels=settings.max_source_pixels,
        ).pixels()

    return one


def processor_from_bytes(settings: ImageSettings) -> Callable[[bytes], object]:
    processor = transformers_processor(settings)
    return lambda data: processor(Image.open(io.BytesIO(data)))


def decoded(jpegs: list[bytes]) -> list[Image.Image]:
    out = []
    for data in jpegs:
        image = Image.open(io.BytesIO(data))
        image.load()
        out.append(to_rgb(image))
    return out


def mixer_decoded(settings: ImageSettings) -> Callable[[Image.Image], object]:
    processing = processing_for(settings)
    return lambda image: processing.pixels(image, processing.plan(*image.size))


def processor_decoded(settings: ImageSettings) -> Callable[[Image.Image], object]:
    return transformers_processor(settings)


def throughput_rows(layout: str, jpegs: list[bytes], repeat: int) -> list[dict]:
    """mixer vs transformers from JPEG bytes, and from decoded images."""
    settings = settings_for(layout)
    rows = []
    for label, items, ours, theirs in [
        ("JPEG bytes", jpegs, mixer_from_bytes, processor_from_bytes),
        ("decoded RGB", decoded(jpegs), mixer_decoded, processor_decoded),
    ]:
        rates = best_rates(
            items, {"mixer": ours(settings), "transformers": theirs(settings)}, repeat
        )
        for path, rate in rates.items():
            rows.append(
                {
                    "layout": layout,
                    "input": label,
                    "path": path,
                    "rate": rate,
                    "ms": 1000 / rate,
                    "speedup": rate / rates["transformers"],
                }
            )
    return rows


MEASUREMENTS: dict[str, Callable[[list[bytes], int], list[dict]]] = {
    "qwen2_vl": lambda jpegs, repeat: throughput_rows("qwen2_vl", jpegs, repeat),
    "llava": lambda jpegs, repeat: throughput_rows("llava", jpegs, repeat),
}

COLUMNS = [
    ("layout", "layout"),
    ("input", "input"),
    ("path", "path"),
    ("rate", "images/s per core"),
    ("ms", "CPU ms/image"),
    ("speedup", "vs transformers"),
]


# -- batch latency on a skewed mix ---------------------------------------------------------------


def clipart(rng: np.random.Generator, side: int) -> bytes:
    """A small transparent PNG icon: a few translucent ellipses."""
    img = Image.new("RGBA", (side, side), (0, 0, 0, 0))
    draw = ImageDraw.Draw(img)
    for _ in range(3):
        x0, x1 = sorted(rng.integers(0, side, 2).tolist())
        y0, y1 = sorted(rng.integers(0, side, 2).tolist())
        draw.ellipse((x0, y0, x1, y1), fill=tuple(int(v) for v in rng.integers(0, 256, 4)))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def skewed_corpus(root: Path, *, samples: int, big_share: float, seed: int) -> Path:
    """WebDataset shards of clip art (64-256 px PNG) with a `big_share` of 4K JPEG photos."""
    import tarfile

    rng = np.random.default_rng(seed)
    photos = []
    for _ in range(4):
        buf = io.BytesIO()
        photo(rng, 3840, 2160).save(buf, "JPEG", quality=85)
        photos.append(buf.getvalue())
    root.mkdir(parents=True, exist_ok=True)

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    per_shard = max(samples // 8, 1)
    for shard in range(8):
        with tarfile.open(root / f"shard-{shard}.tar", "w") as tar:
            for i in range(per_shard):
                key = f"{shard:02d}{i:06d}"
                if rng.random() < big_share:
                    add(tar, key + ".jpg", photos[int(rng.integers(len(photos)))])
                else:
                    add(tar, key + ".png", clipart(rng, int(rng.integers(64, 257))))
                count = int(rng.integers(20, 200))
                words = " ".join(f"w{int(w)}" for w in rng.integers(0, 500, count))
                add(tar, key + ".txt", words.encode())
    return root


def skewed_recipe(tmp: Path, args: argparse.Namespace) -> dict:
    """A qwen2_vl recipe over `skewed_corpus` in `tmp`, with a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = skewed_corpus(
        tmp / "shards", samples=args.samples, big_share=args.big_share, seed=args.seed
    )
    vocab = {"<|endoftext|>": 0, "<pad>": 1, **{f"w{i}": i + 2 for i in range(500)}}
    for token in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"):
        vocab[token] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(vocab)[:2] + list(vocab)[-3:])
    tok.save(str(tmp / "tokenizer.json"))
    return {
        "tokenizer": str(tmp / "tokenizer.json"),
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "lanes": 8,
        "images": {"layout": "qwen2_vl"},
        "sources": [{"name": "skewed", "path": str(root / "*.tar"), "weight": 1}],
    }


def _tree_cpu() -> float:
    """CPU seconds used so far by this process and its live children (loader workers)."""
    import psutil

    procs = [psutil.Process()]
    procs += procs[0].children(recursive=True)
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def _gaps(
    recipe: dict, workers: int, args: argparse.Namespace
) -> tuple[float, list[float], int, float]:
    """First batch time, the times between the timed batches (loader flat out), images, and
    CPU seconds per timed batch of the whole process tree (a busy machine slows the gaps, far
    less the CPU)."""
    import mixer

    loader = mixer.build_loader(recipe, num_workers=workers)
    gaps, images, first, cpu = [], 0, 0.0, 0.0
    start = last = time.perf_counter()
    for step, batch in enumerate(loader):
        now = time.perf_counter()
        if step == 0:
            first = now - start
        elif step > args.warmup:
            gaps.append(now - last)
            images += batch["image_grid_thw"].shape[0]
        if step == args.warmup:
            cpu = _tree_cpu()
        last = now
        if step == args.warmup + args.batches:
            cpu = (_tree_cpu() - cpu) / args.batches
            break
    loader.close()
    return first, gaps, images, cpu


def latency_rows(args: argparse.Namespace) -> list[dict]:
    """p50/p99 of the time between batches, for num_workers 0 and 2, the loader flat out."""
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        recipe = skewed_recipe(Path(tmp), args)
        for workers in (0, 2):
            first, gaps, images, _ = _gaps(recipe, workers, args)
            ms = np.array(gaps) * 1000
            rows.append(
                {
                    "workers": workers,
                    "first": first * 1000,
                    "p50": np.percentile(ms, 50),
                    "p99": np.percentile(ms, 99),
                    "max": ms.max(),
                    "ratio": np.percentile(ms, 99) / np.percentile(ms, 50),
                    "images": images / (ms.sum() / 1000),
                }
            )
    return rows


def trainer_wait_rows(args: argparse.Namespace) -> list[dict]:
    """A trainer's view at num_workers 2: it takes a batch, then computes for a fixed step
    time (a sleep) of mean / busy, where mean is the loader's mean batch time measured flat
    out beforehand (busy 0.7: the loader has 30 % slack). Waits: the time `next()` blocks."""
    import tempfile

    import mixer

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        recipe = skewed_recipe(Path(tmp), args)
        _, gaps, _, cpu = _gaps(recipe, 2, args)
        mean = float(np.mean(gaps))
        for busy in args.busy:
            step_s = mean / busy
            loader = mixer.build_loader(recipe, num_workers=2)
            source = iter(loader)
            # The warm-up batches come in the trainer's rhythm too: taken back to back they
            # would drain the loader's lead and charge the start-up to the first timed steps
            # (the first batch has a target of its own).
            for _ in range(args.warmup + 1):
                next(source)
                time.sleep(step_s)
            waits = []
            start = time.perf_counter()
            for _ in range(args.batches):
                before = time.perf_counter()
                next(source)
                waits.append(time.perf_counter() - before)
                time.sleep(step_s)
            wall = time.perf_counter() - start
            loader.close()
            ms = np.array(waits) * 1000
            rows.append(
                {
                    "busy": busy,
                    "mean": mean * 1000,
                    "cpu": cpu * 1000,
                    "step": step_s * 1000,
                    "share": 100 * sum(waits) / wall,
                    "p50": np.percentile(ms, 50),
                    "p99": np.percentile(ms, 99),
                    "max": ms.max(),
                    "worst": ", ".join(f"{int(ms[i])}@{i}" for i in np.argsort(ms)[::-1][:3]),
                }
            )
    return rows


TRAINER_COLUMNS = [
    ("busy", "loader busy (mean/step)"),
    ("mean", "mean batch ms (flat out)"),
    ("cpu", "CPU ms/batch (all processes)"),
    ("step", "step ms"),
    ("share", "wait % of wall"),
    ("p50", "wait p50 ms"),
    ("p99", "wait p99 ms"),
    ("max", "wait max ms"),
    ("worst", "worst waits (ms@step)"),
]


LATENCY_COLUMNS = [
    ("workers", "num_workers"),
    ("first", "first batch ms"),
    ("p50", "p50 ms"),
    ("p99", "p99 ms"),
    ("max", "max ms"),
    ("ratio", "p99/p50"),
    ("images", "images/s"),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only",
        choices=sorted(MEASUREMENTS) + ["latency", "trainer"],
        action="append",
        help="run only these measurements (repeatable)",
    )
    parser.add_argument("--samples", type=int, default=2000, help="latency: samples")
    parser.add_argument(
        "--big-share",
        type=float,
        default=0.01,
        help="latency: share of 4K photos among the samples",
    )
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=150, help="latency: batches timed")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--busy",
        type=lambda v: [float(b) for b in v.split(",")],
        default=[0.7, 0.9],
        help="trainer: loader busy shares (mean/step)",
    )
    parser.add_argument(
        "--pixel-budget-mb",
        type=int,
        default=None,
        help="latency: pixels each process may hold ahead of need "
        "(mixer.images.handle.set_pixel_budget; default 256)",
    )
    args = parser.parse_args(argv)
    if args.pixel_budget_mb is not None:
        from mixer.images.handle import set_pixel_budget

        set_pixel_budget(args.pixel_budget_mb << 20)
    if args.only and set(args.only) <= {"latency", "trainer"}:
        if "latency" in args.only:
            print(format_table(latency_rows(args), LATENCY_COLUMNS))
        if "trainer" in args.only:
            print(format_table(trainer_wait_rows(args), TRAINER_COLUMNS))
        return
    jpegs = make_jpegs(args.images, args.seed)
    megapixels = sum(np.prod(Image.open(io.BytesIO(d)).size) for d in jpegs) / len(jpegs) / 1e6
    print(
        f"{len(jpegs)} JPEGs, {megapixels:.2f} Mpx and "
        f"{sum(map(len, jpegs)) / len(jpegs) / 1024:.0f} KiB on average\n"
    )
    rows = []
    for name in args.only or list(MEASUREMENTS):
        if name in MEASUREMENTS:
            rows += MEASUREMENTS[name](jpegs, args.repeat)
    print(format_table(rows, COLUMNS))
    if not args.only or "latency" in args.only:
        print("\nbatch latency (time between batches, loader flat out), qwen2_vl, skewed mix:")
        print(format_table(latency_rows(args), LATENCY_COLUMNS))
    if not args.only or "trainer" in args.only:
        print("\ntrainer waits (num_workers 2, qwen2_vl, skewed mix; a step sleeps mean/busy):")
        print(format_table(trainer_wait_rows(args), TRAINER_COLUMNS))


if __name__ == "__main__":
    main()
