"""Qwen3-VL video pixels per second: mixer's qwen3_vl path vs decoding the whole video and
running transformers' Qwen3VLVideoProcessor on it.

    python benchmarks/qwen3_vl.py [--seconds 30] [--repeat 2]

For an H.264 clip (640x360 at 30 fps, a keyframe every 2 s; `benchmarks/video.py`'s clip):
mixer from bytes (header probe and plan, seek to each sampled frame, resize, normalize,
patches: `LazyVideo.pixels` with `Qwen3VideoProcessing`, what a loader worker does per
video) against PyAV decoding every frame plus `Qwen3VLVideoProcessor(videos=...,
do_sample_frames=True)` with its defaults. Rates are sampled frames per CPU second of this
process (torch on one thread), best of `--repeat`; the two paths' pixels are checked equal.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from video import make_clip  # noqa: E402

from mixer.config.images import ImageSettings  # noqa: E402
from mixer.core.records import EncodedVideo  # noqa: E402
from mixer.images.qwen3_vl import Qwen3VideoProcessing  # noqa: E402
from mixer.images.video import LazyVideo  # noqa: E402
from mixer.images.video_decode import probe_video  # noqa: E402
from mixer.tools.tables import format_table  # noqa: E402


def mixer_pixels(data: bytes, processing: Qwen3VideoProcessing) -> tuple[np.ndarray, int]:
    encoded = EncodedVideo(data, "clip.mp4", 0)
    info = probe_video(
        encoded, source="bench", file="clip", max_source_pixels=1 << 30, max_source_frames=1 << 30
    )
    plan = processing.plan(info)
    handle = LazyVideo(encoded, info, plan, processing, extra_tokens=2, source="bench", file="clip")
    return handle.pixels(), plan.frames


def processor_pixels(data: bytes, processor) -> tuple[np.ndarray, int]:
    import io

    import av
    from transformers.video_utils import VideoMetadata

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        rate = float(stream.average_rate)
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
    meta = VideoMetadata(total_num_frames=len(frames), fps=rate)
    out = processor(
        videos=[frames],
        video_metadata=[meta],
        do_sample_frames=True,
        cap_pixels_per_frame=False,
        return_tensors="np",
    )
    indices = meta.frames_indices
    return out["pixel_values_videos"], 0 if indices is None else len(indices)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    import torch
    from transformers import Qwen3VLVideoProcessor

    torch.set_num_threads(1)
    processor = Qwen3VLVideoProcessor()
    processing = Qwen3VideoProcessing(
        ImageSettings.model_validate({"layout": "qwen3_vl", "video": {}})
    )
    data = make_clip(args.seconds, 640, 360, 30, gop=60)
    best = {"mixer": float("inf"), "pyav + processor": float("inf")}
    frames = {}
    for _ in range(args.repeat):
        for name, fn in (
            ("mixer", lambda: mixer_pixels(data, processing)),
            ("pyav + processor", lambda: processor_pixels(data, processor)),
        ):
            start = time.process_time()
            _, frames[name] = fn()
            best[name] = min(best[name], time.process_time() - start)
    ours, theirs = mixer_pixels(data, processing)[0], processor_pixels(data, processor)[0]
    assert ours.shape == theirs.shape and np.abs(ours - theirs).max() <= 1e-6, "paths disagree"
    rows = [
        {
            "clip": f"{args.seconds:g} s 640x360@30, key every 2 s",
            "path": name,
            "sampled frames": frames[name],
            "frames/CPU s": frames[name] / cpu,
            "vs processor": best["pyav + processor"] / cpu,
        }
        for name, cpu in best.items()
    ]
    print(format_table(rows, [(key, key) for key in rows[0]]))


if __name__ == "__main__":
    main()
