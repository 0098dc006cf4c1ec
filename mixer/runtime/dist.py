"""The only module that asks torch.distributed (or the environment) about rank and world."""

from __future__ import annotations

import atexit
import datetime
import os
from typing import Any

import torch.distributed as dist


def collective_timeout() -> datetime.timedelta:
    """How long mixer's collectives wait for a missing rank before failing (default 120 s)."""
    return datetime.timedelta(seconds=float(os.environ.get("MIXER_COLLECTIVE_TIMEOUT_S", 120)))


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank_and_world() -> tuple[int, int]:
    """(rank, world_size) of the initialized process group, else (0, 1)."""
    if is_distributed():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# (the default group it was made for, mixer's gloo subgroup of it) when training uses NCCL
_gloo_subgroup: tuple[Any, Any] | None = None


def _forget_subgroup() -> None:
    # At exit, drop the subgroup while the interpreter is whole: a process group destroyed
    # during finalization can abort the process from gloo's threads.
    global _gloo_subgroup
    _gloo_subgroup = None


def gloo_group() -> Any:
    """A gloo group for mixer's small CPU collectives (also when training uses NCCL).

    Never kept past the default group it belongs to: after `destroy_process_group` and a new
    `init_process_group` (an in-process restart), collectives use the new group's members.
    """
    global _gloo_subgroup
    world = dist.group.WORLD
    if dist.get_backend() == "gloo":
        return world
    if _gloo_subgroup is None or _gloo_subgroup[0] is not world:
        if _gloo_subgroup is None:
            atexit.register(_forget_subgroup)
        _gloo_subgroup = (world, dist.new_group(backend="gloo"))
    return _gloo_subgroup[1]


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (a collective: all ranks must call it)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=gloo_group())
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """`obj` from rank `src` on every rank (a collective)."""
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=gloo_group())
    return box[0]


def all_reduce_flags(flags: list[int], op: str) -> list[int]:
    """Element-wise MAX of the first flag and MIN of the second over all ranks (op="max_min").

    One tiny all-reduce: MIN(x) is computed as -MAX(-x).
    """
    import torch

    if op != "max_min" or len(flags) != 2:
        raise ValueError("all_reduce_flags supports op='max_min' on two flags")
    tensor = torch.tensor([flags[0], -flags[1]], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=gloo_group())
    return [int(tensor[0]), -int(tensor[1])]


def list_once(make: Any) -> Any:
    """Run `make()` on rank 0 only and hand its result (or its error) to every rank."""
    result: Any = None
    error: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            result = make()
        except BaseException as exc:  # re-raised on every rank below
            error = exc
    result, error = broadcast_object((result, error))
    if error is not None:
        raise error
    return result


def barrier_or_fail(timeout: Any, message: str) -> None:
    """A barrier that raises (naming missing ranks) instead of hanging when one rank is absent."""
    try:
        dist.monitored_barrier(group=gloo_group(), timeout=timeout, wait_all_ranks=True)
    except RuntimeError as exc:
        raise RuntimeError(f"{message}: {exc}") from None


def launcher_rank_and_world() -> tuple[int, int]:
    """(rank, world_size) of the process group if one is initialized, else as a launcher such
    as torchrun sets them (RANK, WORLD_SIZE), else (0, 1). For jobs that need no collective."""
    if is_distributed():
        return rank_and_world()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
