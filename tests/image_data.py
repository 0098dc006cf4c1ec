"""Image+text test data: WebDataset tars whose captions name their sample.

Sample d's caption is the word `w{d}` repeated `length` times (as in helpers.py), and its
images are seeded noise of given sizes, so a batch's tokens say which sample they came from
and each image can be regenerated to compare its pixels with transformers' processors.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from helpers import EOS_ID, PAD_ID, VOCAB_WORDS, doc_text
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers

VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<image>"]


def make_vlm_tokenizer(path: Path, extra: tuple[str, ...] = ()) -> Path:
    """helpers.make_tokenizer's vocabulary plus Qwen2-VL's and LLaVA's image tokens (and
    `extra` special tokens after them, e.g. `<|video_pad|>`)."""
    vocab = {"<|endoftext|>": EOS_ID, "<pad>": PAD_ID}
    for i in range(VOCAB_WORDS):
        vocab[f"w{i}"] = len(vocab)
    for token in (*VISION_TOKENS, *extra):
        vocab[token] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|endoftext|>", "<pad>", *VISION_TOKENS, *extra])
    tok.save(str(path))
    return path


def vision_ids(path: Path, extra: tuple[str, ...] = ()) -> dict[str, int]:
    tok = Tokenizer.from_file(str(path))
    return {name: tok.token_to_id(name) for name in (*VISION_TOKENS, *extra)}


@dataclass
class Sample:
    doc: int
    length: int
    sizes: list[tuple[int, int]] = field(default_factory=list)  # (width, height) per image
    mode: str = "RGB"
    fmt: str = "png"
    marker: bool = False  # put "<image>" markers in the caption (one per image, spread out)

    def caption(self) -> str:
        words = doc_text(self.doc, self.length).split()
        if not self.marker:
            return " ".join(words)
        out = []
        for i, word in enumerate(words):
            if i < len(self.sizes):
                out.append("<image>")
            out.append(word)
        out += ["<image>"] * (len(self.sizes) - min(len(self.sizes), len(words)))
        return " ".join(out)


def make_image(doc: int, index: int, size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng([doc, index, size[0], size[1]])
    w, h = size
    if mode in ("RGBA", "LA"):
        channels = 4 if mode == "RGBA" else 2
        return Image.fromarray(rng.integers(0, 256, (h, w, channels), dtype=np.uint8), mode)
    rgb = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
    return rgb.convert(mode) if mode != "RGB" else rgb


def encode_image(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    if fmt in ("jpg", "jpeg") and image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    image.save(out, format={"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}[fmt])
    return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def write_tar(path: Path, samples: list[Sample], *, text: str = "txt") -> Path:
    """One WebDataset shard: `<key>.txt` (or json) plus `<key>.<ext>` / `<key>.<n>.<ext>`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for s in samples:
            key = f"s{s.doc:06d}"
            for i, size in enumerate(s.sizes):
                name = f"{key}.{s.fmt}" if len(s.sizes) == 1 else f"{key}.{i}.{s.fmt}"
                _add(tar, name, encode_image(make_image(s.doc, i, size, s.mode), s.fmt))
            if text == "txt":
                _add(tar, f"{key}.txt", s.caption().encode())
            else:
                _add(tar, f"{key}.json", json.dumps({text: s.caption()}).encode())
    return path
