"""Video+text batches through the whole loader: keys, determinism, resume, caps, bad videos, and
packed rows that train like their documents alone (tiny Qwen2-VL and Qwen2.5-VL)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import EOS_ID, word_id, write_docs
from image_data import Sample, make_vlm_tokenizer, vision_ids, write_tar
from test_images_loader import assert_elastic_resume, digests, take
from video_data import VIDEO_TOKEN, Clip, VideoSample, write_video_tar

import mixer

SEQ_LEN = 128
VIDEO = {"fps": 4.0, "min_pixels": 28 * 28, "max_pixels": 56 * 56}


def _samples(first: int, count: int, rng: np.random.Generator) -> list[VideoSample]:
    out = []
    for doc in range(first, first + count):
        clips = [
            Clip(
                width=int(rng.choice([32, 48, 64])),
                height=int(rng.choice([32, 40])),
                frames=int(rng.integers(6, 22)),
                codec=str(rng.choice(["libx264rgb", "ffv1"])),
            )
            for _ in range(int(rng.choice([0, 1, 1, 2])))
        ]
        out.append(
            VideoSample(
                doc, int(rng.integers(2, 16)), clips, marker=bool(rng.integers(2)) and bool(clips)
            )
        )
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """3 tars of 6 video+text samples, a tar of images with one video sample, and a jsonl."""
    root: Path = tmp_path_factory.mktemp("videos")
    tokenizer = make_vlm_tokenizer(root / "tokenizer.json", (VIDEO_TOKEN,))
    rng = np.random.default_rng(3)
    samples = []
    for shard in range(3):
        part = _samples(shard * 6, 6, rng)
        write_video_tar(root / "vids" / f"shard-{shard:03d}.tar", part)
        samples += part
    write_tar(root / "pics" / "pics.tar", [Sample(100 + i, 5, [(56, 28)]) for i in range(4)])
    texts = [(1000 + i, int(rng.integers(5, 50))) for i in range(16)]
    write_docs(root / "prose.jsonl", texts, "jsonl")
    return root, tokenizer, samples, texts


def recipe_of(corpus, *, layout="qwen2_vl", epochs=None, packing="concat", **images) -> dict:
    root, tokenizer, _, _ = corpus
    settings = {
        "layout": layout,
        "min_pixels": 784,
        "max_pixels": 56 * 56,
        "video": VIDEO,
        **images,
    }
    return {
        "seed": 3,
        "tokenizer": str(tokenizer),
        "seq_len": SEQ_LEN,
        "batch_size": 2,
        "lanes": 4,
        "packing": packing,
        "images": settings,
        "shuffle_window": 4,
        "sources": [
            {"name": "vids", "path": str(root / "vids" / "*.tar"), "weight": 3, "epochs": epochs},
            {"name": "prose", "path": str(root / "prose.jsonl"), "weight": 1, "epochs": epochs},
        ],
    }


VIDEO_KEYS = {
    "input_ids",
    "labels",
    "position_ids",
    "source_ids",
    "mm_token_type_ids",
    "pixel_values",
    "image_grid_thw",
    "pixel_values_videos",
    "video_grid_thw",
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["qwen2_vl", "qwen2_5_vl"])
def test_video_batches_have_every_key_and_consistent_videos(corpus, layout):
    ids = vision_ids(corpus[1], (VIDEO_TOKEN,))
    seen = 0
    for batch in take(mixer.build_loader(recipe_of(corpus, layout=layout)), 6):
        extra = {"second_per_grid_ts"} if layout == "qwen2_5_vl" else set()
        assert set(batch) == VIDEO_KEYS | extra
        grid = batch["video_grid_thw"]
        assert grid.ndim == 2 and grid.shape[1] == 3
        assert batch["pixel_values_videos"].shape == (int(grid.prod(1).sum()), 1176)
        pads = batch["input_ids"] == ids[VIDEO_TOKEN]
        assert int(pads.sum()) == int(grid.prod(1).sum()) // 4
        assert ((batch["mm_token_type_ids"] == 2) == pads).all()
        assert (batch["labels"][pads] == -100).all()
        if layout == "qwen2_5_vl":
            spg = batch["second_per_grid_ts"]
            assert spg.dtype.is_floating_point and spg.shape == (grid.shape[0],)
        seen += grid.shape[0]
    assert seen > 0


@pytest.mark.slow
def test_same_batches_with_any_worker_count_after_resume_and_elastic(corpus):
    recipe = recipe_of(corpus)
    reference = digests(take(mixer.build_loader(recipe), 12))
    assert digests(take(mixer.build_loader(recipe, num_workers=2), 12)) == reference
    loader = mixer.build_loader(recipe, num_workers=2)
    head = digests(take(loader, 3))
    state = json.loads(json.dumps(loader.state_dict()))
    again = mixer.build_loader(recipe)
    again.load_state_dict(state)
    again.load_state_dict(state)  # twice in a row
    assert head + digests(take(again, 9)) == reference
    assert_elastic_resume(recipe, reference, steps=2, rest=8, rank_workers=1, single_workers=2)


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["concat", "best_fit"])
def test_finite_recipe_delivers_every_sample_and_video_once_within_the_caps(corpus, packing):
    _, tokenizer, samples, texts = corpus
    ids = vision_ids(tokenizer, (VIDEO_TOKEN,))
    recipe = recipe_of(corpus, epochs=1, packing=packing, max_videos_per_batch=2)
    batches = []
    for rank in range(2):
        loader = mixer.build_loader(recipe, rank=rank, world_size=2, num_workers=1)
        batches += take(loader, None)
        assert loader.metrics()["oversize"] == {"vids": 0, "prose": 0}
    assert all(b["video_grid_thw"].shape[0] <= 2 for b in batches)
    assert max(b["video_grid_thw"].shape[0] for b in batches) == 2, "the cap was reached"
    tokens: Counter = Counter()
    for b in batches:
        tokens.update(b["input_ids"][b["source_ids"] >= 0].tolist())
    for s in samples:
        assert tokens[word_id(s.doc)] == s.length, s
    for doc, length in texts:
        assert tokens[word_id(doc)] == length
    assert tokens[EOS_ID] == len(samples) + len(texts)
    videos = sum(b["video_grid_thw"].shape[0] for b in batches)
    assert videos == sum(len(s.clips) for s in samples) == tokens[ids["<|vision_start|>"]]


@pytest.mark.slow
def test_long_video_documents_lose_pixels_then_frames_then_text_else_oversize(tmp_path):
    tokenizer = make_vlm_tokenizer(tmp_path / "tokenizer.json", (VIDEO_TOKEN,))
    clip = Clip(width=112, height=112, frames=40, rate=10)
    write_video_tar(
        tmp_path / "long.tar",
        [VideoSample(1, 4, [clip]), VideoSample(2, 60, [clip]), VideoSample(3, 2, [clip] * 3)],
    )
    video = {"fps": 2.0, "min_frames": 4, "min_pixels": 56 * 56, "max_pixels": 112 * 112}
    recipe = {
        "tokenizer": str(tokenizer),
        "seq_len": 16,
        "batch_size": 1,
        "lanes": 1,
        "images": {"layout": "qwen2_vl", "video": video},
        "sources": [{"name": "long", "path": str(tmp_path / "long.tar"), "weight": 1, "epochs": 1}],
    }
    loader = mixer.build_loader(recipe)
    batches = take(loader, None)
    grids = [g for b in batches for g in b["video_grid_thw"].tolist()]
    # At the recipe's plan: 8 frames of 112x112 = 4 x 8 x 8 / 4 = 64 tokens. Sample 1 fits at
    # the lowest pixels (56x56: 4 tokens a temporal patch) and 4 frames (6 are 3 x 4 + 2 +
    # 5 = 19 tokens, 4 are 15 <= 16); sample 2 also loses its text after the video; sample
    # 3's three videos never fit.
    assert grids == [[2, 4, 4], [2, 4, 4]]
    assert loader.metrics()["oversize"] == {"long": 1}


def _broken(tmp_path: Path) -> Path:
    clip = Clip(frames=8)
    path = write_video_tar(
        tmp_path / "bad" / "bad.tar", [VideoSample(i, 3, [clip]) for i in range(1, 4)]
    )
    data = bytearray(path.read_bytes())
    at = data.find(b"mdat", data.find(b"s000002.mp4"))  # the second sample's frame data
    data[at + 8 : at + 4000] = bytes(3992)
    path.write_bytes(bytes(data))
    return path


def test_bad_videos_are_data_errors_naming_the_member_or_counted_skips(corpus, tmp_path):
    recipe = recipe_of(corpus, epochs=1)
    recipe["sources"] = [{"name": "bad", "path": str(_broken(tmp_path)), "weight": 1, "epochs": 1}]
    with pytest.raises(mixer.DataError) as err:
        take(mixer.build_loader(recipe), None)
    assert err.value.source == "bad" and err.value.file.endswith("bad.tar")
    assert "s000002.mp4 at byte offset" in str(err.value) and err.value.reason == "bad_video"
    recipe["sources"][0]["on_error"] = "skip"
    loader = mixer.build_loader(recipe)
    assert sum(b["video_grid_thw"].shape[0] for b in take(loader, None)) == 2
    assert loader.metrics()["skipped_by_reason"]["bad"] == {"bad_video": 1}


def test_markers_not_as_many_as_videos_and_videos_without_a_video_block(corpus, tmp_path):
    clip = Clip(frames=8)
    path = write_video_tar(
        tmp_path / "m" / "m.tar",
        [
            VideoSample(1, 3, [clip, clip], text="w1 <video> w1"),  # 1 marker, 2 videos
            VideoSample(2, 3, [clip]),
        ],
    )
    recipe = recipe_of(corpus, epochs=1)
    recipe["sources"] = [
        {"name": "m", "path": str(path), "weight": 1, "epochs": 1, "on_error": "skip"}
    ]
    loader = mixer.build_loader(recipe)
    assert sum(b["video_grid_thw"].shape[0] for b in take(loader, None)) == 1
    assert loader.metrics()["skipped_by_reason"]["m"] == {"bad_video": 1}
    del recipe["images"]["video"]
    recipe["sources"][0]["on_error"] = "raise"
    with pytest.raises(mixer.DataError, match="no images.video block") as err:
        take(mixer.build_loader(recipe), None)
    assert err.value.reason == "bad_video" and "s000001.0.mp4" in str(err.value)


def test_images_and_videos_in_one_recipe(corpus):
    root = corpus[0]
    recipe = recipe_of(corpus, epochs=1)
    recipe["sources"].append(
        {"name": "pics", "path": str(root / "pics" / "*.tar"), "weight": 1, "epochs": 1}
    )
    batches = take(mixer.build_loader(recipe), None)
    assert sum(b["image_grid_thw"].shape[0] for b in batches) == 4
    assert all(
        b["pixel_values"].shape[0] == int(b["image_grid_thw"].prod(1).sum()) for b in batches
    )
    both = [b for b in batches if len(b["image_grid_thw"]) and len(b["video_grid_thw"])]
    types = both[0]["mm_token_type_ids"] if both else batches[0]["mm_token_type_ids"]
    assert set(types.unique().tolist()) <= {0, 1, 2}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["qwen2_vl", "qwen2_5_vl"])
def test_loader_video_batches_train_like_their_documents_alone(corpus, layout):
    """The real loader's packed rows with videos, fed to a tiny random Qwen2-VL (Qwen2.5-VL):
    each document's logits in the packed batch equal its logits alone, and its M-RoPE rows
    equal the model's own get_rope_index (video temporal spacing included)."""
    from vlm_models import assert_packed_equals_alone, tiny_qwen2_vl

    ids = vision_ids(corpus[1], (VIDEO_TOKEN,))
    tps = 3 if layout == "qwen2_5_vl" else None
    model = tiny_qwen2_vl(
        max(ids.values()) + 1,
        ids["<|image_pad|>"],
        ids["<|vision_start|>"],
        ids["<|vision_end|>"],
        video_pad_id=ids[VIDEO_TOKEN],
        tokens_per_second=tps,
    )
    extra = {"tokens_per_second": tps} if tps else {}
    seen: Counter = Counter()
    for batch in take(mixer.build_loader(recipe_of(corpus, layout=layout, **extra)), 3):
        seen.update(
            assert_packed_equals_alone(model, batch, layout, eos_id=EOS_ID, require_coverage=False)
        )
    assert seen["units_with_videos"] > 0 and seen["packed_rows"] > 0, seen


@pytest.mark.slow
def test_bundled_video_demo_previews_inspects_and_benches_videos(capsys):
    """`make demo`'s video recipe: inspect counts videos and sampled frames from headers,
    preview shows each video as <video F×W×H @R fps → N tokens> with as many placeholders
    as its grid, bench counts frames per second."""
    import re

    from test_cli_images import ROOT

    from mixer.tools.cli import main

    recipe = str(ROOT / "recipes" / "video_demo.yaml")
    assert main(["inspect", recipe, "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["sources"]}
    assert rows["clips"]["videos_per_doc"] >= 1 and rows["clips"]["frames_per_video"] >= 4
    assert 0 < rows["clips"]["video_token_share"] < 1 and rows["prose"]["est_videos"] == 0
    assert main(["preview", recipe, "-n", "1", "--chars", "300"]) == 0
    out = capsys.readouterr().out
    shown = re.findall(r"<video (\d+)×(\d+)×(\d+) @2 fps → (\d+) tokens>", out)
    assert shown and "[clips]" in out
    for frames, width, height, tokens in shown:
        assert int(tokens) == int(frames) // 2 * (int(width) // 28) * (int(height) // 28)
    assert main(["bench", recipe, "--batches", "2", "--num-workers", "0", "--no-progress"]) == 0
    assert re.search(r"sampled frames [\d,]+ \([\d,]+ frames/s\)", capsys.readouterr().out)


def test_a_state_resumes_only_under_the_same_video_settings(corpus):
    state = mixer.build_loader(recipe_of(corpus)).state_dict()
    for change in (
        {"video": {**VIDEO, "fps": 3.0}},
        {"max_videos_per_batch": 4},
        {"layout": "qwen2_5_vl"},
    ):
        with pytest.raises(mixer.StateError):
            mixer.build_loader(recipe_of(corpus, **change)).load_state_dict(state)
    mixer.build_loader(recipe_of(corpus)).load_state_dict(state)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["qwen2_vl", "qwen2_5_vl"])
def test_flattened_video_batches_keep_their_videos(corpus, layout):
    """`flatten: true` with videos: the collator's keys over the rows end to end, the video
    arrays (and qwen2_5_vl's second_per_grid_ts) unchanged, M-RoPE rows those of the batch."""
    from test_flatten import assert_collator_equal
    from test_flatten import take as take_flat  # (max_length_q/k are ints)

    recipe = {**recipe_of(corpus, layout=layout), "mask_document_boundaries": True}
    plain = take(mixer.build_loader(recipe), 3)
    flat = take_flat(mixer.build_loader({**recipe, "flatten": True}), 3)
    videos = 0
    for p, f in zip(plain, flat):
        total = p["input_ids"].numel()
        for key in ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
            if key in p:
                assert torch.equal(f[key], p[key]), key
        assert torch.equal(f["position_ids"][1:], p["position_ids"][1:].reshape(3, 1, total))
        assert_collator_equal(f, p)
        videos += p["video_grid_thw"].shape[0]
    assert videos > 0
