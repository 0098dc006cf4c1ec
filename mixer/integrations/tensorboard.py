"""`log_metrics(writer, loader, step)`: the loader's metrics as TensorBoard scalars.

`writer` is anything with TensorBoard's `add_scalar(tag, value, global_step)`:
`torch.utils.tensorboard.SummaryWriter` (which needs the `tensorboard` package: `pip install
'mixer[tensorboard]'`), or a framework's writer (Lightning's `TensorBoardLogger.experiment`).
Tags are `mixer/<key>/<source>` (realized and target share, epochs, skipped, tokens) and
`mixer/global_tokens`, as the other adapters log them.
"""

from __future__ import annotations

from typing import Any

from mixer.integrations.common import flat_metrics


def log_metrics(writer: Any, loader: Any, step: int) -> dict[str, float]:
    """Write `loader.metrics(all_ranks=True)` to `writer` at `step`; returns what was written.

    Inside a torch.distributed job the metrics are a collective that sums all ranks' figures:
    call it on every rank at the same step, with `writer=None` where there is no writer
    (usually every rank but 0)."""
    scalars = flat_metrics(loader.metrics(all_ranks=True))
    if writer is not None:
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, global_step=step)
    return scalars
