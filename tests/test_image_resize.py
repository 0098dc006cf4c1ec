"""`images.resize: torchvision`: pixels equal to transformers' torchvision image processors.

The oracles are `Qwen2VLImageProcessor` and `CLIPImageProcessor` (torchvision-backed; the venv's
torchvision is the shimmed one of the Makefile), given the same files opened with PIL: real
pictures from Debian packages on this machine (clip art, icons, charts; those missing are
skipped) and generated photo-like images. mixer itself does not import torchvision.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_image_processing import ours, random_rgb
from test_images_loader import corpus  # noqa: F401 (a fixture)
from test_images_loader import recipe_of, take

import mixer
from mixer.config.images import ImageSettings
from mixer.images.processing import processing_for
from mixer.images.resize import torch_resized

transformers = pytest.importorskip("transformers")
pytest.importorskip("torchvision")

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


def oracle(settings: ImageSettings):
    if settings.layout == "llava":
        side = settings.image_size
        return transformers.CLIPImageProcessor(
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
        assert np.abs(pixels - expected).max() <= 1e-6, path
        if settings.layout != "llava":
            assert ref["image_grid_thw"].tolist() == [list(image.plan.grid_thw)], path
        decoded = Image.open(io.BytesIO(data))
        differs |= not np.array_equal(pil.pixels(decoded, image.plan), pixels)
        seen += 1
    assert seen >= 4
    assert differs, "pil and torchvision resampling must differ on some image"


def test_resized_uint8_equals_torchvision_resize():
    import torch
    from torchvision.transforms.v2 import functional as tvF

    for path, data in FILES:
        if data is None:
            continue
        image = Image.open(io.BytesIO(data)).convert("RGB")
        for width, height in ((224, 168), (37, 530), (min(image.width * 2, 700), image.height // 2 + 3)):
            tensor = torch.from_numpy(np.asarray(image)).permute(2, 0, 1).contiguous()
            expected = tvF.resize(
                tensor, [height, width], interpolation=tvF.InterpolationMode.BICUBIC
            )
            got = torch_resized(image, width, height)
            assert np.abs(got.astype(int) - expected.numpy().astype(int)).max() == 0, path


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


@pytest.mark.parametrize("layout", ["qwen2_vl", "llava"])
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
    with pytest.raises(mixer.StateError, match="resize"):
        mixer.build_loader(recipe_of(corpus, layout=layout)).load_state_dict(first.state_dict())
