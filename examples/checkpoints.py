"""DCP checkpoints of model, optimizer and loader, shared by the example training scripts.

`loader.state_dict()` is a collective inside a torch.distributed job, so every rank saves and
loads; the loader goes into the DCP state as it is (DCP calls its state_dict methods).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest complete `step-N` checkpoint in `folder`, if any."""
    done = sorted(
        (p for p in folder.glob("step-*") if (p / ".metadata").exists()),
        key=lambda p: int(p.name.split("-")[1]),
    )
    return done[-1] if done else None


def load_latest(
    folder: Path, model, optimizer, loader, extra: dict[str, torch.Tensor] | None = None
) -> tuple[int, Path | None]:
    """Restore model, optimizer and loader (and the `extra` tensors, in place) from the
    newest checkpoint: (its step, its path), or (0, None) when there is none."""
    found = latest_checkpoint(folder)
    if found is None:
        return 0, None
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "data": loader, "step": torch.tensor(0)}
    if extra:
        state["extra"] = extra
    dcp.load(state, checkpoint_id=str(found))  # calls loader.load_state_dict
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    return int(state["step"]), found


def save(
    folder: Path, step: int, model, optimizer, loader, extra: dict[str, torch.Tensor] | None = None
) -> None:
    """Write `folder/step-{step}` (on every rank: the loader's state is a collective)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "data": loader, "step": torch.tensor(step)}
    if extra:
        state["extra"] = extra
    dcp.save(state, checkpoint_id=str(folder / f"step-{step}"))
