"""torchrun driver: set_weights and metrics(all_ranks=True) as collectives (see
test_online_mixing_torchrun.py). argv: recipe, output prefix; writes `<prefix>.<mode>.rank<r>`
for each mode ("metrics", then "mismatch") from one job, so the test pays for one launch."""

from __future__ import annotations

import itertools
import json
import sys

import torch.distributed as dist

import mixer


def run(recipe: str, mode: str, out: str, rank: int) -> None:
    loader = mixer.build_loader(recipe)
    batches = list(itertools.islice(loader, 3))
    result: dict = {"rank": rank}
    if mode == "mismatch":
        try:
            loader.set_weights({"a": 1.0, "b": 1.0 + rank})
            result["error"] = None
        except mixer.StateError as exc:
            result["error"] = str(exc)
    else:
        mine = loader.metrics()
        summed = loader.metrics(all_ranks=True)
        delivered = sum(int((b["source_ids"] >= 0).sum()) for b in batches)
        result.update(mine=mine["tokens"], summed=summed["tokens"], delivered=delivered)
    with open(f"{out}.{mode}.rank{rank}", "w") as f:
        json.dump(result, f)
    loader.close()
    dist.barrier()


def main() -> None:
    recipe, out = sys.argv[1:3]
    dist.init_process_group("gloo")
    for mode in ("metrics", "mismatch"):
        run(recipe, mode, out, dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
