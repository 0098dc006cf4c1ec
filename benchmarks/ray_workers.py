"""Ray actors vs DataLoader workers with the same process count, on the same corpus.

    python benchmarks/ray_workers.py [--copies 4] [--batches 60] [--procs 2]

Each row runs in a fresh subprocess (its own peak RSS): `--batches` batches of 8 × 2048
(tokens/s after the first batch: steady state), the time to the first batch, and the time to
the first batch of a loader resuming from the state after half of them; the driver's own peak
RSS (not its workers'). The Ray rows start a local cluster on 127.0.0.1 first (its start is
not counted). "store B/token" is what the batches put in the object store (their arrays in the
wire dtypes) per real token.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import format_table, recipe_for, write_corpus  # noqa: E402


def _timed(loader, batches: int) -> tuple[float, float, int]:
    """(seconds to the first batch, seconds and real tokens of the batches after it)."""
    start = time.perf_counter()
    first, tokens = None, 0
    for i, batch in enumerate(loader):
        if first is None:
            first = time.perf_counter() - start
        else:
            tokens += int((batch["source_ids"] >= 0).sum())
        if i + 1 == batches:
            break
    first = first or 0.0
    return first, time.perf_counter() - start - first, tokens


def run(folder: str, kind: str, procs: int, batches: int) -> dict:
    import numpy as np

    import mixer

    options: dict = {"num_workers": procs}
    if kind == "ray":
        import ray

        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1",
                 num_cpus=procs, log_to_driver=False)
        options = {"workers": mixer.RayWorkers(actors=procs)}
    recipe = recipe_for(Path(folder))
    loader = mixer.build_loader(recipe, **options)
    first, seconds, tokens = _timed(loader, batches)
    slots = sum(np.dtype(spec.wire).itemsize for spec in loader.layout.specs)
    store = slots * recipe["batch_size"] * recipe["seq_len"] * (batches - 1) / max(tokens, 1)
    half = mixer.build_loader(recipe, **options)
    _timed(half, batches // 2)
    state = half.state_dict()
    half.close()
    resumed = mixer.build_loader(recipe, **options)
    resumed.load_state_dict(state)
    resume_first, _, _ = _timed(resumed, 1)
    resumed.close()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"tokens_per_s": tokens / seconds, "first_s": first, "resume_first_s": resume_first,
            "rss_mb": rss_mb, "store_bytes_per_token": store}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--procs", type=int, default=2)
    args = parser.parse_args()
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}   # 127.0.0.1 only
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        write_corpus(Path(folder), args.copies)
        for kind in ("dataloader", "ray"):
            code = (f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                    f"import ray_workers as b; print(json.dumps(b.run({folder!r}, {kind!r}, "
                    f"{args.procs}, {args.batches})))")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 env=env, check=True).stdout.strip().splitlines()[-1]
            r = json.loads(out)
            label = (f"{args.procs} DataLoader workers" if kind == "dataloader"
                     else f"{args.procs} Ray actors")
            rows.append({"workers": label, "tps": f"{r['tokens_per_s'] / 1e6:.2f}M",
                         "first": f"{r['first_s']:.2f}", "resume": f"{r['resume_first_s']:.2f}",
                         "rss": f"{r['rss_mb']:.0f}",
                         "store": f"{r['store_bytes_per_token']:.1f}"})
    print(format_table(rows, [("workers", "workers"), ("tps", "tokens/s"),
                              ("first", "first batch s"), ("resume", "resume first batch s"),
                              ("rss", "driver peak RSS MB"), ("store", "store B/token")]))


if __name__ == "__main__":
    main()
