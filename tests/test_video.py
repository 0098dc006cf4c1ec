"""Video+text: frames, pixels and grids as transformers' Qwen2VLVideoProcessor makes them, from
real video files written here with PyAV; the header facts and their limits; bad videos."""

from __future__ import annotations

import io
import itertools
import sys

import av
import numpy as np
import pytest
import torch
from transformers import Qwen2VLVideoProcessor
from transformers.video_utils import VideoMetadata
from video_data import CODECS, decoded, encode_video, frame

import mixer
from mixer.config.images import ImageSettings
from mixer.core.records import EncodedVideo
from mixer.images import video_decode
from mixer.images.video import LazyVideo, VideoProcessing, sample_count, sample_indices
from mixer.images.video_decode import probe_video

MIN, MAX = 28 * 28, 56 * 56  # small frames: 56x56 at most, a 4x4 patch grid


@pytest.fixture(scope="module")
def clips() -> dict[str, bytes]:
    """A 41-frame 64x48 clip at 10 fps (keyframe every 6 frames) in each codec."""
    frames = [frame(7, 0, f, 64, 48) for f in range(41)]
    return {codec: encode_video(frames, codec, rate=10, gop=6) for codec in CODECS}


def _ours(data: bytes, settings: ImageSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
    processing = VideoProcessing(settings)
    encoded = EncodedVideo(data, "s.mp4", 0)
    info = probe_video(
        encoded, source="s", file="f.tar", max_source_pixels=1 << 30, max_source_frames=10_000
    )
    plan = processing.plan(info)
    handle = LazyVideo(encoded, info, plan, processing, extra_tokens=2, source="s", file="f")
    return handle.pixels(), plan.grid_thw


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("cap", [False, True])
def test_pixels_and_grid_equal_the_transformers_video_processor(clips, codec, cap):
    """Decoding only the sampled frames (seeking) and processing them gives the processor's
    values for the whole decoded video: lossless codecs (rgb round trip) and lossy ones."""
    video = {
        "fps": 3.0,
        "min_pixels": MIN,
        "max_pixels": MAX,
        "cap_pixels_per_frame": cap,
        "max_video_tokens": 40,
    }
    settings = ImageSettings(layout="qwen2_vl", video=video)
    pixels, grid = _ours(clips[codec], settings)
    frames, rate = decoded(clips[codec])
    if codec in ("libx264rgb", "ffv1"):  # lossless: the frames written come back
        assert np.array_equal(frames, np.stack([frame(7, 0, f, 64, 48) for f in range(41)]))
    processor = Qwen2VLVideoProcessor(min_pixels=MIN, max_pixels=MAX, max_video_tokens=40)
    want = processor(
        videos=[frames],
        video_metadata=[VideoMetadata(total_num_frames=41, fps=rate)],
        do_sample_frames=True,
        fps=3.0,
        cap_pixels_per_frame=cap,
        return_tensors="pt",
    )
    assert list(grid) == want["video_grid_thw"][0].tolist()
    assert grid[0] == 6  # 41 frames at 10 fps sampled at 3 fps: 12 frames, 6 temporal patches
    assert pixels.dtype == np.float32
    np.testing.assert_allclose(pixels, want["pixel_values_videos"].numpy(), rtol=0, atol=1e-6)


def test_sampling_follows_the_formula_where_the_processor_does_and_never_fails():
    """n = total / rate × fps clamped to [min_frames, min(max_frames, total)], rounded down to
    a multiple of temporal_patch_size; indices ⌊i·total/n⌋. The processor's float arange
    sometimes gives n + 1 indices (then its call fails): the formula is kept there."""
    processor = Qwen2VLVideoProcessor()
    settings = ImageSettings(layout="qwen2_vl", video={"fps": 2.0}).video
    compared = extra = 0
    for total, rate, fps in itertools.product(
        range(1, 160, 3), (10, 24, 29.97, 60), (0.5, 2.0, 3.5)
    ):
        video = settings.model_copy(update={"fps": fps})
        n = sample_count(total, rate, video, 2)
        indices = sample_indices(total, n)
        assert n % 2 == 0 and n <= total and len(set(indices)) == n
        assert indices == sorted(indices) and all(0 <= i < total for i in indices)
        if n == 0:
            continue
        theirs = processor.sample_frames(
            VideoMetadata(total_num_frames=total, fps=rate), fps=fps
        ).tolist()
        if len(theirs) == n + 1:
            extra += 1
            continue
        assert theirs == indices, (total, rate, fps)
        compared += 1
    assert compared > 550 and extra > 0, (compared, extra)


def test_frame_count_is_demuxed_when_the_header_has_none_and_limits_refuse_early(clips):
    for codec, data in clips.items():
        with av.open(io.BytesIO(data)) as container:
            declared = container.streams.video[0].frames
        info = probe_video(
            EncodedVideo(data, "a.x", 5),
            source="s",
            file="f",
            max_source_pixels=64 * 48,
            max_source_frames=41,
        )
        assert (info.width, info.height, info.frames, info.fps) == (64, 48, 41, 10.0)
        if codec in ("ffv1", "libvpx-vp9"):
            assert declared == 0  # mkv and webm: counted by demuxing packets
    data = clips["libx264rgb"]
    for limits, words in (
        ({"max_source_pixels": 64 * 48 - 1, "max_source_frames": 100}, "max_source_pixels"),
        ({"max_source_pixels": 1 << 20, "max_source_frames": 40}, "max_source_frames"),
    ):
        with pytest.raises(mixer.DataError, match=words) as err:
            probe_video(EncodedVideo(data, "s1.mp4", 1536), source="vids", file="a.tar", **limits)
        assert err.value.reason == "bad_video" and "s1.mp4 at byte offset 1536" in str(err.value)


def test_only_sampled_frames_are_decoded_by_seeking_to_keyframes(clips):
    """For every codec the seek path serves the frames (no fallback to decoding everything),
    and they are the frames a full decode gives at those indices."""
    wanted = [0, 5, 6, 13, 29, 40]
    for codec, data in clips.items():
        frames, _ = decoded(data)
        got: dict[int, np.ndarray] = {}
        with av.open(io.BytesIO(data)) as container:
            assert video_decode._seeking(
                container, container.streams.video[0], wanted, got.__setitem__
            )
        assert sorted(got) == list(range(len(wanted)))
        for i, index in enumerate(wanted):
            assert np.array_equal(got[i], frames[index]), (codec, index)


def test_video_block_errors_name_the_field():
    base = {
        "tokenizer": "t.json",
        "seq_len": 64,
        "sources": [{"name": "v", "path": "v/*.tar", "weight": 1}],
    }
    cases = [
        ({"layout": "qwen2_vl", "video": {"fps": 0}}, "images.video.fps"),
        ({"layout": "qwen2_vl", "video": {"min_frames": 9, "max_frames": 8}}, "images.video"),
        ({"layout": "qwen2_vl", "video": {"frames": 8}}, "images.video.frames"),
        ({"layout": "llava", "video": {}}, "images"),
        ({"layout": "qwen2_vl", "video": {}, "video_marker": "<image>"}, "images"),
    ]
    for images, path in cases:
        with pytest.raises(mixer.RecipeError, match=path.replace(".", r"\.")):
            mixer.load_recipe({**base, "images": images})


def test_too_few_frames_for_a_temporal_patch_is_a_planning_error():
    processing = VideoProcessing(ImageSettings(layout="qwen2_vl", video={}))
    info = video_decode.VideoInfo(32, 32, 1, 10.0)
    with pytest.raises(ValueError, match="temporal patch"):
        processing.plan(info)
    assert processing.plan(video_decode.VideoInfo(32, 32, 3, 10.0)).frames == 2
    # 10 s at 2 fps: 20 frames; 32x32 grows to min_pixels (100352 = 336²): a 24x24 grid
    assert processing.plan(video_decode.VideoInfo(32, 32, 100, 10.0)).grid_thw == (10, 24, 24)


def test_resize_is_the_processors_uint8_antialiased_bicubic():
    """The frame resize (torch's uint8 bicubic with antialias) equals torchvision's resize on
    a uint8 frame, which the processor calls (downscale and upscale)."""
    import torchvision.transforms.v2.functional as tvF

    processing = VideoProcessing(ImageSettings(layout="qwen2_vl", video={}))
    rgb = frame(1, 2, 3, 90, 70)
    for size in ((56, 84), (140, 112)):
        plan = type("Plan", (), {"height": size[0], "width": size[1]})()
        ours = processing.resized(rgb, plan)
        theirs = tvF.resize(
            torch.from_numpy(rgb).permute(2, 0, 1),
            list(size),
            interpolation=tvF.InterpolationMode.BICUBIC,
            antialias=True,
        )
        assert np.array_equal(ours, theirs.numpy())


def test_empty_and_non_video_bytes_are_bad_videos_naming_the_member(clips):
    for data, words in (
        (b"", "empty video"),
        (b"\x00not a video" * 50, "cannot read"),
        (clips["libx264rgb"][:300], "cannot read"),
    ):
        with pytest.raises(mixer.DataError, match=words) as err:
            probe_video(
                EncodedVideo(data, "k.mp4", 512),
                source="v",
                file="a.tar",
                max_source_pixels=1 << 30,
                max_source_frames=1000,
            )
        assert err.value.reason == "bad_video" and "k.mp4 at byte offset 512" in str(err.value)


def test_sampled_fps_is_the_processors():
    """qwen2_5_vl's second_per_grid_ts is temporal_patch_size / sampled fps, with the sampled
    fps of transformers' VideoMetadata for the same indices."""
    processing = VideoProcessing(ImageSettings(layout="qwen2_5_vl", video={"fps": 3.0}))
    for total, rate in ((41, 10.0), (300, 29.97), (7, 24.0)):
        plan = processing.plan(video_decode.VideoInfo(64, 48, total, rate))
        meta = VideoMetadata(total_num_frames=total, fps=rate, frames_indices=plan.indices)
        assert plan.sampled_fps == meta.sampled_fps


def test_a_video_recipe_without_pyav_names_the_extra(monkeypatch):
    """Where `av` cannot be imported (the `video` extra not installed), the recipe is refused
    up front, naming the extra."""
    monkeypatch.setitem(sys.modules, "av", None)  # Python's mark of a module that is absent
    with pytest.raises(mixer.RecipeError, match=r"images\.video.*mixer\[video\]"):
        mixer.load_recipe(
            {
                "tokenizer": "t.json",
                "seq_len": 64,
                "images": {"layout": "qwen2_vl", "video": {}},
                "sources": [{"name": "v", "path": "v/*.tar", "weight": 1}],
            }
        )
