"""The metrics log: JSONL, one line per logged step, `{"step": s, **loader.metrics(), ...}`.

Training loops (examples/train.py) and `mixer bench --metrics-out` write it; `mixer report`
(plots.py) reads it. A line may also hold `loss` (float) and `loss_by_source` ({name: float}).
Older loaders' metrics lack some keys; the writer adds `global_tokens` and `target_share`
when absent, and the reader requires only `step` and `tokens`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from mixer.config.recipe import Recipe
from mixer.core.errors import DataError


def complete(
    step: int, metrics: dict[str, Any], recipe: Recipe, world_size: int = 1
) -> dict[str, Any]:
    """A log line: `metrics` plus `global_tokens` and `target_share` when they are absent."""
    line = {"step": step, **metrics}
    if "global_tokens" not in line:
        batch_tokens = recipe.batch_size * recipe.seq_len
        batches = line.get("next_global_batch", line.get("next_global"))
        line["global_tokens"] = (
            batches if batches is not None else step * world_size
        ) * batch_tokens
    if "target_share" not in line:
        line["target_share"] = dict(zip(recipe.names, recipe.weights_at(line["global_tokens"])))
    return line


class MetricsWriter:
    """Writes a metrics log, one line every `every` steps plus the last step."""

    def __init__(self, path: str | Path, recipe: Recipe, *, every: int = 1) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.recipe = recipe
        self.every = every
        self.last = 0
        self._file: IO[str] = open(path, "w")  # noqa: SIM115 (closed by close())

    def step(self, step: int, metrics: Callable[[], dict[str, Any]]) -> None:
        """Log `metrics()` if `step` is due (metrics are only gathered then)."""
        if step % self.every == 0:
            self._write(step, metrics())

    def close(self, step: int, metrics: dict[str, Any]) -> None:
        """Log the last step unless it was logged, and close the file."""
        if step > self.last:
            self._write(step, metrics)
        self._file.close()

    def _write(self, step: int, metrics: dict[str, Any]) -> None:
        self._file.write(json.dumps(complete(step, metrics, self.recipe)) + "\n")
        self.last = step


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a metrics log; a `DataError` names the line that is not one."""
    lines = []
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise DataError(
            f"cannot read the metrics log: {exc}", file=str(path), reason="unreadable"
        ) from exc
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DataError(
                f"not JSON ({exc.msg})",
                file=str(path),
                location=f"line {number}",
                reason="malformed",
            ) from None
        problem = _problem(line)
        if problem:
            raise DataError(problem, file=str(path), location=f"line {number}", reason="malformed")
        lines.append(line)
    if not lines:
        raise DataError("the metrics log has no lines", file=str(path), reason="malformed")
    return lines


def _problem(line: Any) -> str | None:
    if not isinstance(line, dict):
        return "a line must be a JSON object"
    if not isinstance(line.get("step"), int) or isinstance(line.get("step"), bool):
        return "`step` must be an integer"
    for key in ("tokens", "target_share", "realized_share", "epochs", "loss_by_source"):
        value = line.get(key)
        if value is None and key != "tokens":
            continue
        if not isinstance(value, dict) or not all(_number(v) for v in value.values()):
            return f"`{key}` must be a mapping of source name to number"
    for key in ("global_tokens", "loss"):
        if key in line and not _number(line[key]):
            return f"`{key}` must be a number"
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
