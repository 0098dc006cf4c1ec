"""Run under torchrun by test_torchrun.py: iterate a finite recipe to its end on every rank."""

import json
import sys
from collections import Counter

import torch.distributed as dist

import mixer

dist.init_process_group("gloo")
recipe_path, out_path, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
loader = mixer.build_loader(mixer.load_recipe(recipe_path), num_workers=workers)
counts: Counter = Counter()
batches = padding = 0
with loader:
    for batch in loader:
        batches += 1
        padding += mixer.is_padding_batch(batch)
        counts.update(batch["input_ids"][batch["source_ids"] >= 0].tolist())
        if batches == 3:
            state = loader.state_dict()  # a collective mid-stream works and stays in step
with open(f"{out_path}.rank{dist.get_rank()}", "w") as f:
    json.dump(
        {
            "batches": batches,
            "padding": padding,
            "counts": counts,
            "state_kind": json.loads(state["json"])["kind"],
        },
        f,
    )
dist.barrier()
dist.destroy_process_group()
