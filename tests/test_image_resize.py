"""`images.resize: torchvision`: pixels equal to transformers' torchvision image processors.

The oracles are `Qwen2VLImageProcessor` and `CLIPImageProcessor` (torchvision-backed; the venv's
torchvision is the shimmed one of the Makefile), given the same files opened with PIL: real
pictures from Debian packages on this machine (clip art, icons, charts; those missing are
skipped) and generated photo-like images. mixer itself does not import torchvision.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from image_data import encode_image, vision_ids
from image_data import make_image as sample_image
from PIL import Image
from test_image_processing import encode, make_image, ours, random_rgb
from test_images_loader import (
    _images_by_sample,
    corpus,  # noqa: F401 (a fixture)
    recipe_of,
    take,
)

import mixer
from mixer.config.images import ImageSettings
from mixer.images.processing import processing_for
from mixer.images.resize import torch_resized
from mixer.runtime.state import unpack

transformers = pytest.importorskip("transformers")
# the oracles (transformers' torchvision processors) need it; mixer does not
needs_torchvision = pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is None, reason="torchvision is not installed"
)

# Debian's pictures (debconf's logo, Adwaita icons, espeak-ng's and node's documentation)
REAL = [
    "/usr/share/pixmaps/debian-logo.png",
    "/usr/share/icons/Adwaita/512x512/places/folder-pictures.png",
    "/usr/share/doc/espeak-ng/docs/images/sand-light.jpg",
    "/usr/share/doc/python3-pip/html/topics/deps.png",
    "/usr/share/doc/nodejs/contributing/doc_img/scatter-plot.png",
]


def generated(width: int, height: int, seed: int) -> bytes:
    """A photo-like JPEG: smooth gradients and noise."""
    buf = io.BytesIO()
    Image.fromarray(random_rgb(width, height, seed)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def files() -> list[tuple[str, bytes | None]]:
    out = [(p, Path(p).read_bytes() if Path(p).exists() else None) for p in REAL]
    sizes = [(333, 500), (1000, 61), (640, 480), (29, 27)]
    return out + [(f"generated {w}x{h}", generated(w, h, i)) for i, (w, h) in enumerate(sizes)]


FILES = files()
SETTINGS = {
    "qwen2_vl": ImageSettings(layout="qwen2_vl", resize="torchvision", max_pixels=400_000),
    "qwen2_vl patch 16": ImageSettings(
        layout="qwen2_vl",
        resize="torchvision",
        patch_size=16,
        min_pixels=1000,
        max_pixels=200_000,
        image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5),
    ),
    "llava": ImageSettings(layout="llava", resize="torchvision"),
}


@functools.cache
def oracle(settings: ImageSettings, llava_class: bool = False):
    """The torchvision processor of the layout (qwen2_5_vl's is Qwen2VLImageProcessor; llava's
    CLIPImageProcessor, or LlavaImageProcessor, which without do_pad is the same)."""
    if settings.layout == "llava":
        side = settings.image_size
        kind = transformers.LlavaImageProcessor if llava_class else transformers.CLIPImageProcessor
        return kind(
            size={"shortest_edge": side},
            crop_size={"height": side, "width": side},
            image_mean=list(settings.image_mean),
            image_std=list(settings.image_std),
        )
    return transformers.Qwen2VLImageProcessor(
        patch_size=settings.patch_size,
        merge_size=settings.merge_size,
        temporal_patch_size=settings.temporal_patch_size,
        size={"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels},
        image_mean=list(settings.image_mean),
        image_std=list(settings.image_std),
    )


MODES = ["RGB", "RGBA", "LA", "P", "P+transparency", "I;16", "L", "1", "CMYK"]


@st.composite
def cases(draw) -> tuple[ImageSettings, int, int]:
    """A layout with its settings and an image size: aspect ratios from 1 to 150 either way,
    sides from 1 pixel, images smaller and larger than the layout's target."""
    layout = draw(st.sampled_from(["qwen2_vl", "qwen2_5_vl", "llava"]))
    long_side = draw(st.integers(1, 700))
    ratio = draw(st.floats(1.0, 150.0))
    short_side = max(round(long_side / ratio), -(-long_side // 150))  # (ratio <= 150 at 1 px)
    width, height = draw(st.permutations([long_side, short_side]))
    gray = draw(st.booleans())
    stats = {"image_mean": (0.5, 0.5, 0.5), "image_std": (0.5, 0.5, 0.5)} if gray else {}
    if layout == "llava":
        patch = draw(st.sampled_from([14, 16]))
        side = patch * draw(st.integers(1, 24))
        return (
            ImageSettings(
                layout="llava", resize="torchvision", image_size=side, patch_size=patch, **stats
            ),
            width,
            height,
        )
    patch = draw(st.sampled_from([14, 16]))
    factor = patch * 2
    most = draw(st.integers(4, 400)) * factor * factor
    least = min(most, draw(st.integers(1, 16)) * factor * factor)
    chosen = ImageSettings(
        layout=layout,
        resize="torchvision",
        patch_size=patch,
        min_pixels=least,
        max_pixels=most,
        **stats,
    )
    return chosen, width, height


@needs_torchvision
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), mode=st.sampled_from(MODES), seed=st.integers(0, 2**16))
def test_any_size_and_mode_equals_the_torchvision_processor_exactly(case, mode, seed):
    chosen, width, height = case
    data = encode(make_image(width, height, mode, seed), "JPEG" if mode == "CMYK" else "PNG")
    image, pixels = ours(data, chosen)
    for llava_class in (False, True) if chosen.layout == "llava" else (False,):
        ref = oracle(chosen, llava_class)(Image.open(io.BytesIO(data)), return_tensors="np")
        expected = ref["pixel_values"] if chosen.layout != "llava" else ref["pixel_values"][0]
        assert pixels.shape == expected.shape
        assert np.abs(pixels - expected).max() == 0.0
        if chosen.layout != "llava":
            assert ref["image_grid_thw"].tolist() == [list(image.plan.grid_thw)]


@needs_torchvision
@pytest.mark.parametrize("name", list(SETTINGS))
def test_pixels_equal_the_torchvision_processor(name):
    settings = SETTINGS[name]
    processor = oracle(settings)
    pil = processing_for(settings.model_copy(update={"resize": "pil"}))
    seen, differs = 0, False
    for path, data in FILES:
        if data is None:
            continue
        image, pixels = ours(data, settings)
        ref = processor(Image.open(io.BytesIO(data)), return_tensors="np")
        expected = ref["pixel_values"] if settings.layout != "llava" else ref["pixel_values"][0]
        assert pixels.dtype == np.float32 and pixels.shape == expected.shape, path
        assert np.abs(pixels - expected).max() == 0.0, path
        if settings.layout != "llava":
            assert ref["image_grid_thw"].tolist() == [list(image.plan.grid_thw)], path
        decoded = Image.open(io.BytesIO(data))
        differs |= not np.array_equal(pil.pixels(decoded, image.plan), pixels)
        seen += 1
    assert seen >= 4
    assert differs, "pil and torchvision resampling must differ on some image"


@needs_torchvision
def test_resized_uint8_equals_torchvision_resize():
    import torch
    from torchvision.transforms.v2 import functional as tvF

    for path, data in FILES:
        if data is None:
            continue
        image = Image.open(io.BytesIO(data)).convert("RGB")
        for width, height in (
            (224, 168),
            (37, 530),
            (min(image.width * 2, 700), image.height // 2 + 3),
        ):
            tensor = torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous()
            expected = tvF.resize(
                tensor, [height, width], interpolation=tvF.InterpolationMode.BICUBIC
            )
            got = torch_resized(image, width, height)
            assert np.abs(got.astype(int) - expected.numpy().astype(int)).max() == 0, path


@pytest.mark.parametrize("value", ["lanczos", "PIL", "", None, 1])
def test_recipe_refuses_an_unknown_resize_naming_the_field(value):
    recipe = {
        "tokenizer": "tok.json",
        "seq_len": 8,
        "batch_size": 2,
        "images": {"layout": "qwen2_vl", "resize": value},
        "sources": [{"name": "a", "path": "a/*.tar", "weight": 1}],
    }
    with pytest.raises(mixer.RecipeError) as err:
        mixer.load_recipe(recipe)
    assert "images.resize:" in str(err.value)
    for good in ("pil", "torchvision"):
        recipe["images"]["resize"] = good
        assert mixer.load_recipe(recipe).images.resize == good


@pytest.mark.slow
def test_mixer_does_not_import_torchvision(tmp_path):
    data = FILES[-1][1]
    (tmp_path / "image.jpg").write_bytes(data)
    code = (
        "import sys\n"
        "from PIL import Image\n"
        "from mixer.config.images import ImageSettings\n"
        "from mixer.images.processing import processing_for\n"
        "for layout in ('qwen2_vl', 'llava'):\n"
        "    p = processing_for(ImageSettings(layout=layout, resize='torchvision'))\n"
        f"    image = Image.open({str(tmp_path / 'image.jpg')!r})\n"
        "    p.pixels(image, p.plan(*image.size))\n"
        "assert 'torchvision' not in sys.modules, 'torchvision imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_elongated_llava_image_is_refused_under_torchvision():
    settings = ImageSettings(layout="llava", resize="torchvision", max_source_pixels=1 << 20)
    with pytest.raises(ValueError, match="max_source_pixels"):
        processing_for(settings).plan(3, 4000)
    processing_for(settings.model_copy(update={"resize": "pil"})).plan(3, 4000)


@needs_torchvision
@pytest.mark.parametrize("layout", ["qwen2_vl", "qwen2_5_vl"])
def test_loader_pixels_equal_the_torchvision_processor(corpus, layout):  # noqa: F811
    root, tokenizer, samples, _ = corpus
    start = vision_ids(tokenizer)["<|vision_start|>"]
    by_doc = {s.doc: s for s in samples}
    processor = transformers.Qwen2VLImageProcessor(min_pixels=784, max_pixels=112 * 112)
    recipe = recipe_of(corpus, layout=layout, resize="torchvision")
    recipe["sources"] = recipe["sources"][:1]
    recipe["sources"][0]["epochs"] = 1
    compared = 0
    for batch in take(mixer.build_loader(recipe), None):
        at = 0
        for (doc, index), grid in zip(
            _images_by_sample(batch, start), batch["image_grid_thw"].tolist()
        ):
            sample = by_doc[doc]
            image = sample_image(doc, index, sample.sizes[index], sample.mode)
            if sample.fmt != "png":  # lossy: compare with what the tar holds
                image = Image.open(io.BytesIO(encode_image(image, sample.fmt)))
            expected = processor(images=[image], return_tensors="np")
            rows = int(np.prod(grid))
            assert grid == expected["image_grid_thw"][0].tolist()
            got = batch["pixel_values"][at : at + rows].numpy()
            assert np.abs(got - expected["pixel_values"]).max() == 0.0
            at += rows
            compared += 1
        assert at == batch["pixel_values"].shape[0]
    assert compared == sum(len(s.sizes) for s in samples)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["qwen2_vl", "qwen2_5_vl", "llava"])
def test_torchvision_resize_resumes_exactly_and_elastically(corpus, layout):  # noqa: F811
    recipe = recipe_of(corpus, layout=layout, resize="torchvision")
    pil = take(mixer.build_loader(recipe_of(corpus, layout=layout)), 8)
    full = take(mixer.build_loader(recipe), 8)
    for a, b in zip(pil, full):  # the same tokens, other pixels
        assert a["input_ids"].equal(b["input_ids"])
    assert any(not a["pixel_values"].equal(b["pixel_values"]) for a, b in zip(pil, full))
    first = mixer.build_loader(recipe, num_workers=1)
    take(first, 3)
    resumed = mixer.build_loader(recipe)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for got, want in zip(take(resumed, 5), full[3:]):
        assert all(got[k].equal(want[k]) for k in want)
    states = []
    for rank in range(2):
        loader = mixer.build_loader(recipe, rank=rank, world_size=2)
        take(loader, 2)
        states.append(loader.state_dict())
    single = mixer.build_loader(recipe)
    single.load_state_dict(mixer.merge_states(states))
    for got, want in zip(take(single, 4), full[4:]):
        assert all(got[k].equal(want[k]) for k in want)
    with pytest.raises(mixer.StateError, match="images.resize"):
        mixer.build_loader(recipe_of(corpus, layout=layout)).load_state_dict(first.state_dict())
    # the default is not in the fingerprint (image states stay those of test_golden.py)
    default = mixer.build_loader(recipe_of(corpus, layout=layout))
    take(default, 2)
    saved = default.state_dict()
    assert "resize" not in unpack(saved)["fingerprint"]["stream"]["images"]
    assert unpack(first.state_dict())["fingerprint"]["stream"]["images"]["resize"] == "torchvision"
    explicit = mixer.build_loader(recipe_of(corpus, layout=layout, resize="pil"))
    explicit.load_state_dict(saved)
    for got, want in zip(take(explicit, 2), take(default, 2)):
        assert all(got[k].equal(want[k]) for k in want)
