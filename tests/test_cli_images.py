"""`mixer inspect`, `preview` and `bench` on image+text recipes (and the bundled demo)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import doc_text
from image_data import Sample, make_image, make_vlm_tokenizer, write_tar
from PIL import Image

from mixer.tools.cli import main

ROOT = Path(__file__).resolve().parent.parent
# Sides are multiples of 28 inside [min_pixels, max_pixels]: qwen2_vl keeps each size, so a
# saved image must equal its original. Placeholder tokens: (w/28)·(h/28).
SAMPLES = [
    Sample(1, 5, [(56, 56)]),
    Sample(2, 4, [(84, 112)]),
    Sample(3, 6, [(56, 56), (84, 56)]),  # no marker: both images first
    Sample(4, 3, [(112, 84)], marker=True),
]
PLACEHOLDERS = {
    "<image 56x56 → 4 tokens>": 2,
    "<image 84x112 → 12 tokens>": 1,
    "<image 84x56 → 6 tokens>": 1,
    "<image 112x84 → 12 tokens>": 1,
}
IMAGES = sum(len(s.sizes) for s in SAMPLES)


def recipe_file(
    tmp_path: Path, samples: list[Sample], *, layout: str = "qwen2_vl", text: bool = False
) -> Path:
    tokenizer = make_vlm_tokenizer(tmp_path / "tokenizer.json")
    write_tar(tmp_path / "pics" / "shard-000.tar", samples)
    sources = [{"name": "pics", "path": str(tmp_path / "pics" / "*.tar"), "weight": 1, "epochs": 1}]
    if text:
        (tmp_path / "prose.jsonl").write_text(
            "".join(json.dumps({"text": " ".join([f"w{900 + i}"] * 9)}) + "\n" for i in range(20))
        )
        sources.append(
            {"name": "prose", "path": str(tmp_path / "prose.jsonl"), "weight": 1, "epochs": 1}
        )
    recipe = {
        "seed": 3,
        "tokenizer": str(tokenizer),
        "seq_len": 64,
        "batch_size": 2,
        "lanes": 1,
        "images": {"layout": layout, "min_pixels": 784, "max_pixels": 112 * 112, "image_size": 56},
        "sources": sources,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_inspect_reports_images_and_image_tokens_without_decoding(tmp_path, capsys):
    # sample 5's PNG keeps its header but its pixel data is zeroed: planning reads headers
    # only, so inspect counts it like any other (decoding it would be an error)
    path = recipe_file(tmp_path, [*SAMPLES, Sample(5, 2, [(56, 84)])], text=True)
    tar = tmp_path / "pics" / "shard-000.tar"
    data = bytearray(tar.read_bytes())
    idat = data.find(b"IDAT", data.find(b"s000005.png"))
    data[idat + 4 : idat + 200] = bytes(196)
    tar.write_bytes(bytes(data))
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["layout"] == "qwen2_vl"
    rows = {r["name"]: r for r in report["sources"]}
    pics = rows["pics"]
    assert pics["sampled_documents"] == 5
    assert pics["images_per_doc"] == pytest.approx(6 / 5)
    # placeholder tokens (w/28)(h/28): 4 + 12 + (4 + 6) + 12 + 6
    assert pics["image_tokens_per_doc"] == pytest.approx(44 / 5)
    assert pics["sampled_oversize"] == 0 and pics["sampled_rejected"] == 0
    assert pics["est_images"] > 0 and pics["est_image_tokens"] > 0
    # sequence tokens include the image tokens, with <|vision_start|>/<|vision_end|>
    assert pics["est_tokens"] >= pics["est_image_tokens"] + 2 * pics["est_images"]
    assert 0 < pics["image_token_share"] < 1
    assert rows["prose"]["images_per_doc"] == 0 and rows["prose"]["est_image_tokens"] == 0
    assert main(["inspect", str(path)]) == 0
    table = capsys.readouterr().out
    assert "images under the qwen2_vl layout" in table and "image tok/doc" in table


class TextFirst(Sample):
    """A caption with its image marker at the end."""

    def caption(self) -> str:
        return doc_text(self.doc, self.length) + " <image>"


def test_inspect_counts_oversize_documents(tmp_path, capsys):
    # 90 caption tokens before the image do not fit seq_len 64 (only text after the last
    # image may be cut)
    path = recipe_file(tmp_path, [Sample(1, 3, [(56, 56)]), TextFirst(2, 90, [(56, 56)])])
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 of 2 sampled documents do not fit seq_len 64" in out


def _saved(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.png"))


def test_preview_shows_placeholders_and_saves_the_model_view(tmp_path, capsys):
    path = recipe_file(tmp_path, SAMPLES)
    folder = tmp_path / "shown"
    assert main(["preview", str(path), "-n", "20", "--save-images", str(folder)]) == 0
    out = capsys.readouterr().out
    for placeholder, count in PLACEHOLDERS.items():
        assert out.count(placeholder) == count, (placeholder, out)
    assert "<|image_pad|>" not in out and "<|vision_start|>" not in out
    assert len(re.findall(r"<image \d+x\d+ → \d+ tokens>", out)) == IMAGES
    assert f"saved {IMAGES} image(s)" in out
    files = _saved(folder)
    assert len(files) == IMAGES
    originals = [
        np.asarray(make_image(s.doc, i, size)) for s in SAMPLES for i, size in enumerate(s.sizes)
    ]
    for file in files:
        assert re.fullmatch(r"batch\d{4}-row\d{2}-image\d{3}-pics\.png", file.name)
        saved = np.asarray(Image.open(file)).astype(int)
        # unchanged size: the model's view is the stored image (float rounding aside)
        assert any(o.shape == saved.shape and np.abs(o - saved).max() <= 1 for o in originals)


def test_preview_llava_splits_adjacent_images(tmp_path, capsys):
    path = recipe_file(tmp_path, SAMPLES, layout="llava")
    folder = tmp_path / "shown"
    assert main(["preview", str(path), "-n", "20", "--save-images", str(folder)]) == 0
    out = capsys.readouterr().out
    # sample 3's two images are adjacent: one run of 2 × 16 <image> tokens
    assert out.count("<image 56x56 → 16 tokens>") == IMAGES
    files = _saved(folder)
    assert len(files) == IMAGES
    for file in files:
        with Image.open(file) as image:
            assert image.size == (56, 56) and image.mode == "RGB"


def test_preview_cuts_text_but_not_placeholders(tmp_path, capsys):
    path = recipe_file(tmp_path, SAMPLES)
    assert main(["preview", str(path), "-n", "1", "--chars", "5"]) == 0
    out = capsys.readouterr().out
    body = out.splitlines()[1]
    assert body.endswith(" …") and len(body) < 60


def test_bench_counts_images(tmp_path, capsys):
    path = recipe_file(tmp_path, SAMPLES, text=True)
    assert main(["bench", str(path), "--batches", "50", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["images"] == IMAGES and result["images_per_s"] > 0
    assert result["oversize"] == {"pics": 0, "prose": 0}


def test_help_names_the_image_options(capsys):
    with pytest.raises(SystemExit):
        main(["preview", "--help"])
    assert "--save-images" in capsys.readouterr().out


@pytest.mark.slow
def test_bundled_multimodal_demo(tmp_path, capsys):
    recipe = str(ROOT / "recipes" / "multimodal_demo.yaml")
    assert main(["inspect", recipe, "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["sources"]}
    assert set(rows) == {"pictures", "prose", "code"}
    assert rows["pictures"]["images_per_doc"] >= 1 and rows["pictures"]["est_images"] > 0
    assert rows["pictures"]["sampled_oversize"] == rows["pictures"]["sampled_rejected"] == 0
    assert rows["prose"]["images_per_doc"] == 0
    folder = tmp_path / "demo"
    assert main(["preview", recipe, "-n", "1", "--chars", "300", "--save-images", str(folder)]) == 0
    out = capsys.readouterr().out
    shown = len(re.findall(r"<image \d+x\d+ → \d+ tokens>", out))
    assert shown > 0 and "[pictures]" in out
    files = _saved(folder)
    assert len(files) >= shown
    for file in files:
        Image.open(io.BytesIO(file.read_bytes())).verify()
