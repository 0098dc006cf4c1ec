"""`log_metrics(writer, loader, step)`: the loader's metrics as TensorBoard scalars.

`writer` is anything with TensorBoard's `add_scalar(tag, value, global_step)`:
`torch.utils.tensorboard.SummaryWriter` (which needs the `tensorboard` package: `pip install
'mixer[tensorboard]'`), or a framework's writer (Lightning's `TensorBoardLogger.experiment`).
Tags are `mixer/<key>/<source>` (realized and target share, epochs, skipped, tokens),
`mixer/global_tokens`, `mixer/wait/share`, `mixer/wait/p99_ms` and `mixer/bottleneck` (its
index in `common.BOTTLENECKS`), as the other adapters log them; a writer with `add_text` also
gets the bottleneck's name as the text tag `mixer/bottleneck`.
"""

from __future__ import annotations

from typing import Any

from mixer.integrations.common import flat_metrics


def log_metrics(writer: Any, loader: Any, step: int) -> dict[str, float]:
    """Write `loader.metrics(all_ranks=True)` to `writer` at `step`; returns what was written.

    Inside a torch.distributed job the metrics are a collective that sums all ranks' figures:
    call it on every rank at the same step, with `writer=None` where there is no writer
    (usually every rank but 0)."""
    metrics = loader.metrics(all_ranks=True)
    scalars = flat_metrics(metrics)
    if writer is not None:
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, global_step=step)
        if hasattr(writer, "add_text") and "bottleneck" in metrics:
            writer.add_text("mixer/bottleneck", metrics["bottleneck"], global_step=step)
    return scalars
