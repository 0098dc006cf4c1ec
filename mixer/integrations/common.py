"""What the adapters share: the loader's metrics as flat scalars, the state file's codec."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mixer.core.files import write_atomically
from mixer.core.stages import STAGES

# Per-source figures of `loader.metrics()` logged as `mixer/<key>/<source>`.
PER_SOURCE_KEYS = ("realized_share", "target_share", "epochs", "skipped", "tokens")
STATE_FILE = "mixer_state.json"
# `mixer/bottleneck` is logged as its index here (a scalar: loggers take numbers).
BOTTLENECKS = ("trainer", *STAGES)


def flat_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """`loader.metrics()` as `{"mixer/<key>/<source>": value, "mixer/global_tokens": n}`,
    plus the profile's `mixer/wait/share`, `mixer/wait/p99_ms` and `mixer/bottleneck` (the
    index of the bottleneck in `BOTTLENECKS`: 0 trainer, then the stages in order)."""
    out: dict[str, float] = {}
    for key in PER_SOURCE_KEYS:
        for source, value in metrics.get(key, {}).items():
            out[f"mixer/{key}/{source}"] = float(value)
    if "global_tokens" in metrics:
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
