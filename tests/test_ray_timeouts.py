"""A trainer never waits for ever on Ray: an actor that delivers nothing for `stall_timeout`
(a stopped process) is replaced with the stream unchanged; an actor that cannot be placed
raises a `MixerError` within `placement_timeout` naming what it asks for and what the nodes
offer, at start and for a replacement once the only node offering `{"data_node": 1}` is gone
(while a second data node stands, the replacement goes there and the stream is unchanged).
One real `ray.cluster_utils.Cluster` on 127.0.0.1 for the module (see test_ray_workers.py)."""

from __future__ import annotations

import logging
import os
import signal
import time

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import pytest  # noqa: E402
from helpers import batch_digest, corpus, make_tokenizer, take_digests, write_docs  # noqa: E402

import mixer  # noqa: E402

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    local = {"node_ip_address": "127.0.0.1", "num_cpus": 2}
    nodes = Cluster(initialize_head=True, head_node_args={**local, "include_dashboard": False})
    ray.init(address=nodes.address, log_to_driver=False)
    try:
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("timeouts")
    for part in range(4):
        write_docs(root / f"d{part}.jsonl", corpus(part * 100, 100, max_len=20), "jsonl")
    return {
        "seed": 5,
        "tokenizer": str(make_tokenizer(root / "tokenizer.json")),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 2,
        "shuffle_window": 4,
        "sources": [{"name": "docs", "path": str(root / "*.jsonl"), "weight": 1}],
    }


def test_a_stopped_actor_is_replaced_after_stall_timeout(cluster, recipe, caplog):
    want = take_digests(mixer.build_loader(recipe), 30)
    spec = mixer.RayWorkers(actors=2, cpus_per_actor=0.5, stall_timeout=2.0)
    loader = mixer.build_loader(recipe, workers=spec)
    batches = iter(loader)
    got = [batch_digest(next(batches)) for _ in range(6)]
    pid = ray.get(loader._tier.pool.actors[1].pid.remote())
    os.kill(pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        got += [batch_digest(next(batches)) for _ in range(24)]
        waited = time.monotonic() - began
    finally:
        os.kill(pid, signal.SIGKILL)  # (stopped processes ignore all else)
    assert got == want
    assert loader._tier.pool.restarts == [0, 1]
    assert 2.0 <= waited < 30
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "lane(s) [1] delivered nothing for 2." in w and "stall_timeout=2 s" in w for w in warnings
    ), warnings
    loader.close()


def test_a_resource_no_node_has_raises_within_placement_timeout(cluster, recipe):
    spec = mixer.RayWorkers(actors=1, resources={"gpu_box": 1}, placement_timeout=1.5)
    began = time.monotonic()
    with pytest.raises(
        mixer.MixerError,
        match=r"1 of 1 Ray actor.*not running 1.5 s.*placement_timeout.*"
        r"asks for \{'CPU': 1, 'gpu_box': 1\}.*nodes offer 127\.0\.0\.1 \{'CPU': 2\}",
    ):
        next(iter(mixer.build_loader(recipe, workers=spec)))
    assert time.monotonic() - began < 15


def node_of(actor) -> str:
    return ray._private.state.state.actor_table(None)[actor._actor_id.hex()]["Address"]["NodeID"]


def test_a_lost_data_node_moves_its_actor_or_raises_within_placement_timeout(cluster, recipe):
    """Two nodes offer data_node: losing the actor's node moves it to the other, stream
    unchanged; losing that one too leaves nowhere to place it: a MixerError, not a hang."""
    want = take_digests(mixer.build_loader(recipe), 24)
    data = {
        n.node_id: n
        for n in (cluster.add_node(num_cpus=1, resources={"data_node": 1}) for _ in "ab")
    }
    spec = mixer.RayWorkers(
        actors=1, cpus_per_actor=0.5, resources={"data_node": 1}, placement_timeout=10.0
    )
    loader = mixer.build_loader(recipe, workers=spec)
    batches = iter(loader)
    got = [batch_digest(next(batches)) for _ in range(4)]
    first = node_of(loader._tier.pool.actors[0])
    cluster.remove_node(data.pop(first))
    began = time.monotonic()
    got += [batch_digest(next(batches)) for _ in range(20)]
    assert time.monotonic() - began < 20
    assert got == want and loader._tier.pool.restarts == [1]
    (second,) = data
    assert node_of(loader._tier.pool.actors[0]) == second
    cluster.remove_node(data.pop(second))
    began = time.monotonic()
    with pytest.raises(
        mixer.MixerError,
        match=r"not running 10 s.*asks for \{'CPU': 0.5, 'data_node': 1\}.*"
        r"nodes offer 127\.0\.0\.1 \{'CPU': 2\}; add a node",
    ):
        for _ in range(200):
            next(batches)
    assert time.monotonic() - began < 40
    loader.close()
