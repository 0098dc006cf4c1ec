"""Ray actors vs DataLoader workers with the same process count, text and image+text.

    python benchmarks/ray_workers.py [--copies 2] [--batches 1000] [--image-batches 120]
                                     [--procs 2] [--only text|image] [--backend hf]
                                     [--overhead]

Each row runs in a fresh subprocess. After 5 warm-up batches, `--batches` batches (text: the
throughput corpus, 8 × 2048; image: recipes/multimodal_demo.yaml, qwen2_vl): tokens/s (and
images/s), and the CPU seconds every process spent on them, read from /proc: the driver, the
workers (DataLoader workers or the actors), and Ray's own processes (raylet, GCS, the idle
worker pool). "first batch" is the time from the first `next()` to the first batch (workers
or actors start inside it); "resume" the same in a new process (a restarted job: for Ray it
joins the running cluster before timing) given the state after the timed batches. The
driver's peak RSS counts the object store's shared pages it has read (Ray maps the store into
it): "of it object store" is their part after the timed batches. "wire B/token": the bytes a
batch crosses in (its arrays in their wire dtypes) per real token. The Ray rows start a local
cluster on 127.0.0.1 of `--procs` CPUs first (not counted). `--overhead` measures what one
object costs: 8 × 2048 text batches from 2 actors, one per call against 4 per call.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, format_table, recipe_for, write_corpus  # noqa: E402

WARMUP = 5
KINDS = {"dataloader": None, "ray": 2, "ray in_flight=8": 8}  # kind → in_flight


def cpu_by_group() -> dict[str, float]:
    """CPU seconds of this process and its descendants, by role."""
    import psutil

    me = psutil.Process()
    out = {"driver": 0.0, "workers": 0.0, "ray": 0.0}
    for proc in [me, *me.children(recursive=True)]:
        try:
            times, name = proc.cpu_times(), proc.name()
        except psutil.NoSuchProcess:
            continue
        role = (
            "driver"
            if proc.pid == me.pid
            else "workers"
            if name.startswith(("pt_data_worker", "ray::LaneActor"))
            else "ray"
        )
        out[role] += times.user + times.system
    return out


def _options(kind: str, procs: int, start_cluster: bool) -> dict:
    """build_loader's options for a kind; a Ray kind starts a local cluster or joins the one
    RAY_ADDRESS names (a restarted job), before any timing."""
    import mixer

    if KINDS[kind] is None:
        return {"num_workers": procs}
    import ray

    if start_cluster:
        ray.init(
            address="local",
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            num_cpus=procs,
            log_to_driver=False,
        )
    else:
        ray.init(log_to_driver=False)
    return {"workers": mixer.RayWorkers(actors=procs, in_flight=KINDS[kind])}


def _first(loader) -> tuple[object, float]:
    start = time.perf_counter()
    batches = iter(loader)
    next(batches)
    return batches, time.perf_counter() - start


def _steady(loader, batches: Iterator, count: int) -> dict:
    """Tokens, images, wire bytes, seconds and CPU seconds by role of `count` batches."""
    import numpy as np

    before, start = cpu_by_group(), time.perf_counter()
    tokens = images = wire = 0
    for _ in range(count):
        batch = next(batches)
        tokens += int((batch["source_ids"] >= 0).sum())
        images += len(batch["image_grid_thw"]) if "image_grid_thw" in batch else 0
        wire += sum(batch[s.key].numel() * np.dtype(s.wire).itemsize for s in loader.layout.specs)
    seconds, after = time.perf_counter() - start, cpu_by_group()
    return {
        "tokens": tokens,
        "images": images,
        "seconds": seconds,
        "wire": wire / tokens,
        "cpu": {role: after[role] - before[role] for role in after},
    }


def run(recipe: dict | str, kind: str, procs: int, count: int) -> dict:
    import psutil

    import mixer

    loader = mixer.build_loader(recipe, **_options(kind, procs, start_cluster=True))
    batches, first = _first(loader)
    for _ in range(WARMUP):
        next(batches)
    result = _steady(loader, batches, count)
    store = sum(m.rss for m in psutil.Process().memory_maps() if "/plasma" in m.path) / 2**20
    with tempfile.NamedTemporaryFile("w", suffix=".json") as state:
        json.dump(loader.state_dict(), state)
        state.flush()
        loader.close()
        env = {}
        if KINDS[kind] is not None:
            import ray

            env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        resume = _subprocess(
            f"import ray_workers as b; print(json.dumps(b.resume({recipe!r}, "
            f"{kind!r}, {procs}, {state.name!r})))",
            env,
        )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the driver's own
    return {
        **result,
        "first": first,
        "resume": resume,
        "rss": rss,
        "store": store,
        "backend": loader.backend.info.backend,
    }


def resume(recipe: dict | str, kind: str, procs: int, state: str) -> float:
    """In a new process (a restarted job): seconds to the first batch from a saved state."""
    import mixer

    loader = mixer.build_loader(recipe, **_options(kind, procs, start_cluster=False))
    with open(state) as f:
        loader.load_state_dict(json.load(f))
    first = _first(loader)[1]
    loader.close()
    return first


def _row(workload: str, kind: str, procs: int, r: dict, base: dict | None) -> dict:
    tps = r["tokens"] / r["seconds"]
    # CPU seconds per million tokens (text), CPU milliseconds per image (image+text)
    cpu, unit = r["cpu"], (r["images"] / 1e3 if workload == "image" else r["tokens"] / 1e6)
    who = "DataLoader workers" if kind == "dataloader" else kind.replace("ray", "Ray actors")
    ratio = tps / (base["tokens"] / base["seconds"]) if base else 1.0
    return {
        "run": f"{workload}: {procs} {who}",
        "tps": f"{tps / 1e6:.2f}M",
        "ratio": f"{ratio:.2f}",
        "ips": f"{r['images'] / r['seconds']:.0f}" if r["images"] else "-",
        "first": f"{r['first']:.2f}",
        "resume": f"{r['resume']:.2f}",
        "rss": f"{r['rss']:.0f}",
        "store": f"{r['store']:.0f}",
        "wire": f"{r['wire']:.1f}",
        "work": f"{cpu['workers'] / unit:.2f}",
        "driver": f"{cpu['driver'] / unit:.2f}",
        "ray": f"{cpu['ray'] / unit:.2f}",
    }


def _subprocess(code: str, env: dict | None = None) -> Any:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **(env or {})}  # 127.0.0.1
    prefix = f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
    out = (
        subprocess.run(
            [sys.executable, "-c", prefix + code],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    return json.loads(out)


def compare(args: argparse.Namespace, folder: str) -> None:
    text = recipe_for(Path(folder), tokenizer_backend=args.backend)
    image = str(ROOT / "recipes" / "multimodal_demo.yaml")
    rows = []
    for workload, recipe, batches in (
        ("text", text, args.batches),
        ("image", image, args.image_batches),
    ):
        if args.only not in (None, workload):
            continue
        base = None
        for kind in KINDS:
            code = (
                "import ray_workers as b; "
                f"print(json.dumps(b.run({recipe!r}, {kind!r}, {args.procs}, {batches})))"
            )
            result = _subprocess(code)
            rows.append(_row(workload, kind, args.procs, result, base))
            base = base or result
        print(f"{workload}: tokenizer backend {result['backend']}", flush=True)
    print(
        format_table(
            rows,
            [
                ("run", "run"),
                ("tps", "tokens/s"),
                ("ratio", "vs DataLoader"),
                ("ips", "images/s"),
                ("first", "first batch s"),
                ("resume", "resume first batch s"),
                ("rss", "driver peak RSS MB"),
                ("store", "of it object store"),
                ("wire", "wire B/token"),
                ("work", "workers' CPU s/M tokens | ms/image"),
                ("driver", "driver's"),
                ("ray", "Ray daemons'"),
            ],
        )
    )


def overhead(batches: int = 600) -> dict:
    """CPU ms per batch of the driver, the actors and Ray's processes: one object per batch
    against one per 4 batches (arrays of an 8 × 2048 text batch in its wire dtypes)."""
    import numpy as np
    import ray

    ray.init(
        address="local",
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        num_cpus=2,
        log_to_driver=False,
    )
    shapes = {
        "input_ids": np.int32,
        "labels": np.int32,
        "position_ids": np.int32,
        "source_ids": np.int32,
    }

    @ray.remote
    class LaneActor:  # (named as mixer's, so that cpu_by_group counts it as a worker)
        def __init__(self) -> None:
            self.batch = ({k: np.ones((8, 2048), t) for k, t in shapes.items()}, {"g": 0})

        def next(self, count: int) -> list:
            return [self.batch] * count

    actors = [LaneActor.remote() for _ in range(2)]
    ray.get([a.next.remote(1) for a in actors])
    out = {}
    for group in (1, 4):
        before = cpu_by_group()
        refs = [actors[i % 2].next.remote(group) for i in range(batches // group)]
        for ref in refs:
            for arrays, _ in ray.get(ref):
                arrays["input_ids"].astype(np.int64)
        after = cpu_by_group()
        out[group] = {k: (after[k] - before[k]) / batches * 1e3 for k in after}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--image-batches", type=int, default=120)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--only", choices=["text", "image"])
    parser.add_argument(
        "--backend",
        choices=["auto", "hf", "fastokens"],
        default="auto",
        help="the text recipe's tokenizer_backend",
    )
    parser.add_argument("--overhead", action="store_true")
    args = parser.parse_args()
    if args.overhead:
        result = _subprocess("import ray_workers as b; print(json.dumps(b.overhead()))")
        print(
            format_table(
                [
                    {"group": f"{g} batch(es) per call", **{k: f"{v:.2f}" for k, v in r.items()}}
                    for g, r in result.items()
                ],
                [
                    ("group", "objects"),
                    ("driver", "driver CPU ms/batch"),
                    ("workers", "actor CPU ms/batch"),
                    ("ray", "Ray daemons ms/batch"),
                ],
            )
        )
        return
    with tempfile.TemporaryDirectory() as folder:
        write_corpus(Path(folder), args.copies)
        compare(args, folder)


if __name__ == "__main__":
    main()
