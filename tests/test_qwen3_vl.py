"""The qwen3_vl layout: batches equal to transformers' Qwen3VLProcessor (its image processor and
Qwen3VLVideoProcessor) on real image and video files written here, packed rows that train like
their documents alone in a tiny random Qwen3-VL, and exact resume of a video recipe."""

from __future__ import annotations

import io
import itertools
import json
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import EOS_ID
from image_data import encode_image, make_image
from PIL import Image
from test_images_loader import assert_elastic_resume, digests, take
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from video_data import decoded, encode_video, frame

import mixer
from mixer.config.images import ImageSettings
from mixer.images import qwen3_vl
from mixer.images.video_decode import VideoInfo

# Qwen2's (and Qwen3's) pre-tokenizer: byte-level BPE after this split.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ("<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
IMAGE_BLOCK = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_BLOCK = "<|vision_start|><|video_pad|><|vision_end|>"
SEQ_LEN = 512
IMAGES = {"min_pixels": 32 * 32, "max_pixels": 64 * 64}
VIDEO = {"fps": 2.5, "min_pixels": 2 * 32 * 32, "max_pixels": 4 * 64 * 64}


def make_bpe_tokenizer(path: Path) -> Path:
    """A small byte-level BPE with Qwen2's pre-tokenizer and Qwen-VL's special tokens, trained
    on text with timestamps (so that ` <` and `:<`-like merges exist, as in Qwen's vocab)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    corpus = [f"<{t / 10:.1f} seconds> look: at <this>, then (that) <" for t in range(200)]
    corpus += ["the quick brown fox jumps over the lazy dog; a video <", "Look: <", "so <<"] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(path))
    return path


@dataclass
class Doc:
    """A sample: its text (with `<image>` / `<video>` markers or none) and its media."""

    key: str
    text: str
    images: list[tuple[int, int]] = field(default_factory=list)  # (width, height)
    videos: list[tuple[int, int, int]] = field(default_factory=list)  # (width, height, frames)

    def image(self, i: int) -> Image.Image:
        return make_image(int(self.key[1:]), i, self.images[i])

    def video_frames(self, i: int) -> list[np.ndarray]:
        width, height, frames = self.videos[i]
        return [frame(int(self.key[1:]), i, f, width, height) for f in range(frames)]


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 0
    tar.addfile(info, io.BytesIO(data))


def write_docs_tar(path: Path, docs: list[Doc]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for doc in docs:
            for i in range(len(doc.images)):
                _add(tar, f"{doc.key}.{i}.png", encode_image(doc.image(i), "png"))
            for i in range(len(doc.videos)):
                _add(tar, f"{doc.key}.{len(doc.images) + i}.mp4", encode_video(doc.video_frames(i)))
            _add(tar, f"{doc.key}.txt", doc.text.encode())


DOCS = [
    Doc("s000001", "Look at this: <video> and then <image>, ok.", [(48, 40)], [(64, 48, 21)]),
    Doc("s000002", "two clips:<video> <video>", [], [(20, 40, 9), (64, 64, 30)]),
    Doc("s000003", "no markers, a clip first", [], [(48, 48, 12)]),
    Doc(
        "s000004",
        "the lazy dog <image> <image> and a video<video>",
        [(40, 64), (33, 20)],
        [(40, 40, 7)],
    ),
    Doc("s000005", "the quick brown fox jumps over the lazy dog", []),
    Doc("s000006", "a video <video>; then more (words)", [], [(32, 48, 16)]),
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("qwen3")
    tokenizer = make_bpe_tokenizer(root / "tokenizer.json")
    write_docs_tar(root / "docs" / "shard-000.tar", DOCS[:3])
    write_docs_tar(root / "docs" / "shard-001.tar", DOCS[3:])
    return root, tokenizer


def recipe_of(corpus, *, packing="concat", epochs=None, video=None, **images) -> dict:
    root, tokenizer = corpus
    return {
        "seed": 5,
        "tokenizer": str(tokenizer),
        "seq_len": SEQ_LEN,
        "batch_size": 2,
        "lanes": 2,
        "packing": packing,
        "shuffle_window": 2,
        "images": {"layout": "qwen3_vl", **IMAGES, "video": video or VIDEO, **images},
        "sources": [
            {"name": "docs", "path": str(root / "docs" / "*.tar"), "weight": 1, "epochs": epochs}
        ],
    }


def ids_of(tokenizer: Path) -> dict[str, int]:
    tok = Tokenizer.from_file(str(tokenizer))
    return {name: tok.token_to_id(name) for name in SPECIALS}


# -- defaults and the processor's formulas --------------------------------------------------------


def test_defaults_are_qwen3_vls_processors_and_recipe_keys_win():
    from transformers import Qwen3VLVideoProcessor

    settings = ImageSettings(layout="qwen3_vl", video={})
    video = settings.video
    theirs = Qwen3VLVideoProcessor()
    assert video is not None
    assert (settings.patch_size, settings.merge_size, settings.temporal_patch_size) == (
        theirs.patch_size,
        theirs.merge_size,
        theirs.temporal_patch_size,
    )
    assert list(settings.image_mean) == list(theirs.image_mean)
    assert list(settings.image_std) == list(theirs.image_std)
    assert (video.min_pixels, video.max_pixels) == (
        theirs.size["shortest_edge"],
        theirs.size["longest_edge"],
    )
    assert (video.fps, video.min_frames, video.max_frames, video.max_video_tokens) == (
        theirs.fps,
        theirs.min_frames,
        theirs.max_frames,
        theirs.max_video_tokens,
    )
    assert (settings.min_pixels, settings.max_pixels) == (65536, 16777216)
    # another layout keeps its own defaults; a key the recipe sets wins
    assert ImageSettings(layout="qwen2_vl").patch_size == 14
    set_ = ImageSettings(layout="qwen3_vl", patch_size=14, video={"fps": 1.0, "max_pixels": 999999})
    assert set_.patch_size == 14 and set_.video is not None
    assert (set_.video.fps, set_.video.max_pixels, set_.video.min_frames) == (1.0, 999999, 4)


def test_sampling_resize_and_timestamps_follow_the_processor():
    """Frame indices, the volume smart_resize (cap or not) and the timestamps equal
    Qwen3VLVideoProcessor's and Qwen3VLProcessor's over a grid of videos."""
    from transformers import Qwen3VLVideoProcessor
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize
    from transformers.video_utils import VideoMetadata

    compared = 0
    for fps, cap in itertools.product((0.5, 2.0, 3.5), (False, True)):
        settings = ImageSettings(layout="qwen3_vl", video={"fps": fps, "cap_pixels_per_frame": cap})
        processing = qwen3_vl.Qwen3VideoProcessing(settings)
        processor = Qwen3VLVideoProcessor(fps=fps)
        for total, rate, (w, h) in itertools.product(
            (1, 2, 5, 9, 40, 161), (10.0, 24.0, 29.97), ((64, 48), (20, 300), (900, 500))
        ):
            assert settings.video is not None
            n = qwen3_vl.sample_count(total, rate, settings.video)
            meta = VideoMetadata(total_num_frames=total, fps=rate)
            want = processor.sample_frames(meta, fps=fps).tolist()
            if n < 2:  # the processor's smart_resize refuses it; so does the plan
                with pytest.raises(ValueError, match="temporal patch"):
                    processing.plan(VideoInfo(w, h, total, rate))
                continue
            plan = processing.plan(VideoInfo(w, h, total, rate))
            assert plan.indices == want, (total, rate, fps)
            factor = 32
            max_pixels = processing.max_pixels(n)
            if cap:
                per_frame = max(min(768 * factor**2, 786432 // n), int(131072 * 1.05))
                assert max_pixels == per_frame * n
            assert (plan.height, plan.width) == smart_resize(n, h, w, 2, factor, 131072, max_pixels)
            assert plan.grid_thw == (-(-n // 2), plan.height // 16, plan.width // 16)
            stamps = Qwen3VLProcessor._calculate_timestamps(None, want, rate, 2)  # type: ignore[arg-type]
            assert plan.timestamps == stamps
            compared += 1
    assert compared > 250, compared


# -- batches equal to the processor ------------------------------------------------------------


def _processor(tokenizer: Path, video: dict, images: dict):
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2VLImageProcessorPil,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer), eos_token="<|endoftext|>")
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=16,
        merge_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
        min_pixels=images["min_pixels"],
        max_pixels=images["max_pixels"],
    )
    video_processor = Qwen3VLVideoProcessor(
        size={"shortest_edge": video["min_pixels"], "longest_edge": video["max_pixels"]},
        fps=video["fps"],
        cap_pixels_per_frame=video.get("cap_pixels_per_frame", False),
        max_video_tokens=video.get("max_video_tokens", 768),
    )
    return Qwen3VLProcessor(
        image_processor=image_processor, tokenizer=tok, video_processor=video_processor
    )


def _expected(processor, doc: Doc) -> dict[str, torch.Tensor]:
    """The processor's output for a document: markers as the chat template's blocks, media
    without markers first (images, then videos), as mixer places them."""
    text = doc.text
    first = "<image>" * len(doc.images) if "<image>" not in text else ""
    first += "<video>" * len(doc.videos) if "<video>" not in text else ""
    text = first + text
    text = text.replace("<image>", IMAGE_BLOCK).replace("<video>", VIDEO_BLOCK)
    kwargs: dict = {}
    if doc.images:
        kwargs["images"] = [doc.image(i) for i in range(len(doc.images))]
    if doc.videos:
        from transformers.video_utils import VideoMetadata

        videos, metadata = [], []
        for i in range(len(doc.videos)):
            frames, rate = decoded(encode_video(doc.video_frames(i)))
            videos.append(frames)
            metadata.append(VideoMetadata(total_num_frames=len(frames), fps=rate))
        kwargs.update(videos=videos, video_metadata=metadata, do_sample_frames=True)
    return processor(text=[text], return_tensors="pt", **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("cap", [False, True])
def test_batches_equal_the_qwen3_vl_processor(corpus, cap):
    """One document per row (packing pad): input_ids (timestamps included), pixel_values,
    image_grid_thw, pixel_values_videos, video_grid_thw and mm_token_type_ids equal the
    processor's for the same text, images and videos."""
    _, tokenizer = corpus
    video = {**VIDEO, "cap_pixels_per_frame": cap, "max_video_tokens": 2}
    processor = _processor(tokenizer, video, IMAGES)
    expected = {}
    for doc in DOCS:
        want = _expected(processor, doc)
        expected[tuple(want["input_ids"][0].tolist())] = (doc, want)
    recipe = recipe_of(corpus, packing="pad", epochs=1, video=video)
    recipe["batch_size"] = 1
    seen = Counter()
    for batch in take(mixer.build_loader(recipe), None):
        real = int((batch["source_ids"][0] >= 0).sum())
        ids = tuple(batch["input_ids"][0, : real - 1].tolist())
        assert batch["input_ids"][0, real - 1] == EOS_ID or real == 0
        assert ids in expected, f"no processor output has the ids {ids}"
        doc, want = expected.pop(ids)
        for key in ("image_grid_thw", "video_grid_thw"):
            if key in want:
                assert torch.equal(batch[key], want[key]), (doc.key, key)
            else:
                assert batch[key].shape == (0, 3)
        for key in ("pixel_values", "pixel_values_videos"):
            if key in want:
                diff = (batch[key] - want[key]).abs().max().item()
                assert diff <= 1e-6, (doc.key, key, diff)
        assert torch.equal(batch["mm_token_type_ids"][0, : real - 1], want["mm_token_type_ids"][0])
        seen.update(images=len(doc.images), videos=len(doc.videos), docs=1)
    assert not expected, f"documents not delivered: {[d.key for d, _ in expected.values()]}"
    assert seen == Counter(images=3, videos=6, docs=6), seen


# -- training and resume ---------------------------------------------------------------------


@pytest.mark.slow
def test_packed_rows_train_like_their_documents_alone(corpus):
    """The loader's packed rows through a tiny random Qwen3-VL: each document's logits equal
    its logits alone, and its M-RoPE rows equal Qwen3VLModel.get_rope_index of it alone."""
    from vlm_models import assert_packed_equals_alone, tiny_qwen3_vl

    ids = ids_of(corpus[1])
    model = tiny_qwen3_vl(
        Tokenizer.from_file(str(corpus[1])).get_vocab_size(),
        ids["<|image_pad|>"],
        ids["<|vision_start|>"],
        ids["<|vision_end|>"],
        ids["<|video_pad|>"],
    )
    seen: Counter = Counter()
    for batch in take(mixer.build_loader(recipe_of(corpus)), 3):
        seen.update(
            assert_packed_equals_alone(
                model, batch, "qwen3_vl", eos_id=EOS_ID, require_coverage=False
            )
        )
    assert seen["units_with_videos"] > 0 and seen["units_with_images"] > 0, seen
    assert seen["packed_rows"] > 0, seen


@pytest.mark.slow  # (DataLoader workers start)
def test_same_batches_with_workers_after_resume_and_elastic(corpus):
    recipe = recipe_of(corpus)
    reference = digests(take(mixer.build_loader(recipe), 8))
    loader = mixer.build_loader(recipe, num_workers=2)
    head = digests(take(loader, 3))
    state = json.loads(json.dumps(loader.state_dict()))
    again = mixer.build_loader(recipe)
    again.load_state_dict(state)
    assert head + digests(take(again, 5)) == reference
    assert_elastic_resume(recipe, reference, steps=2, rest=4, rank_workers=1, single_workers=2)


def test_a_long_video_is_lowered_to_fit_and_stays_consistent(corpus, tmp_path):
    """A document whose video does not fit seq_len at the recipe's plan gets a lower
    per-video pixel budget, then fewer frames (never cut, never over seq_len); its tokens,
    grid, pixels and positions stay those the model expects."""
    from vlm_models import assert_packed_equals_alone, tiny_qwen3_vl

    _, tokenizer = corpus
    write_docs_tar(
        tmp_path / "long" / "a.tar", [Doc("s000009", "long: <video>", [], [(128, 96, 60)])]
    )
    video = {**VIDEO, "max_pixels": 12 * 128 * 128}
    recipe = recipe_of(corpus, packing="pad", epochs=1, video=video)
    recipe["sources"][0]["path"] = str(tmp_path / "long" / "*.tar")
    full = take(mixer.build_loader(recipe), None)
    assert [b["video_grid_thw"].tolist() for b in full] == [[[8, 6, 8]]]  # 15 frames
    ids = ids_of(tokenizer)
    model = tiny_qwen3_vl(
        Tokenizer.from_file(str(tokenizer)).get_vocab_size(),
        ids["<|image_pad|>"],
        ids["<|vision_start|>"],
        ids["<|vision_end|>"],
        ids["<|video_pad|>"],
    )
    for seq_len, lowered in ((128, False), (48, True)):
        recipe["seq_len"] = seq_len
        (batch,) = take(mixer.build_loader(recipe), None)
        t, h, w = batch["video_grid_thw"][0].tolist()
        real = int((batch["source_ids"][0] >= 0).sum())
        assert 0 < real <= seq_len
        assert t * h * w < 8 * 6 * 8
        assert (t < 8) == lowered  # past the lowest budget: fewer frames
        assert int((batch["input_ids"][0] == ids["<|vision_start|>"]).sum()) == t
        assert_packed_equals_alone(model, batch, "qwen3_vl", require_coverage=False)


def test_images_without_a_video_block(corpus):
    """qwen3_vl without `images.video`: image documents equal the processor's; a video is
    bad input, as under qwen2_vl."""
    _, tokenizer = corpus
    processor = _processor(tokenizer, VIDEO, IMAGES)
    recipe = recipe_of(corpus, packing="pad", epochs=1)
    recipe["images"].pop("video")
    recipe["sources"][0]["on_error"] = "skip"
    recipe["batch_size"] = 1
    delivered = 0
    for batch in take(mixer.build_loader(recipe), None):
        real = int((batch["source_ids"][0] >= 0).sum())
        assert "pixel_values_videos" not in batch
        doc = next(
            d
            for d in DOCS
            if not d.videos and _expected(processor, d)["input_ids"].shape[1] == real - 1
        )
        want = _expected(processor, doc)
        assert batch["input_ids"][0, : real - 1].tolist() == want["input_ids"][0].tolist()
        delivered += 1
    assert delivered == sum(not d.videos for d in DOCS)


@pytest.mark.slow
def test_bundled_qwen3_vl_demo_previews_and_inspects(capsys):
    """recipes/qwen3_vl_demo.yaml on the bundled clips: preview shows timestamps before
    each video's first temporal patch and <video F×W×H @2 fps → N tokens> as its grid."""
    import re

    from test_cli_images import ROOT

    from mixer.tools.cli import main

    recipe = str(ROOT / "recipes" / "qwen3_vl_demo.yaml")
    assert main(["inspect", recipe, "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["sources"]}
    assert rows["clips"]["videos_per_doc"] >= 1 and rows["clips"]["frames_per_video"] >= 4
    assert main(["preview", recipe, "-n", "1", "--chars", "300"]) == 0
    out = capsys.readouterr().out
    shown = re.findall(r"<(\d+\.\d) seconds><video (\d+)×(\d+)×(\d+) @2 fps → (\d+) tokens>", out)
    assert shown and "[clips]" in out
    for _, frames, width, height, tokens in shown:
        assert int(tokens) == int(frames) // 2 * (int(width) // 32) * (int(height) // 32)
