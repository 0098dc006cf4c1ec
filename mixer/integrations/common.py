"""What the adapters share: the loader's metrics as flat scalars, the state file's codec, and
the optimizer steps worth taking (`steps_with_data`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from mixer.core.files import write_atomically
from mixer.core.stages import STAGES
from mixer.pipeline.batch import is_padding_batch
from mixer.runtime import dist

# Per-source figures of `loader.metrics()` logged as `mixer/<key>/<source>`.
PER_SOURCE_KEYS = ("realized_share", "target_share", "epochs", "skipped", "tokens")
# What a training log line carries (the rest is in `loader.metrics()`).
LOG_LINE_KEYS = ("realized_share", "target_share", "skipped")
STATE_FILE = "mixer_state.json"
# `mixer/bottleneck` is logged as its index here (a scalar: loggers take numbers).
BOTTLENECKS = ("trainer", *STAGES)


def flat_metrics(
    metrics: dict[str, Any], keys: tuple[str, ...] = PER_SOURCE_KEYS
) -> dict[str, float]:
    """`loader.metrics()` as `{"mixer/<key>/<source>": value, "mixer/global_tokens": n}`,
    plus the profile's `mixer/wait/share`, `mixer/wait/p99_ms` and `mixer/bottleneck` (the
    index of the bottleneck in `BOTTLENECKS`: 0 trainer, then the stages in order). With
    `keys=LOG_LINE_KEYS`: only the shares and skips of the sources, and the profile's three."""
    out: dict[str, float] = {}
    for key in keys:
        for source, value in metrics.get(key, {}).items():
            out[f"mixer/{key}/{source}"] = float(value)
    if "global_tokens" in metrics and "tokens" in keys:
        out["mixer/global_tokens"] = float(metrics["global_tokens"])
    if "wait" in metrics:
        out["mixer/wait/share"] = float(metrics["wait"]["share"])
        out["mixer/wait/p99_ms"] = float(metrics["wait"]["p99_ms"])
    if metrics.get("bottleneck") in BOTTLENECKS:
        out["mixer/bottleneck"] = float(BOTTLENECKS.index(metrics["bottleneck"]))
    return out


def write_state(folder: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write a (global) loader state as `folder/mixer_state.json`, atomically."""
    path = Path(folder) / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(state).encode())
    return path


def read_state(folder: str | os.PathLike) -> dict[str, Any]:
    path = Path(folder) / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: this checkpoint was not written by a mixer adapter, so the "
            "data stream's position is unknown (resume from one that holds the file)"
        )
    return json.loads(path.read_text())


T = TypeVar("T")


def step_has_data(batches: list[dict[str, Any]]) -> bool:
    """Whether one optimizer step's batches hold a token to learn from on some rank (a
    collective under torch.distributed: every rank calls it for the same step)."""
    local = any(not is_padding_batch(batch) for batch in batches)
    if dist.is_distributed() and dist.rank_and_world()[1] > 1:
        return bool(dist.all_reduce_flags([int(local), 0], "max_min")[0])
    return local


def steps_with_data(
    items: Iterable[T],
    per_step: int,
    finite: bool,
    batch_of: Callable[[T], dict[str, Any]] = lambda item: item,  # type: ignore[assignment]
) -> Iterator[list[T]]:
    """`items` in groups of `per_step` (one optimizer step's batches), leaving out each group
    that is padding on every rank: such a step would move no weight on purpose but would step
    the optimizer (momentum, weight decay) and the scheduler. A step where only some ranks pad
    is kept (their zero-weight loss keeps DDP in step). The last group is shorter when the
    stream ends inside a step. Only a finite recipe has padding batches: others are grouped
    without looking (and without a collective)."""
    group: list[T] = []
    for item in items:
        group.append(item)
        if len(group) == per_step:
            if not finite or step_has_data([batch_of(i) for i in group]):
                yield group
            group = []
    if group and (not finite or step_has_data([batch_of(i) for i in group])):
        yield group
