"""torchrun driver for tests/test_ray_workers.py: each rank's loader on one Ray actor of the
cluster `RAY_ADDRESS` names, then on two DataLoader workers. argv: recipe (JSON), steps, output
prefix; writes `<prefix>.rank<r>`: per run, the batches' digests, `metrics(all_ranks=True)`
and `state_dict()` (both collectives)."""

from __future__ import annotations

import itertools
import json
import sys

import torch.distributed as dist
from helpers import batch_digest, delivered_metrics

import mixer


def run(recipe: dict, steps: int, **options) -> dict:
    with mixer.build_loader(recipe, **options) as loader:
        batches = iter(loader)
        digests = [batch_digest(batch) for batch in itertools.islice(batches, steps)]
        metrics = delivered_metrics(loader.metrics(all_ranks=True))
        return {"batches": digests, "metrics": metrics, "state": loader.state_dict()}


def main() -> None:
    recipe, steps, out = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    result = {
        "ray": run(recipe, steps, workers=mixer.RayWorkers(actors=1)),
        "dataloader": run(recipe, steps, num_workers=2),
    }
    with open(f"{out}.rank{dist.get_rank()}", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
