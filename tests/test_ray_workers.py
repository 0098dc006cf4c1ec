"""Ray actors as the loader's workers: the same stream, state and errors as DataLoader workers;
actors replaced when they die; none outlives its driver; placement on a data node; ranks of a
torchrun job sharing the cluster. One real two-node Ray cluster on 127.0.0.1 for the module
(`ray.cluster_utils.Cluster`: the head, where this driver runs, and a node offering the
custom resource `data_node`).

Ray turns `_node_ip_address="127.0.0.1"` into the machine's outward address (its
`resolve_ip_for_localhost`) unless `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, read when `ray` is
imported: set here first, so the cluster binds and reports 127.0.0.1 only (checked).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import pytest  # noqa: E402
from helpers import batch_digest, corpus, delivered_metrics, doc_text  # noqa: E402
from procs import run, spawn  # noqa: E402

import mixer  # noqa: E402

pytestmark = [pytest.mark.ray]

ray = pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster():
    """The GCS address, and the id of the data node."""
    from ray.cluster_utils import Cluster

    local = {"node_ip_address": "127.0.0.1", "num_cpus": 2}
    nodes = Cluster(initialize_head=True, head_node_args={**local, "include_dashboard": False})
    data_node = nodes.add_node(**local, resources={"data_node": 2})
    ray.init(address=nodes.address, log_to_driver=False)
    try:
        assert {node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]} == {
            "127.0.0.1"
        } and len(ray.nodes()) == 2
        assert ray.get_runtime_context().get_node_id() != data_node.node_id
        yield nodes.address, data_node.node_id
    finally:
        ray.shutdown()
        nodes.shutdown()


def digest(batch: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(batch):  # pixels and grids included
        h.update(key.encode() + batch[key].numpy().tobytes())
    return h.hexdigest()[:16]


def take(loader, n: int) -> list[str]:
    out: list[str] = []
    for batch in loader:
        out.append(digest(batch))
        if len(out) == n:
            break
    return out


def ray_loader(recipe, **spec) -> mixer.Loader:
    return mixer.build_loader(recipe, workers=mixer.RayWorkers(**{"actors": 2, **spec}))


def actor_states(ids: list[str]) -> list[str]:
    table = ray._private.state.state.actor_table(None)
    return [table[i]["State"] if i in table else "GONE" for i in ids]


def actor_nodes(loader: mixer.Loader) -> list[str]:
    table = ray._private.state.state.actor_table(None)
    return [table[actor._actor_id.hex()]["Address"]["NodeID"] for actor in loader._tier.pool.actors]


@pytest.mark.slow
def test_resources_place_the_actors_on_the_data_node(cluster, three_sources):
    """Placed by a custom resource; batches in groups of 4 (in_flight 8); the actors never
    import torch (seconds of their start)."""

    def imports_torch(_actor) -> bool:  # (nested: pickled by value, run in the actor)
        import sys

        return "torch" in sys.modules

    recipe = three_sources[0]
    reference = take(mixer.build_loader(recipe), 12)
    with ray_loader(recipe, resources={"data_node": 1}, in_flight=8) as loader:
        batches = iter(loader)
        assert [digest(next(batches)) for _ in range(12)] == reference
        assert actor_nodes(loader) == [cluster[1]] * 2
        assert not any(
            ray.get(
                [actor.__ray_call__.remote(imports_torch) for actor in loader._tier.pool.actors]
            )
        )


@pytest.mark.slow
def test_text_stream_is_the_local_stream_and_close_ends_the_actors(cluster, three_sources):
    recipe = three_sources[0]
    reference = take(mixer.build_loader(recipe), 30)
    assert take(mixer.build_loader(recipe, num_workers=2), 30) == reference
    loader = ray_loader(recipe)
    batches = iter(loader)
    assert [digest(next(batches)) for _ in range(30)] == reference
    ids = [actor._actor_id.hex() for actor in loader._tier.pool.actors]
    assert actor_states(ids) == ["ALIVE", "ALIVE"]
    loader.close()
    deadline = time.monotonic() + 10
    while actor_states(ids) != ["DEAD", "DEAD"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert actor_states(ids) == ["DEAD", "DEAD"]


@pytest.mark.slow
def test_image_stream_is_the_local_stream(cluster):
    recipe = str(ROOT / "recipes" / "multimodal_demo.yaml")
    reference = take(mixer.build_loader(recipe), 6)
    assert take(mixer.build_loader(recipe, num_workers=2), 6) == reference
    with ray_loader(recipe) as loader:
        batches = iter(loader)
        got = [next(batches) for _ in range(6)]
        assert [digest(b) for b in got] == reference
        assert sum(b["pixel_values"].numel() for b in got) > 0
        del got, batches


@pytest.mark.slow
def test_states_cross_between_ray_and_local_and_world_sizes(cluster, three_sources):
    recipe = three_sources[0]
    full = take(mixer.build_loader(recipe), 40)
    with ray_loader(recipe) as first:
        assert take(first, 7) == full[:7]
        state = json.loads(json.dumps(first.state_dict()))
    local = mixer.build_loader(recipe, num_workers=2)
    local.load_state_dict(state)
    assert take(local, 6) == full[7:13]
    back = ray_loader(recipe, actors=1)
    back.load_state_dict(local.state_dict())
    local.close()
    assert take(back, 5) == full[13:18]
    back.close()
    # two ranks on Ray, 5 steps each → one rank without Ray from global batch 10
    ranks = [
        mixer.build_loader(recipe, rank=r, world_size=2, workers=mixer.RayWorkers(actors=1))
        for r in (0, 1)
    ]
    steps = [take(loader, 5) for loader in ranks]
    assert [steps[g % 2][g // 2] for g in range(10)] == full[:10]
    merged = mixer.merge_states([loader.state_dict() for loader in ranks])
    for loader in ranks:
        loader.close()
    single = mixer.build_loader(recipe)
    single.load_state_dict(merged)
    assert take(single, 10) == full[10:20]


@pytest.mark.slow
def test_dead_actors_are_replaced_and_the_stream_is_unchanged(cluster, three_sources):
    recipe = {**three_sources[0], "shuffle_window": 5}
    reference = take(mixer.build_loader(recipe), 36)
    loader = ray_loader(recipe, in_flight=4)  # groups of 2
    batches = iter(loader)
    got = [digest(next(batches)) for _ in range(5)]
    ray.kill(loader._tier.pool.actors[0])
    got += [digest(next(batches)) for _ in range(13)]
    pid = ray.get(loader._tier.pool.actors[1].pid.remote())
    os.kill(pid, signal.SIGKILL)
    got += [digest(next(batches)) for _ in range(18)]
    assert got == reference
    assert loader._tier.pool.restarts == [1, 1]
    loader.close()


@pytest.mark.slow
def test_more_deaths_than_max_restarts_name_the_lanes(cluster, three_sources):
    loader = ray_loader(three_sources[0], max_restarts=1)
    batches = iter(loader)
    next(batches)
    ray.kill(loader._tier.pool.actors[0])
    killed = 1
    # A death shows when the driver asks for a batch the actor had not made yet (up to
    # in_flight of its batches may be done already).
    with pytest.raises(
        mixer.MixerError,
        match=r"lane\(s\) \[0, 2\] died 2 times.*"
        r"max_restarts=1.*last error",
    ):
        for _ in range(60):
            next(batches)
            if loader._tier.pool.restarts[0] == killed == 1:
                ray.kill(loader._tier.pool.actors[0])  # the replacement
                killed = 2
    loader.close()


@pytest.mark.slow
def test_data_error_inside_an_actor_keeps_its_attributes(cluster, tmp_path, tokenizer_path):
    good = "".join(json.dumps({"text": doc_text(d, n)}) + "\n" for d, n in corpus(0, 5))
    path = tmp_path / "x.jsonl"
    path.write_text(good + '{"text": "w1 w1"\n')
    recipe = {
        "seed": 1,
        "tokenizer": str(tokenizer_path),
        "seq_len": 16,
        "batch_size": 2,
        "lanes": 2,
        "sources": [{"name": "bad", "path": str(path), "weight": 1, "epochs": 1}],
    }
    with pytest.raises(mixer.DataError) as local:
        take(mixer.build_loader(recipe), 100)
    with pytest.raises(mixer.DataError) as remote:
        take(ray_loader(recipe, in_flight=8), 100)  # the error item inside a group
    for attr in ("source", "file", "location", "reason"):
        assert getattr(remote.value, attr) == getattr(local.value, attr)
    assert str(remote.value) == str(local.value) and remote.value.file == str(path)


def test_topology_errors(three_sources):
    recipe = three_sources[0]  # 4 lanes
    with pytest.raises(mixer.TopologyError, match="set num_workers=0"):
        mixer.build_loader(recipe, num_workers=2, workers=mixer.RayWorkers(actors=2))
    with pytest.raises(mixer.TopologyError, match=r"actors × world_size = 3 × 1"):
        mixer.build_loader(recipe, workers=mixer.RayWorkers(actors=3))
    with pytest.raises(mixer.TopologyError, match=r"actors × world_size = 2 × 4"):
        mixer.build_loader(recipe, rank=0, world_size=4, workers=mixer.RayWorkers(actors=2))
    with pytest.raises(mixer.TopologyError, match="in_flight"):
        mixer.RayWorkers(actors=2, in_flight=0)


@pytest.mark.slow
def test_set_weights_and_metrics_as_local(cluster, three_sources):
    recipe = three_sources[0]
    local, remote = mixer.build_loader(recipe, num_workers=2), ray_loader(recipe)
    out = []
    for loader in (local, remote):
        batches = iter(loader)
        got = [digest(next(batches)) for _ in range(5)]
        loader.set_weights({"prose": 1.0, "web": 3.0})
        got += [digest(next(batches)) for _ in range(12)]
        metrics = loader.metrics()
        out.append(
            (
                got,
                delivered_metrics(metrics),
                loader.metrics(all_ranks=True)["tokens"],
                loader.state_dict(),
            )
        )
        loader.close()
    assert out[0] == out[1]


def cache_stats(actor) -> dict:
    """The actor's own token-cache counters (per process)."""

    def read(_self) -> dict:  # (nested: pickled by value, run in the actor)
        from mixer.cache.store import CACHE_STATS

        return {
            "hits": CACHE_STATS.hits,
            "misses": CACHE_STATS.misses,
            "writes": CACHE_STATS.writes,
        }

    return ray.get(actor.__ray_call__.remote(read))


@pytest.mark.slow
def test_schedule_and_token_cache_as_local(cluster, three_sources, tmp_path):
    """Weights over global tokens change at batch 10; the actors fill the cache, and new
    actors are served from it: the same batches and metrics as one local process."""
    recipe = {
        **three_sources[0],
        "schedule": {
            "points": [
                {"at_tokens": 0, "weights": {"prose": 0.7, "code": 0.3}},
                {"at_tokens": 10 * 4 * 16, "weights": {"code": 0.2, "web": 0.8}},
            ]
        },
    }
    local = mixer.build_loader(recipe)
    reference = take(local, 30)
    expected = delivered_metrics(local.metrics())
    assert expected["tokens"]["prose"] > 0 and expected["tokens"]["web"] > 0  # both phases
    cached = {**recipe, "token_cache": str(tmp_path / "cache")}
    runs = []
    for _ in ("cold", "warm"):
        with ray_loader(cached) as loader:
            batches = iter(loader)
            assert [digest(next(batches)) for _ in range(30)] == reference
            assert delivered_metrics(loader.metrics()) == expected
            runs.append([cache_stats(actor) for actor in loader._tier.pool.actors])
    cold, warm = ({k: sum(s[k] for s in run) for k in ("hits", "misses", "writes")} for run in runs)
    assert cold["writes"] > 0 and cold["hits"] == 0
    assert warm["hits"] >= cold["writes"] and warm["writes"] == 0
    assert len(list((tmp_path / "cache").glob("??/*.bin"))) == cold["writes"]


@pytest.mark.slow
def test_torchrun_ranks_share_the_cluster(cluster, three_sources, tmp_path):
    """Two gloo ranks join the cluster through RAY_ADDRESS: each one's stream, the summed
    metrics and the gathered state equal those of DataLoader workers in the same job, and
    the ranks' steps interleave into the global stream."""
    recipe, steps = three_sources[0], 8
    env = {
        **os.environ,
        "RAY_ADDRESS": cluster[0],
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    drivers = len(ray._private.state.jobs())
    job = run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(Path(__file__).with_name("dist_ray_job.py")),
            json.dumps(recipe),
            str(steps),
            str(tmp_path / "out"),
        ],
        timeout=180,
        env=env,
    )
    assert job.returncode == 0, job.stderr[-5000:]
    assert len(ray._private.state.jobs()) == drivers + 2  # the ranks joined this cluster
    ranks = [json.loads((tmp_path / f"out.rank{r}").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert rank["ray"] == rank["dataloader"]
    assert ranks[0]["ray"]["state"] == ranks[1]["ray"]["state"]  # the gathered state
    assert ranks[0]["ray"]["metrics"] == ranks[1]["ray"]["metrics"]  # the summed metrics
    with mixer.build_loader(recipe) as single:
        batches = iter(single)
        reference = [batch_digest(next(batches)) for _ in range(2 * steps)]
        assert [ranks[g % 2]["ray"]["batches"][g // 2] for g in range(2 * steps)] == reference
        assert delivered_metrics(single.metrics()) == ranks[0]["ray"]["metrics"]
        after = [digest(next(batches)) for _ in range(4)]
    resumed = mixer.build_loader(recipe)
    resumed.load_state_dict(ranks[1]["ray"]["state"])
    assert take(resumed, 4) == after


@pytest.mark.slow
def test_killed_driver_leaves_no_actor(cluster, three_sources):
    driver = spawn(
        [
            sys.executable,
            str(Path(__file__).with_name("ray_driver.py")),
            cluster[0],
            json.dumps(three_sources[0]),
        ]
    )
    try:
        line = driver.stdout.readline()
        assert line, driver.stderr.read()
        ids = json.loads(line)
        assert actor_states(ids) == ["ALIVE", "ALIVE"]
    finally:
        driver.kill()
        driver.wait()
    deadline = time.monotonic() + 20
    while any(s != "DEAD" for s in actor_states(ids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert actor_states(ids) == ["DEAD", "DEAD"]
