"""A WebDataset source of which no sample is usable is an error naming it, never a hang."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from deadline import deadline
from helpers import corpus, write_docs
from image_data import make_vlm_tokenizer

import mixer

IMAGE_LAYOUTS = {
    "llava": {"layout": "llava", "image_size": 28},
    "qwen2_vl": {"layout": "qwen2_vl", "min_pixels": 784, "max_pixels": 3136},
}


@pytest.fixture
def vlm(tmp_path) -> Path:
    return make_vlm_tokenizer(tmp_path / "vlm.json")


# -- webdataset sources without a usable sample ------------------------------------------


def _tars(folder: Path, members: list[tuple[str, bytes]]) -> Path:
    folder.mkdir()
    for k in range(3):
        with tarfile.open(folder / f"{k}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for j in range(2):
                for name, data in members:
                    info = tarfile.TarInfo(name.format(f"{k}_{j}"))
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return folder / "*.tar"


HOLLOW = {  # members of every sample; images block; what on_error: raise names
    "bad UTF-8": ([("s{}.txt", b"\xff\xfe")], None, "not valid UTF-8"),
    "no text": ([("s{}.png", b"png"), ("s{}.cls", b"1")], "qwen2_vl", "sample without text"),
    "json without the field": ([("s{}.json", b'{"other": 1}')], None, "sample without text"),
    "images without an images block": (
        [("s{}.png", b"png"), ("s{}.txt", b"w1")],
        None,
        "no `images:` block",
    ),
    "corrupt images": (
        [("s{}.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 40), ("s{}.txt", b"w1")],
        "llava",
        "image",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(HOLLOW))
@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_an_unlimited_webdataset_source_without_a_usable_sample_is_an_error_not_a_hang(
    tmp_path, vlm, case, on_error
):
    members, layout, words = HOLLOW[case]
    write_docs(tmp_path / "good.jsonl", corpus(0, 20), "jsonl")
    recipe = {
        "tokenizer": str(vlm),
        "seq_len": 64,
        "batch_size": 1,
        "lanes": 2,
        "sources": [
            {"name": "good", "path": str(tmp_path / "good.jsonl"), "weight": 1},
            {
                "name": "hollow",
                "path": str(_tars(tmp_path / "w", members)),
                "weight": 1,
                "on_error": on_error,
            },
        ],
    }
    if layout is not None:
        recipe["images"] = IMAGE_LAYOUTS[layout]
    expected = "yields no document" if on_error == "skip" else words
    workers = 2 if case == "no text" else 0
    with deadline(60), pytest.raises(mixer.DataError, match=expected) as err:
        for _ in mixer.build_loader(recipe, num_workers=workers):
            pass
    assert err.value.source == "hollow"
