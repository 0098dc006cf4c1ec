"""torchrun driver for test_online_mixing.py: online mixing under torch.distributed (gloo).
argv: recipe json, output prefix, steps, cut. Each rank reports its batches' losses and logs
`{g, digest, weights}` per step to `<prefix>.rank<r>`; after `cut` steps rank 0 writes the
(collective) state to `<prefix>.state`."""

from __future__ import annotations

import json
import sys

import torch.distributed as dist
from helpers import batch_digest
from online_mixing_common import fake_loss

import mixer


def main() -> None:
    recipe_path, prefix, steps, cut = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(recipe_path) as f:
        loader = mixer.build_loader(json.load(f))
    log = []
    it = iter(loader)
    for step in range(steps):
        g = loader.next_global_batch
        batch = next(it)
        loader.report_loss(fake_loss(batch), batch)
        log.append({"g": g, "digest": batch_digest(batch), "mixing": loader.metrics()["mixing"]})
        if step + 1 == cut:
            state = loader.state_dict()  # a collective
            if rank == 0:
                with open(f"{prefix}.state", "w") as f:
                    json.dump(state, f)
    with open(f"{prefix}.rank{rank}", "w") as f:
        json.dump(log, f)
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
