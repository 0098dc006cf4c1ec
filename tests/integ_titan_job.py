"""A torchtitan training loop on a MixerDataLoader, checkpointed by torchtitan's own
CheckpointManager (DCP) with its optimizer and LR-scheduler containers
(tests/test_integrations.py): the loop of torchtitan's Trainer (batch, forward, its loss,
optimizer and scheduler steps, `checkpointer.save(step)`), on CPU with a transformers Llama.
The Trainer itself cannot run here: with no accelerator it takes the device type "cuda" and
calls `torch.cuda.set_device`.

    torchrun --nproc_per_node 2 integ_titan_job.py RECIPE OUT STEPS SAVE_AT KILL killed
        trains saving every SAVE_AT steps (OUT/ckpt); every rank SIGKILLs itself in step KILL
        (OUT/killed.rank*)
    torchrun --nproc_per_node 2 integ_titan_job.py RECIPE OUT STEPS SAVE_AT KILL resume
        loads the latest checkpoint (`CheckpointManager.load()`) and trains to STEPS
        (OUT/resumed.rank*); prints what two processes of one DP rank see (ONE_DP_RANK);
        then, the process group gone, rank 0 alone (one DP rank) loads the same checkpoint
        and trains to STEPS (OUT/elastic.rank0)
"""

from __future__ import annotations

import logging
import sys

import torch.distributed as dist
from integ_common import DigestLog, say, tiny_llama, titan_view
from torch.nn.parallel import DistributedDataParallel
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.loss import IGNORE_INDEX, cross_entropy_loss
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.components.optimizer.optimizer import ParamGroupConfig

from mixer.integrations.torchtitan import MixerDataLoader
from mixer.runtime.state import unpack


class TrainState:
    """The step, checkpointed like torchtitan's Trainer checkpoints its own (`train_state`)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


def train(
    recipe: str,
    out: str,
    steps: int,
    name: str,
    *,
    save_at: int | None = None,
    kill: int | None = None,
) -> None:
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    model = tiny_llama()
    data = MixerDataLoader.Config(recipe=recipe).build(
        dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=32, local_batch_size=2
    )
    optimizers = OptimizersContainer.Config(
        param_groups=[
            ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3})
        ],
        implementation="for-loop",
    ).build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=1).build(
        optimizers=optimizers, training_steps=steps
    )
    state = TrainState()
    checkpointer = CheckpointManager.Config(
        enable=True,
        folder="ckpt",
        interval=save_at or steps,
        keep_latest_k=0,
        last_save_model_only=False,
        load_only=save_at is None,
    ).build(
        dataloader=data,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=schedulers,
        states={"train_state": state},
        sd_adapter=None,
        base_folder=out,
    )
    checkpointer.load()  # the latest checkpoint in OUT/ckpt, if any
    say(f"{name}: rank {rank} of {world} starts after step {state.step}")
    forward = DistributedDataParallel(model) if world > 1 else model
    seen = DigestLog(f"{out}/{name}", rank, kill_after=kill)
    batches = iter(data)
    while state.step < steps:
        state.step += 1
        inputs, labels = next(batches)
        seen(titan_view(inputs, labels))
        logits = forward(input_ids=inputs["input"], position_ids=inputs["positions"]).logits
        loss = cross_entropy_loss(logits, labels) / (labels != IGNORE_INDEX).sum().clamp(min=1)
        loss.backward()
        optimizers.step()
        schedulers.step()
        optimizers.zero_grad()
        checkpointer.save(state.step, last_step=state.step == steps)
    checkpointer.close()


def main() -> None:
    recipe, out, steps, save_at, kill, phase = sys.argv[1:7]
    steps, save_at, kill = int(steps), int(save_at), int(kill)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    dist.init_process_group("gloo")
    if phase == "killed":
        train(recipe, out, steps, "killed", save_at=save_at, kill=kill)
        raise AssertionError("not killed")
    train(recipe, out, steps, "resumed")
    rank = dist.get_rank()
    # Both processes one DP rank (as under tensor parallelism of 2): the same batches, and
    # state_dict() gathers one state per DP rank.
    one = MixerDataLoader(recipe, dp_rank=0, dp_world_size=1)
    first = [titan_view(*batch)["input_ids"].sum().item() for _, batch in zip(range(2), one)]
    # One string, one write: the ranks share stdout, unbuffered under torchrun.
    say(f"ONE_DP_RANK {rank} {first} {unpack(one.state_dict())['next_global']}")
    dist.destroy_process_group()
    if rank == 0:  # 2 -> 1 DP ranks
        train(recipe, out, steps, "elastic")


if __name__ == "__main__":
    main()
