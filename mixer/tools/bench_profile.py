"""What `mixer bench` makes of the loader's profile: the stage table, the verdict line, and the
data tier's size for a trainer's step time (`workers_needed`, docs/profile.md).

`cpu_s_per_batch` (c) is the busy seconds of all stages, over all the loader's processes, per
batch received. A trainer whose step takes S seconds waits, per batch, about
    w(0) = c                      with the lanes in its own process (num_workers 0),
    w(n) = max(0, c / n - S)      with n workers, each making a batch in c seconds,
and waits w / (S + w) of its time. `workers_needed` is the smallest count the lanes rule
allows (0, then the valid worker counts) with w / (S + w) <= 5 %, i.e. 0 when c <= S / 19,
else the smallest valid n >= 0.95 · c / S; None when no valid count is that large. It assumes
a free core per worker.
"""

from __future__ import annotations

from typing import Any

from mixer.core.stages import STAGES
from mixer.runtime.profile import KEEPS_UP
from mixer.runtime.topology import valid_workers

STAGE_COLUMNS = [
    ("stage", "stage"),
    ("busy_s", "busy s"),
    ("share", "share"),
    ("rate", "batches/s per process"),
]

REMEDIES = {
    "read": "waiting on storage: raise the storage's parallelism (more workers or actors "
    "reading at once, a larger read_ahead_bytes, storage nearer the trainer)",
    "decode": "CPU-bound decoding records: more DataLoader workers or Ray actors "
    "(or files cheaper to parse: uncompressed, multi-frame zstd, a token cache)",
    "encode": "CPU-bound in the tokenizer: more DataLoader workers or Ray actors "
    "(or a token cache, or the fastokens backend)",
    "pack": "CPU-bound packing batches: more DataLoader workers or Ray actors",
    "media": "CPU-bound decoding and processing images: more DataLoader workers or Ray "
    "actors (or smaller stored images)",
    "transfer": "handing batches to the trainer's process: fewer, busier workers (or "
    "num_workers 0 when batches are cheap to make)",
}


def stage_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per stage: busy seconds, share, and the batches per second one process
    doing only that stage would make."""
    received = batches_received(metrics)
    rows = []
    for name in STAGES:
        busy = metrics["stages"][name]["busy_s"]
        rows.append(
            {
                "stage": name,
                "busy_s": busy,
                "share": metrics["stages"][name]["share"],
                "rate": received / busy if busy > 0 else None,
            }
        )
    return rows


def batches_received(metrics: dict[str, Any]) -> int:
    """Batches the stage seconds were spent on (the first one included)."""
    wait = metrics["wait"]
    return wait["batches"] + (1 if wait["first_s"] > 0 or wait["batches"] else 0)


def cpu_s_per_batch(metrics: dict[str, Any]) -> float | None:
    """Busy seconds of all stages per batch received (None before any batch)."""
    received = batches_received(metrics)
    if not received:
        return None
    return sum(s["busy_s"] for s in metrics["stages"].values()) / received


def workers_needed(
    cpu_s: float | None, step_time: float, lanes: int, world_size: int = 1
) -> int | None:
    """The smallest worker count the lanes rule allows that keeps the trainer's wait at
    most 5 % at `step_time` seconds per step (see the module's docstring)."""
    if cpu_s is None or step_time <= 0:
        return None
    keeps_up = KEEPS_UP / (1 - KEEPS_UP) * step_time  # the most wait per batch: S / 19
    if cpu_s <= keeps_up:
        return 0
    for n in valid_workers(lanes, world_size):
        if cpu_s / n - step_time <= keeps_up:
            return n
    return None


def verdict(metrics: dict[str, Any], needed: int | None = None, sized: bool = False) -> str:
    """The line naming the bottleneck and its remedy."""
    stage = metrics["bottleneck"]
    share = metrics["wait"]["share"]
    if stage == "trainer":
        return f"bottleneck: trainer — the loader keeps up (the caller waited {share:.1%})"
    line = f"bottleneck: {stage} — the caller waited {share:.1%}; {REMEDIES[stage]}"
    if sized:
        line += (
            f"; workers needed at this step time: {needed}"
            if needed is not None
            else "; no worker count the lanes allow keeps the wait under 5 %"
        )
    return line
