"""Run under torchrun by test_torchrun.py: only rank 0 calls the collective state_dict().
argv: recipe, a path rank 0 creates once it has its answer (rank 1 waits for it)."""

import sys
import time
from pathlib import Path

import torch.distributed as dist

import mixer

dist.init_process_group("gloo")
loader = mixer.build_loader(mixer.load_recipe(sys.argv[1]))
answered = Path(sys.argv[2])
if dist.get_rank() == 0:
    start = time.monotonic()
    try:
        loader.state_dict()
        print("NO ERROR", flush=True)
    except RuntimeError as exc:
        print(f"RAISED after {time.monotonic() - start:.0f}s: {exc}", flush=True)
    answered.touch()
else:
    # never calls state_dict(); stays in the group until rank 0 has its answer (leaving
    # earlier would end rank 0's collective by a closed connection, not by its timeout)
    deadline = time.monotonic() + 60
    while not answered.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
# Every driver ends its process group (a group left to interpreter finalization can abort
# the process: pytorch/pytorch#190489).
dist.destroy_process_group()
