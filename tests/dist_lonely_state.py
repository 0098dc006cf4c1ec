"""Run under torchrun by test_torchrun.py: only rank 0 calls the collective state_dict()."""

import sys
import time

import torch.distributed as dist

import mixer

dist.init_process_group("gloo")
loader = mixer.build_loader(mixer.load_recipe(sys.argv[1]))
if dist.get_rank() == 0:
    start = time.monotonic()
    try:
        loader.state_dict()
        print("NO ERROR", flush=True)
    except RuntimeError as exc:
        print(f"RAISED after {time.monotonic() - start:.0f}s: {exc}", flush=True)
else:
    time.sleep(8)  # never calls state_dict(); exits without joining any collective
# Every driver ends its process group (a group left to interpreter finalization can abort
# the process: pytorch/pytorch#190489).
dist.destroy_process_group()
