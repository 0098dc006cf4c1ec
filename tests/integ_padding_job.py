"""torchrun --nproc_per_node 2 integ_padding_job.py RECIPE: a DDP loop over a finite recipe
through `steps_with_data` (tests/test_trainer_edges.py). Prints, per rank, the steps' padding
pattern ("P" padding, "." real) and a digest of the weights after the last step."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from integ_common import say
from torch.nn.parallel import DistributedDataParallel

import mixer
from mixer.integrations.common import steps_with_data


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Embedding(8192, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    pattern = []
    with mixer.build_loader(sys.argv[1]) as loader:
        for (batch,) in steps_with_data(loader, 1, loader.recipe.finite):
            padding = mixer.is_padding_batch(batch)
            pattern.append("P" if padding else ".")
            out = model(batch["input_ids"]).sum()
            (out * 0.0 if padding else out).backward()  # zero weight, still a DDP step
            optimizer.step()
            optimizer.zero_grad()
    weights = float(model.module.weight.detach().double().sum())
    say(f"RANK {rank} {''.join(pattern)} {weights:.9f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
