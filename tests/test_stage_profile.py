"""The loader's stage profile (`metrics()["stages"]`, `["wait"]`, `["bottleneck"]`) names the
bottleneck of workloads built to have one: a consumer that sleeps (the trainer), storage whose
reads sleep (read), a slow tokenizer (encode), large photos (media); at num_workers 0 and 2,
and on Ray actors. The counters are the iteration's: a resumed loader starts them at 0."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from fsspec import register_implementation
from fsspec.implementations.memory import MemoryFileSystem
from helpers import corpus, make_tokenizer, write_docs
from image_data import Sample, make_vlm_tokenizer, write_tar

import mixer
from mixer.core.stages import STAGES
from mixer.runtime.profile import profile_metrics, sum_profiles
from mixer.tokenize.backends import HfBackend

BATCHES = 14


class SlowFS(MemoryFileSystem):
    """Object storage whose every ranged read waits `DELAY` seconds (a far-away bucket)."""

    protocol = "slowmem"
    store: dict = {}  # its own files, not MemoryFileSystem's
    pseudo_dirs = [""]
    DELAY = 0.03
    calls = 0  # in this process

    @classmethod
    def _strip_protocol(cls, path):
        return MemoryFileSystem._strip_protocol(path.removeprefix("slowmem://"))

    def cat_file(self, path, start=None, end=None, **kwargs):
        time.sleep(self.DELAY)
        SlowFS.calls += 1
        return super().cat_file(path, start=start, end=end, **kwargs)


register_implementation("slowmem", SlowFS, clobber=True)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """A tokenizer and 16 small jsonl files (local, and the same files on `slowmem://`)."""
    root = tmp_path_factory.mktemp("profile")
    tokenizer = make_tokenizer(root / "tokenizer.json")
    fs = SlowFS()
    for i in range(16):
        path = write_docs(root / "docs" / f"part-{i:02d}.jsonl", corpus(i * 8, 8), "jsonl")
        fs.pipe_file(f"/corpus/part-{i:02d}.jsonl", path.read_bytes())
    return root, tokenizer


def text_recipe(text, path: str | None = None) -> dict:
    root, tokenizer = text
    return {
        "seed": 3,
        "tokenizer": str(tokenizer),
        "tokenizer_backend": "hf",
        "seq_len": 32,
        "batch_size": 2,
        "lanes": 2,
        "shuffle_window": 4,
        "sources": [{"name": "docs", "path": path or str(root / "docs" / "*.jsonl"), "weight": 1}],
    }


def drain(loader, batches: int = BATCHES, sleep: float = 0.0) -> dict:
    """Take `batches` batches like a trainer whose step takes `sleep` seconds; the metrics."""
    with loader:
        for got, _ in enumerate(loader, 1):
            if got == batches:
                break
            time.sleep(sleep)
        return loader.metrics()


def check_shapes(metrics: dict, batches: int = BATCHES) -> None:
    stages, wait = metrics["stages"], metrics["wait"]
    assert list(stages) == list(STAGES)
    assert all(set(s) == {"busy_s", "share"} for s in stages.values())
    assert sum(s["share"] for s in stages.values()) == pytest.approx(1.0)
    assert set(wait) == {"batches", "wait_s", "share", "p50_ms", "p99_ms", "first_s"}
    assert wait["batches"] == batches - 1  # the first batch's wait is `first_s` alone
    assert 0 <= wait["share"] <= 1 and 0 <= wait["p50_ms"] <= wait["p99_ms"]
    assert wait["first_s"] > 0
    assert metrics["bottleneck"] in ("trainer", *STAGES)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_sleeping_consumer_is_the_bottleneck(text, workers):
    # 0.2 s a step: the loader's few ms a batch stay under 5 % even on a loaded machine.
    metrics = drain(mixer.build_loader(text_recipe(text), num_workers=workers), sleep=0.2)
    check_shapes(metrics)
    assert metrics["wait"]["share"] <= 0.05
    assert metrics["bottleneck"] == "trainer"
    # The work is measured wherever it ran: documents decoded, tokenized and packed.
    for stage in ("decode", "encode", "pack"):
        assert metrics["stages"][stage]["busy_s"] > 0
    if workers:  # a worker's send and the loader's receipt
        assert metrics["stages"]["transfer"]["busy_s"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_storage_whose_reads_sleep_is_the_bottleneck(text, workers):
    loader = mixer.build_loader(text_recipe(text, "slowmem://corpus/*.jsonl"), num_workers=workers)
    SlowFS.calls = 0
    metrics = drain(loader)
    check_shapes(metrics)
    read = metrics["stages"]["read"]
    assert metrics["bottleneck"] == "read" and read["share"] > 0.5
    if not workers:  # each read's wait counted, once (not also as decode)
        assert read["busy_s"] == pytest.approx(SlowFS.calls * SlowFS.DELAY, rel=0.3)


@pytest.fixture
def slow_tokenizer(monkeypatch):
    """The `tokenizers` backend, 20 ms slower per call (also in forked workers)."""
    encode = HfBackend.encode_docs

    def slow(self, texts, bos, eos):
        time.sleep(0.02)
        return encode(self, texts, bos, eos)

    monkeypatch.setattr(HfBackend, "encode_docs", slow)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_slow_tokenizer_is_the_bottleneck(text, slow_tokenizer, workers):
    metrics = drain(mixer.build_loader(text_recipe(text), num_workers=workers))
    check_shapes(metrics)
    assert metrics["bottleneck"] == "encode"
    # Its time is encode's, not also pack's (which waited for it on another thread).
    assert metrics["stages"]["encode"]["share"] > 0.5


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Image+text samples whose pictures are large photos (JPEG noise: slow to decode)."""
    root = tmp_path_factory.mktemp("photos")
    tokenizer = make_vlm_tokenizer(root / "tokenizer.json")
    for shard in range(2):
        samples = [Sample(shard * 3 + i, 6, [(400, 300)], fmt="jpg") for i in range(3)]
        write_tar(root / "pics" / f"shard-{shard}.tar", samples)
    return {
        "seed": 1,
        "tokenizer": str(tokenizer),
        "tokenizer_backend": "hf",
        "seq_len": 128,
        "batch_size": 1,
        "lanes": 2,
        "images": {"layout": "qwen2_vl", "min_pixels": 784, "max_pixels": 56 * 56},
        "sources": [{"name": "pics", "path": str(root / "pics" / "*.tar"), "weight": 1}],
    }


@pytest.mark.parametrize("workers", [0, 2])
def test_large_photos_are_the_bottleneck(photos, workers):
    metrics = drain(mixer.build_loader(photos, num_workers=workers), batches=6)
    check_shapes(metrics, batches=6)
    assert metrics["bottleneck"] == "media"
    assert metrics["stages"]["media"]["share"] > 0.5


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_audio_clips_features_are_media_time(workers):
    """Decoding clips and computing their log-mel features is `media`, not `pack` (where the
    layout gathers them into the batch)."""
    recipe = str(Path(__file__).resolve().parent.parent / "recipes" / "audio_demo.yaml")
    metrics = drain(mixer.build_loader(recipe, num_workers=workers), batches=6)
    assert metrics["bottleneck"] == "media"
    assert metrics["stages"]["media"]["busy_s"] > metrics["stages"]["pack"]["busy_s"]


@pytest.mark.slow
@pytest.mark.ray
def test_ray_actors_send_their_stage_seconds_with_the_batches(photos):
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray = pytest.importorskip("ray")
    try:
        loader = mixer.build_loader(photos, workers=mixer.RayWorkers(actors=2))
        metrics = drain(loader, batches=6)
    finally:
        ray.shutdown()
    check_shapes(metrics, batches=6)
    assert metrics["bottleneck"] == "media"  # measured in the actors, not in this process
    assert metrics["stages"]["media"]["share"] > 0.5
    assert metrics["stages"]["transfer"]["busy_s"] > 0


def test_the_counters_are_the_iterations_not_the_states(text):
    recipe = text_recipe(text)
    first = mixer.build_loader(recipe)
    drain(first, batches=5)
    state = first.state_dict()
    resumed = mixer.build_loader(recipe)
    resumed.load_state_dict(state)
    before = resumed.metrics()
    assert all(s["busy_s"] == 0 for s in before["stages"].values())
    assert before["wait"]["batches"] == 0 and before["wait"]["wait_s"] == 0
    assert before["bottleneck"] == "trainer"  # nothing waited yet
    after = drain(resumed, batches=3)
    assert after["wait"]["batches"] == 2
    # A second iteration of the same loader starts its own counters too.
    again = drain(resumed, batches=2)
    assert again["wait"]["batches"] == 1


def test_all_ranks_sum_the_seconds_and_merge_the_waits():
    def rank(busy: list[float], waits: list[float], wall: float) -> dict:
        buckets: dict[int, int] = {}
        for w in waits:
            b = int(np.log(w / 1e-6) / np.log(1.02)) + 1
            buckets[b] = buckets.get(b, 0) + 1
        wait = {"batches": len(waits), "wait_s": sum(waits), "wall_s": wall, "first_s": 0.5}
        return {"busy": busy, "wait": {**wait, "buckets": buckets}}

    a = rank([1.0, 0, 0, 0, 0, 0], [0.010] * 99 + [0.5], wall=10.0)
    b = rank([0, 0, 3.0, 0, 0, 0], [0.020] * 50, wall=10.0)
    summed = profile_metrics(sum_profiles([a, b]))
    assert summed["stages"]["read"] == {"busy_s": 1.0, "share": 0.25}
    assert summed["stages"]["encode"] == {"busy_s": 3.0, "share": 0.75}
    wait = summed["wait"]
    assert wait["batches"] == 150 and wait["wait_s"] == pytest.approx(2.49)
    assert wait["share"] == pytest.approx(2.49 / 20)
    assert wait["p50_ms"] == pytest.approx(10, rel=0.02)
    assert wait["p99_ms"] == pytest.approx(20, rel=0.02)
    assert summed["bottleneck"] == "encode"
