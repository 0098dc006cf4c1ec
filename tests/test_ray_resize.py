"""Resizing the Ray actors mid-stream, by hand (`loader.resize_workers`) and by the
autoscaler (`RayWorkers(max_actors=...)`): the batches stay the stream of num_workers=0.
One local Ray cluster on 127.0.0.1 for the module; tiny lanes and batches."""

from __future__ import annotations

import logging
import os
import time

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import pytest  # noqa: E402
from helpers import batch_digest, corpus, make_tokenizer, take_digests, write_docs  # noqa: E402

import mixer  # noqa: E402

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("resize")
    for part in range(4):
        write_docs(root / f"d{part}.jsonl", corpus(part * 100, 100, max_len=20), "jsonl")
    return {
        "seed": 3,
        "tokenizer": str(make_tokenizer(root / "tokenizer.json")),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 4,
        "shuffle_window": 4,
        "sources": [{"name": "docs", "path": str(root / "*.jsonl"), "weight": 1}],
    }


def ray_loader(recipe: dict, **spec) -> mixer.Loader:
    return mixer.build_loader(
        recipe, workers=mixer.RayWorkers(**{"actors": 2, "cpus_per_actor": 0.5, **spec})
    )


@pytest.mark.slow
def test_resizes_mid_stream_keep_the_stream(cluster, recipe, caplog):
    """2 → 4 → 1 actors between batches; the state taken after them resumes without Ray."""
    want = take_digests(mixer.build_loader(recipe), 40)
    caplog.set_level(logging.INFO, logger="mixer.loader")
    with ray_loader(recipe) as loader:
        batches = iter(loader)
        got = [batch_digest(next(batches)) for _ in range(7)]
        assert loader.metrics()["workers"] == {"kind": "ray", "count": 2, "resizes": 0}
        loader.resize_workers(4)
        got += [batch_digest(next(batches)) for _ in range(9)]
        assert len(loader._tier.pool.actors) == 4
        loader.resize_workers(1)
        got += [batch_digest(next(batches)) for _ in range(8)]
        assert len(loader._tier.pool.actors) == 1
        assert loader.metrics()["workers"] == {"kind": "ray", "count": 1, "resizes": 2}
        state = loader.state_dict()
    assert got == want[:24]
    resumed = mixer.build_loader(recipe)
    resumed.load_state_dict(state)
    batches = iter(resumed)
    assert [batch_digest(next(batches)) for _ in range(16)] == want[24:]
    resumed.close()
    lines = [r.getMessage() for r in caplog.records if "Ray actors" in r.getMessage()]
    assert lines == ["Ray actors 2 → 4 (resize_workers)", "Ray actors 4 → 1 (resize_workers)"]


def test_refused_counts_and_loaders_without_ray(cluster, recipe):
    loader = ray_loader(recipe)
    with pytest.raises(mixer.TopologyError, match=r"valid actors for world_size 1: \[1, 2, 4\]"):
        loader.resize_workers(3)
    with pytest.raises(mixer.TopologyError, match=r"\[1, 2, 4\]"):
        loader.resize_workers(0)
    assert loader.metrics()["workers"] == {"kind": "ray", "count": 2, "resizes": 0}
    for workers, kind in ((0, "none"), (2, "dataloader")):
        local = mixer.build_loader(recipe, num_workers=workers)
        with pytest.raises(mixer.MixerError, match="DataLoader workers .* fixed for an iteration"):
            local.resize_workers(2)
        assert local.metrics()["workers"] == {"kind": kind, "count": workers, "resizes": 0}
    with pytest.raises(mixer.TopologyError, match="max_actors"):
        mixer.RayWorkers(actors=2, max_actors=1)


def count(loader: mixer.Loader) -> int:
    return loader.metrics()["workers"]["count"]


def consume(loader: mixer.Loader, until, sleep: float, seconds: float) -> list[str]:
    """Batches until `until(loader)` or `seconds`, sleeping `sleep` after each."""
    got: list[str] = []
    deadline = time.monotonic() + seconds
    for batch in loader:
        got.append(batch_digest(batch))
        if until(loader) or time.monotonic() > deadline:
            break
        time.sleep(sleep)
    return got


@pytest.mark.slow
def test_autoscaling_grows_while_the_consumer_waits_and_shrinks_while_actors_idle(
    cluster, recipe, caplog
):
    caplog.set_level(logging.INFO, logger="mixer.loader")
    # a consumer that never sleeps waits on the actors: 1 → 2 (max_actors)
    with ray_loader(recipe, actors=1, max_actors=2, in_flight=1) as hungry:
        got = consume(hungry, lambda loader: count(loader) == 2, 0.0, 30)
        assert count(hungry) == 2 and hungry.metrics()["workers"]["resizes"] == 1
        got += consume(hungry, lambda loader: False, 0.0, 0.3)  # (an iterator goes on)
    grow = [r.getMessage() for r in caplog.records if "Ray actors" in r.getMessage()]
    assert len(grow) == 1 and grow[0].startswith("Ray actors 1 → 2 (the consumer waited")
    # a sleeping consumer stays at `actors` for more than a window; put on 2 actors, the
    # autoscaler brings them back to 1 and stays
    with ray_loader(recipe, actors=1, max_actors=2, in_flight=1) as sated:
        slow = consume(sated, lambda loader: False, 0.2, 2.5)
        assert sated.metrics()["workers"] == {"kind": "ray", "count": 1, "resizes": 0}
        sated.resize_workers(2)
        slow += consume(sated, lambda loader: count(loader) == 1, 0.2, 20)
        assert count(sated) == 1
        slow += consume(sated, lambda loader: False, 0.2, 2.5)  # a whole window more: no growth
        assert sated.metrics()["workers"] == {"kind": "ray", "count": 1, "resizes": 2}
    shrink = [r.getMessage() for r in caplog.records if "Ray actors 2 → 1" in r.getMessage()]
    assert len(shrink) == 1 and "waited" in shrink[0] and "idled" in shrink[0]
    want = take_digests(mixer.build_loader(recipe), max(len(got), len(slow)))
    assert got == want[: len(got)] and slow == want[: len(slow)]
