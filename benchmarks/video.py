"""Video frames per second and memory: mixer's sampled-frame path vs decoding the whole video
and running transformers' Qwen2VLVideoProcessor on it.

    python benchmarks/video.py [--seconds 30] [--repeat 2] [--long-minutes 10]

Generates H.264 clips (yuv420p mp4, moving shapes over grain) with PyAV, then measures:

1. **Frames per second per core.** For each clip (640x360 at 30 fps, a keyframe every 2 s
   and every 10 s): mixer from bytes (header probe and plan, seek to the keyframe before each
   sampled frame and decode forward, resize, normalize, patches: `LazyVideo.pixels`, what a
   loader worker does per video) against PyAV decoding every frame to RGB plus
   `Qwen2VLVideoProcessor(videos=..., do_sample_frames=True)` (what a DataLoader worker does
   with transformers alone). Rates are sampled frames per CPU second of this process (all its
   threads; torch on one thread), best of `--repeat`, the paths alternating.
2. **Peak memory on a long clip** (`--long-minutes`, 640x360 at 15 fps, at most 64 sampled
   frames): in a fresh child process, the peak RSS above its resident size while mixer makes
   the video's pixels (Linux: VmHWM after resetting it), next to the size of the pixels it
   returns and of the whole decoded video (what decoding it all would hold).
3. **First batch and resume** on `recipes/video_demo.yaml` (in-process loader): time to the
   first batch, and time to the first batch of a fresh loader given the state after 20
   batches.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mixer.config.images import ImageSettings  # noqa: E402
from mixer.core.records import EncodedVideo  # noqa: E402
from mixer.images.video import LazyVideo, VideoProcessing  # noqa: E402
from mixer.images.video_decode import probe_video  # noqa: E402
from mixer.tools.tables import format_table  # noqa: E402


def make_clip(seconds: float, width: int, height: int, rate: int, gop: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    grain = rng.integers(0, 24, (height, width, 3), dtype=np.uint8)
    ys, xs = np.mgrid[0:height, 0:width]
    background = np.stack([xs * 255 // width, ys * 255 // height, (xs + ys) % 256], -1)
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.gop_size = gop
        stream.options = {"preset": "ultrafast", "sc_threshold": "0"}
        for f in range(int(seconds * rate)):
            img = (background + grain).astype(np.uint8)
            x = (f * 7) % (width - 40)
            img[height // 3 : height // 3 + 40, x : x + 40] = (200, 30, 30)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def _settings(**video) -> ImageSettings:
    return ImageSettings(layout="qwen2_vl", video=video)


def mixer_pixels(data: bytes, settings: ImageSettings) -> tuple[np.ndarray, int]:
    processing = VideoProcessing(settings)
    encoded = EncodedVideo(data, "clip.mp4", 0)
    info = probe_video(
        encoded, source="bench", file="clip", max_source_pixels=1 << 30, max_source_frames=1 << 30
    )
    plan = processing.plan(info)
    handle = LazyVideo(encoded, info, plan, processing, extra_tokens=2, source="bench", file="clip")
    return handle.pixels(), plan.frames


def processor_pixels(data: bytes, processor) -> tuple[np.ndarray, int]:
    from transformers.video_utils import VideoMetadata

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        rate = float(stream.average_rate)
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
    out = processor(
        videos=[frames],
        video_metadata=[VideoMetadata(total_num_frames=len(frames), fps=rate)],
        do_sample_frames=True,
        fps=2.0,
        cap_pixels_per_frame=False,
        return_tensors="np",
    )
    t = int(out["video_grid_thw"][0][0])
    return out["pixel_values_videos"], t * 2


def frames_per_second(seconds: float, repeat: int) -> list[dict]:
    import torch
    from transformers import Qwen2VLVideoProcessor

    torch.set_num_threads(1)
    processor = Qwen2VLVideoProcessor()
    settings = _settings()
    rows = []
    for gop_s in (2, 10):
        data = make_clip(seconds, 640, 360, 30, gop=30 * gop_s)
        best = {"mixer": float("inf"), "pyav + processor": float("inf")}
        frames = {}
        for _ in range(repeat):
            for name, fn in (
                ("mixer", lambda d=data: mixer_pixels(d, settings)),
                ("pyav + processor", lambda d=data: processor_pixels(d, processor)),
            ):
                start = time.process_time()
                pixels, frames[name] = fn()
                best[name] = min(best[name], time.process_time() - start)
        ours, theirs = mixer_pixels(data, settings)[0], processor_pixels(data, processor)[0]
        assert np.abs(ours - theirs).max() <= 1e-6, "the two paths disagree"
        for name, cpu in best.items():
            rows.append(
                {
                    "clip": f"{seconds:g} s 640x360@30, key every {gop_s} s",
                    "path": name,
                    "sampled frames": frames[name],
                    "frames/CPU s": frames[name] / cpu,
                    "vs baseline": best["pyav + processor"] / cpu,
                }
            )
    return rows


def _status(field: str) -> float:
    """A /proc/self/status memory field, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def _child_peak(path: str) -> None:
    """(In a fresh process) print the peak RSS above the resident size at the start, while
    mixer makes one long video's pixels (Linux: peak reset through clear_refs)."""
    import torch  # noqa: F401  (imported before measuring: its size is not the video's)

    data = Path(path).read_bytes()
    settings = _settings(max_frames=64)
    mixer_pixels(make_clip(1, 64, 64, 10, 10), settings)  # warm every code path
    Path("/proc/self/clear_refs").write_text("5")
    base = _status("VmRSS")
    pixels, n = mixer_pixels(data, settings)
    print(f"{_status('VmHWM') - base:.1f} {pixels.nbytes / 2**20:.1f} {n}")


def peak_memory(minutes: float, tmp: Path) -> list[dict]:
    width, height, rate = 640, 360, 15
    path = tmp / "long.mp4"
    path.write_bytes(make_clip(minutes * 60, width, height, rate, gop=rate * 5))
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(path)], capture_output=True, text=True, check=True
    ).stdout.split()
    growth, output, n = float(out[0]), float(out[1]), int(out[2])
    whole = minutes * 60 * rate * width * height * 3 / 2**20
    frame = width * height * 3 / 2**20
    return [
        {
            "clip": f"{minutes:g} min 640x360@15 ({path.stat().st_size / 2**20:.1f} MB mp4)",
            "sampled frames": n,
            "peak RSS growth MB": growth,
            "pixels returned MB": output,
            "one decoded frame MB": frame,
            "whole video decoded MB": whole,
        }
    ]


def first_batch_and_resume() -> list[dict]:
    import mixer

    recipe = mixer.load_recipe(str(ROOT / "recipes" / "video_demo.yaml"))
    start = time.perf_counter()
    loader = mixer.build_loader(recipe)
    it = iter(loader)
    next(it)
    first = time.perf_counter() - start
    for _ in range(19):
        next(it)
    state = loader.state_dict()
    start = time.perf_counter()
    again = mixer.build_loader(recipe)
    again.load_state_dict(state)
    next(iter(again))
    resumed = time.perf_counter() - start
    return [
        {
            "recipe": "video_demo.yaml",
            "first batch s": first,
            "first batch after resume at 20 s": resumed,
        }
    ]


def _table(rows: list[dict]) -> str:
    return format_table(rows, [(key, key) for key in rows[0]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--long-minutes", type=float, default=10)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child_peak(args.child)
        return
    import tempfile

    print(_table(frames_per_second(args.seconds, args.repeat)))
    with tempfile.TemporaryDirectory() as tmp:
        print()
        print(_table(peak_memory(args.long_minutes, Path(tmp))))
    print()
    print(_table(first_batch_and_resume()))


if __name__ == "__main__":
    main()
