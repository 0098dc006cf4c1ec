"""Images: header probe, decoding, and pixels equal to transformers' image processors.

The oracles are `Qwen2VLImageProcessorPil` and `CLIPImageProcessorPil` (LLaVA-1.5's shortest
edge + centre crop), given the same stored bytes opened with PIL. Images are seeded random
content (noise over gradients), made in memory.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import signal
import struct
import warnings
import zlib
from concurrent.futures import Future

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mixer.config.images import ImageSettings
from mixer.core.errors import DataError
from mixer.core.records import EncodedImage
from mixer.images import handle
from mixer.images.decode import decode_rgb, probe, to_rgb
from mixer.images.handle import LazyImage, set_decode_threads
from mixer.images.processing import (
    LlavaProcessing,
    Qwen2VLProcessing,
    processing_for,
    smart_resize,
)

transformers = pytest.importorskip("transformers")

SOURCE, FILE = "pics", "s3://bucket/shard-00007.tar"
MEMBER, OFFSET = "000123.jpg", 51200
TOL = 1e-3


# ---------------------------------------------------------------- images and oracles


def random_rgb(width: int, height: int, seed: int) -> np.ndarray:
    """(height, width, 3) uint8: seeded noise over a seeded gradient."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    gradient = x * rng.uniform(0, 255 / max(width, 1)) + y * rng.uniform(0, 255 / max(height, 1))
    noise = rng.integers(-60, 61, (height, width, 3))
    return np.clip(gradient[..., None] + noise + rng.integers(0, 128, 3), 0, 255).astype(np.uint8)


def make_image(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rgb = random_rgb(width, height, seed)
    rng = np.random.default_rng(seed + 1)
    if mode == "RGB":
        return Image.fromarray(rgb)
    if mode == "RGBA":
        alpha = rng.integers(0, 256, (height, width, 1), dtype=np.uint8)
        alpha[: height // 3] = 0  # fully transparent rows too
        return Image.fromarray(np.concatenate([rgb, alpha], -1))
    if mode == "LA":
        alpha = rng.integers(0, 256, (height, width), dtype=np.uint8)
        return Image.fromarray(np.stack([rgb[..., 0], alpha], -1), mode="LA")
    if mode in ("P", "P+transparency"):
        image = Image.fromarray(rgb).quantize(64, dither=Image.Dither.NONE)
        if mode == "P+transparency":
            image.info["transparency"] = int(np.asarray(image)[0, 0])
        return image
    if mode == "I;16":
        return Image.fromarray(rgb[..., 0].astype(np.uint16) * 257)
    return Image.fromarray(rgb).convert(mode)  # L, 1, CMYK


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buf = io.BytesIO()
    if fmt == "PNG" and "transparency" in image.info:
        options.setdefault("transparency", image.info["transparency"])
    image.save(buf, fmt, **options)
    return buf.getvalue()


def enc(data: bytes) -> EncodedImage:
    return EncodedImage(data, MEMBER, OFFSET)


def qwen_settings(**kw) -> ImageSettings:
    return ImageSettings(layout="qwen2_vl", **kw)


def llava_settings(**kw) -> ImageSettings:
    return ImageSettings(layout="llava", **kw)


@functools.cache
def oracle(settings: ImageSettings):
    if settings.layout == "qwen2_vl":
        return transformers.Qwen2VLImageProcessorPil(
            patch_size=settings.patch_size,
            merge_size=settings.merge_size,
            temporal_patch_size=settings.temporal_patch_size,
            size={"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels},
            image_mean=list(settings.image_mean),
            image_std=list(settings.image_std),
        )
    side = settings.image_size
    return transformers.CLIPImageProcessorPil(
        size={"shortest_edge": side},
        crop_size={"height": side, "width": side},
        image_mean=list(settings.image_mean),
        image_std=list(settings.image_std),
    )


def ours(data: bytes, settings: ImageSettings) -> tuple[LazyImage, np.ndarray]:
    image = LazyImage.probe(
        enc(data),
        processing_for(settings),
        extra_tokens=0,
        source=SOURCE,
        file=FILE,
        max_source_pixels=settings.max_source_pixels,
    )
    return image, image.pixels()


def check_against_oracle(data: bytes, settings: ImageSettings) -> None:
    image, pixels = ours(data, settings)
    ref = oracle(settings)(Image.open(io.BytesIO(data)))
    if settings.layout == "qwen2_vl":
        expected, grid = ref["pixel_values"], ref["image_grid_thw"]
        assert grid.tolist() == [list(image.plan.grid_thw)]
        assert image.plan.rows == len(expected)
        assert image.plan.tokens == int(np.prod(grid)) // settings.merge_size**2
    else:
        expected = ref["pixel_values"][0]
    assert pixels.dtype == np.float32 and pixels.shape == expected.shape
    assert np.abs(pixels - expected).max() <= TOL


# ---------------------------------------------------------------- oracle comparisons

QWEN_SIZES = [
    (1, 1),
    (2, 3),
    (27, 29),
    (28, 28),
    (56, 56),
    (57, 113),
    (1000, 28),
    (28, 1000),
    (2800, 14),
    (333, 500),
    (640, 480),
    (1280, 7),
]
QWEN_SETTINGS = {
    "defaults": qwen_settings(),
    "small max_pixels": qwen_settings(min_pixels=784, max_pixels=20000),
    "patch 16": qwen_settings(
        patch_size=16, merge_size=2, temporal_patch_size=2, max_pixels=300000
    ),
    "merge 1 tps 1": qwen_settings(
        patch_size=14, merge_size=1, temporal_patch_size=1, min_pixels=196, max_pixels=90000
    ),
    "merge 3 tps 3": qwen_settings(
        patch_size=8,
        merge_size=3,
        temporal_patch_size=3,
        min_pixels=1000,
        max_pixels=60000,
        image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(QWEN_SETTINGS))
def test_qwen_matches_processor_over_sizes(name):
    settings = QWEN_SETTINGS[name]
    for i, (w, h) in enumerate(QWEN_SIZES):
        check_against_oracle(encode(make_image(w, h, seed=i), "PNG"), settings)


@pytest.mark.slow
def test_qwen_large_downscale_and_exif_orientation_ignored():
    image = make_image(3000, 2000, seed=7)
    exif = image.getexif()
    exif[0x0112] = 6  # "rotate 90": neither side applies it
    data = encode(image, "JPEG", quality=90, exif=exif)
    check_against_oracle(data, qwen_settings())
    assert probe(enc(data), source=SOURCE, file=FILE, max_source_pixels=1 << 30) == (3000, 2000)


LLAVA_SIZES = [
    (1, 1),
    (3, 2),
    (335, 337),
    (336, 336),
    (500, 333),
    (1000, 28),
    (28, 1000),
    (1023, 769),
    (2000, 1500),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [
        llava_settings(),
        llava_settings(image_size=224),
        llava_settings(
            image_size=70, patch_size=14, image_mean=(0.5, 0.4, 0.3), image_std=(0.2, 0.3, 0.4)
        ),
    ],
    ids=["llava-1.5", "224", "70"],
)
def test_llava_matches_clip_processor_over_sizes(settings):
    for i, (w, h) in enumerate(LLAVA_SIZES):
        fmt = "JPEG" if w * h > 1_000_000 else "PNG"
        check_against_oracle(encode(make_image(w, h, seed=i), fmt), settings)


MODES = [
    ("RGB", "PNG"),
    ("RGB", "JPEG"),
    ("RGB", "WEBP"),
    ("L", "PNG"),
    ("L", "JPEG"),
    ("1", "PNG"),
    ("RGBA", "PNG"),
    ("RGBA", "WEBP"),
    ("LA", "PNG"),
    ("P", "PNG"),
    ("P+transparency", "PNG"),
    ("P+transparency", "GIF"),
    ("CMYK", "JPEG"),
    ("I;16", "PNG"),
]


@pytest.mark.parametrize(("mode", "fmt"), MODES, ids=[f"{m}-{f}" for m, f in MODES])
def test_modes_and_formats_match_both_processors(mode, fmt):
    data = encode(make_image(97, 61, mode, seed=3), fmt)
    check_against_oracle(data, qwen_settings())
    check_against_oracle(data, llava_settings(image_size=56))


@pytest.mark.parametrize("mode", ["RGBA", "P+transparency", "L", "CMYK"])
def test_pixels_of_pil_images_in_any_mode(mode):
    image = make_image(45, 71, mode, seed=8)
    for images in (qwen_settings(), llava_settings(image_size=42)):
        processing = processing_for(images)
        pixels = processing.pixels(image, processing.plan(*image.size))
        ref = oracle(images)(image)
        expected = ref["pixel_values"] if images.layout == "qwen2_vl" else ref["pixel_values"][0]
        assert np.abs(pixels - expected).max() <= TOL


def test_transparency_is_composited_on_white():
    image = make_image(40, 30, "RGBA", seed=5)
    rgb = np.asarray(
        decode_rgb(enc(encode(image, "PNG")), source=SOURCE, file=FILE, max_source_pixels=1 << 20)
    )
    alpha = np.asarray(image)[..., 3]
    assert (rgb[alpha == 0] == 255).all()
    assert np.array_equal(
        rgb, transformers.image_transforms.convert_to_rgb(image, return_numpy=True)
    )
    palette = make_image(40, 30, "P+transparency", seed=5)
    rgb = np.asarray(to_rgb(Image.open(io.BytesIO(encode(palette, "PNG")))))
    index = np.asarray(palette) == palette.info["transparency"]
    assert index.any() and (rgb[index] == 255).all()


@settings(max_examples=15, deadline=None)
@given(
    w=st.integers(1, 300),
    h=st.integers(1, 300),
    seed=st.integers(0, 2**16),
    max_pixels=st.sampled_from([3136, 12544, 50176, 1003520]),
)
def test_qwen_property_random_sizes(w, h, seed, max_pixels):
    if max(w, h) / min(w, h) > 200:
        return
    check_against_oracle(
        encode(make_image(w, h, seed=seed), "PNG"), qwen_settings(max_pixels=max_pixels)
    )


# ---------------------------------------------------------------- plans


@settings(max_examples=300, deadline=None)
@given(
    w=st.integers(1, 20000),
    h=st.integers(1, 20000),
    factor=st.sampled_from([14, 28, 32, 56]),
    lo=st.integers(1, 10**5),
    hi=st.integers(1, 10**7),
)
def test_smart_resize_is_transformers(w, h, factor, lo, hi):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        smart_resize as reference,
    )

    lo, hi = min(lo, hi), max(lo, hi)
    try:
        expected = reference(h, w, factor, lo, hi)
    except ValueError:
        with pytest.raises(ValueError):
            smart_resize(h, w, factor, lo, hi)
        return
    assert smart_resize(h, w, factor, lo, hi) == expected


def test_token_counts_and_shapes():
    qwen = Qwen2VLProcessing(qwen_settings())
    plan = qwen.plan(1024, 768)
    t, gh, gw = plan.grid_thw
    assert (t, gh, gw) == (1, 54, 74) and plan.rows == t * gh * gw
    assert plan.tokens == t * gh * gw // 4 and (plan.width, plan.height) == (1036, 756)
    assert qwen.empty_pixels().shape == (0, 1176) and qwen.row_shape == (1176,)
    llava = LlavaProcessing(llava_settings())
    plan = llava.plan(1024, 768)
    assert plan.tokens == (336 // 14) ** 2 == 576 and plan.rows == 1
    assert plan.grid_thw == (1, 24, 24) and (plan.width, plan.height) == (336, 336)
    assert llava.empty_pixels().shape == (0, 3, 336, 336) and llava.plan(5, 7) == plan
    assert llava.lower_plans(1024, 768) == [plan] and llava.plan(9, 9, max_pixels=10) == plan
    assert isinstance(processing_for(llava_settings()), LlavaProcessing)


@pytest.mark.parametrize(("w", "h"), [(4000, 3000), (1000, 28), (57, 113), (1, 1), (640, 480)])
def test_lower_plans_decrease_to_min_pixels(w, h):
    settings = qwen_settings()
    qwen = Qwen2VLProcessing(settings)
    plans = qwen.lower_plans(w, h)
    assert plans[0] == qwen.plan(w, h) and plans == qwen.lower_plans(w, h)
    pixels = [p.width * p.height for p in plans]
    assert all(a > b for a, b in zip(pixels, pixels[1:]))
    assert all(a.tokens > b.tokens for a, b in zip(plans, plans[1:]))
    assert plans[-1] == qwen.plan(w, h, settings.min_pixels)
    budgeted = qwen.budgeted_plans(w, h)
    assert [plan for _, plan in budgeted] == plans and budgeted[0][0] == settings.max_pixels
    for budget, plan in budgeted:  # each is what the processor does under its budget
        assert qwen.plan(w, h, budget) == plan
        ref = transformers.Qwen2VLImageProcessorPil(max_pixels=budget)
        assert ref.get_number_of_image_patches(h, w) == plan.rows
    # no plan in between is skipped: any budget gives one of the listed plans
    rng = np.random.default_rng(0)
    for budget in rng.integers(settings.min_pixels, settings.max_pixels, 200):
        assert qwen.plan(w, h, int(budget)) in plans
    assert qwen.plan(w, h, 10**12) == plans[0] and qwen.plan(w, h, 1) == plans[-1]


def test_aspect_ratio_past_200_is_a_data_error():
    data = encode(make_image(201, 1), "PNG")
    with pytest.raises(ValueError, match="aspect ratio"):
        Qwen2VLProcessing(qwen_settings()).plan(201, 1)
    with pytest.raises(DataError) as err:
        ours(data, qwen_settings())
    assert_names(err.value)
    assert ours(data, llava_settings(image_size=28))[1].shape == (3, 28, 28)


# ---------------------------------------------------------------- errors


def assert_names(err: DataError) -> None:
    text = str(err)
    for part in (SOURCE, FILE, f"member {MEMBER} at byte offset {OFFSET}"):
        assert part in text, (part, text)
    assert err.source == SOURCE and err.file == FILE


def png_header(width: int, height: int, idat: bytes = b"") -> bytes:
    """A PNG signature and IHDR for an RGB image of any size, then `idat` as an IDAT chunk."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat)


def probe_of(data: bytes, max_source_pixels: int = 64 << 20) -> tuple[int, int]:
    return probe(enc(data), source=SOURCE, file=FILE, max_source_pixels=max_source_pixels)


def decode_of(data: bytes, max_source_pixels: int = 64 << 20) -> Image.Image:
    return decode_rgb(enc(data), source=SOURCE, file=FILE, max_source_pixels=max_source_pixels)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_image_probes_but_does_not_decode(fmt):
    data = encode(make_image(300, 200, seed=1), fmt)
    cut = data[: len(data) // 2]
    assert probe_of(cut) == (300, 200)  # the header alone
    with pytest.raises(DataError, match="truncated") as err:
        decode_of(cut)
    assert_names(err.value)
    with pytest.raises(DataError):
        ours(cut, qwen_settings())


@pytest.mark.parametrize(
    "data", [b"", bytes(range(256)) * 8, b"GIF89a"], ids=["empty", "byte-ramp", "gif-magic-only"]
)
def test_not_an_image(data):
    for call in (probe_of, decode_of):
        with pytest.raises(DataError) as err:
            call(data)
        assert_names(err.value)


def test_random_bytes_seeded():
    data = np.random.default_rng(3).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    with pytest.raises(DataError, match="not an image") as err:
        probe_of(data)
    assert_names(err.value)


def test_decompression_bomb_is_refused_from_the_header():
    bomb = png_header(20000, 20000, zlib.compress(b"\0" * 1000))
    assert len(bomb) < 100
    with pytest.raises(DataError, match="max_source_pixels") as err:
        probe_of(bomb)
    assert_names(err.value)
    with pytest.raises(DataError, match="max_source_pixels"):
        decode_of(bomb)


def test_pil_bomb_check_neither_warns_nor_raises_nor_is_changed():
    limit = Image.MAX_IMAGE_PIXELS
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a DecompressionBombWarning would raise
        # past PIL's warning limit, and past twice it (PIL raises there): the recipe decides
        assert probe_of(png_header(10000, 10000), 1 << 40) == (10000, 10000)
        assert probe_of(png_header(20000, 20000), 1 << 40) == (20000, 20000)
    assert Image.MAX_IMAGE_PIXELS == limit


def test_max_source_pixels_is_respected():
    data = encode(make_image(100, 50, seed=2), "PNG")
    assert probe_of(data, 5000) == (100, 50)
    assert decode_of(data, 5000).size == (100, 50)
    with pytest.raises(DataError, match="5,000 pixels"):
        probe_of(data, 4999)
    with pytest.raises(DataError, match="5,000 pixels"):
        decode_of(data, 4999)


def test_data_error_pickles_with_its_location():
    with pytest.raises(DataError) as err:
        probe_of(b"")
    again = pickle.loads(pickle.dumps(err.value))
    assert str(again) == str(err.value) and again.location == err.value.location


# ---------------------------------------------------------------- LazyImage


def lazy(data: bytes, settings: ImageSettings, extra_tokens: int = 2) -> LazyImage:
    return LazyImage.probe(
        enc(data),
        processing_for(settings),
        extra_tokens=extra_tokens,
        source=SOURCE,
        file=FILE,
        max_source_pixels=1 << 26,
    )


def test_lazy_image_tokens_replan_and_release():
    settings = qwen_settings()
    image = lazy(encode(make_image(640, 480, seed=4), "JPEG"), settings)
    assert image.size == (640, 480) and image.tokens == image.plan.tokens + 2
    smaller = image.replan(image.processing.lower_plans(640, 480)[3])
    assert smaller.tokens < image.tokens and smaller.size == image.size
    assert smaller.pixels().shape == (smaller.plan.rows, 1176)
    first = image.pixels()
    assert image.pixels() is first  # kept until released
    image.release()
    again = image.pixels()
    assert again is not first and np.array_equal(again, first)
    restored = pickle.loads(pickle.dumps(image))
    assert np.array_equal(restored.pixels(), first)


def test_prefetch_is_the_same_however_many_threads():
    datas = [encode(make_image(100 + 37 * i, 90 + 11 * i, seed=i), "JPEG") for i in range(12)]
    settings = qwen_settings(max_pixels=40000)
    inline = [lazy(d, settings).pixels() for d in datas]
    try:
        for threads in (1, 3):
            set_decode_threads(threads)
            images = [lazy(d, settings) for d in datas]
            for image in images:
                image.prefetch()
            for image, expected in zip(images, inline):
                assert np.array_equal(image.pixels(), expected)
    finally:
        set_decode_threads(min(4, os.cpu_count() or 1))


def test_prefetched_error_is_raised_by_pixels():
    data = encode(make_image(200, 100, seed=1), "PNG")
    image = lazy(data[: len(data) // 2], llava_settings())
    image.prefetch()
    with pytest.raises(DataError, match="truncated") as err:
        image.pixels()
    assert_names(err.value)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_pool_is_made_again_after_fork():
    data = encode(make_image(64, 64, seed=9), "PNG")
    image = lazy(data, qwen_settings())
    image.prefetch()
    expected = image.pixels()
    parent_pool = handle._decode_pool()
    pending = lazy(data, qwen_settings())
    pending._future = (os.getpid(), Future())  # prefetched here, never done in a child
    pid = os.fork()
    if pid == 0:  # child: a fresh pool that works
        signal.alarm(60)  # a hang kills the child, failing the test
        ok = handle._decode_pool() is not parent_pool
        child = lazy(data, qwen_settings())
        child.prefetch()
        ok = ok and np.array_equal(child.pixels(), expected)
        ok = ok and np.array_equal(pending.pixels(), expected)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert handle._decode_pool() is parent_pool
