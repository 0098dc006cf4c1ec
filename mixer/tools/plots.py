"""What `mixer report` draws from a metrics log (metrics_log.py): a PNG of subplots.

1. share: per source, the cumulative realized share (its tokens so far over all tokens so far;
   the main line, labelled with the source name), the share of each logged stretch (tokens
   added since the previous line over all tokens added; a thin, lighter line of the same
   colour: it swings by a row's worth from stretch to stretch) and the target share (dashed),
   over global tokens;
2. epochs: completed passes per source (the log's `epochs`; a note when it has none);
3. loss: per source (`loss_by_source`), else the overall `loss`; only when the log has one.

matplotlib is the optional extra `mixer[report]`; the Agg backend draws without a display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mixer.core.errors import MixerError
from mixer.tools.metrics_log import read_metrics


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise MixerError("`mixer report` needs matplotlib: pip install 'mixer[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _x(lines: list[dict[str, Any]]) -> tuple[list[float], str]:
    """Global tokens when every line has them, else the rank's tokens."""
    if all("global_tokens" in line for line in lines):
        return [float(line["global_tokens"]) for line in lines], "global tokens"
    return [float(sum(line["tokens"].values())) for line in lines], "tokens (this rank)"


def _names(lines: list[dict[str, Any]], key: str) -> list[str]:
    return list(dict.fromkeys(n for line in lines for n in line.get(key) or {}))


def stretch_shares(lines: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per source, its share of the tokens added between each line and the one before (the
    first line: since the start). NaN where no tokens were added."""
    names = _names(lines, "tokens")
    out: dict[str, list[float]] = {n: [] for n in names}
    before: dict[str, float] = {}
    for line in lines:
        added = {n: line["tokens"].get(n, 0) - before.get(n, 0) for n in names}
        total = sum(added.values())
        for n in names:
            out[n].append(added[n] / total if total > 0 else float("nan"))
        before = {n: line["tokens"].get(n, 0) for n in names}
    return out


def cumulative_shares(lines: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per source, its share of all tokens delivered up to each line (the log's `tokens` are
    running totals). NaN before any token."""
    names = _names(lines, "tokens")
    out: dict[str, list[float]] = {n: [] for n in names}
    for line in lines:
        total = sum(line["tokens"].get(n, 0) for n in names)
        for n in names:
            out[n].append(line["tokens"].get(n, 0) / total if total > 0 else float("nan"))
    return out


def report_figure(lines: list[dict[str, Any]]):
    """The report's `matplotlib.figure.Figure`; its axes carry the labels "share", "epochs"
    and (when the log has losses) "loss"."""
    plt = _pyplot()
    has_loss = any("loss_by_source" in line or "loss" in line for line in lines)
    fig, axes = plt.subplots(
        3 if has_loss else 2, 1, figsize=(9, 10 if has_loss else 7), sharex=True, squeeze=False
    )
    axes = axes[:, 0]
    x, xlabel = _x(lines)
    colours = {n: f"C{i % 10}" for i, n in enumerate(_names(lines, "tokens"))}
    _draw_shares(axes[0], lines, x, colours)
    _draw_epochs(axes[1], lines, x, colours)
    if has_loss:
        _draw_loss(axes[2], lines, x, colours)
    axes[-1].set_xlabel(xlabel)
    axes[0].autoscale_view()
    fig.tight_layout()
    return fig


def _draw_shares(share, lines: list[dict[str, Any]], x: list, colours: dict[str, str]) -> None:
    from matplotlib.collections import LineCollection

    share.set_label("share")
    targets = []
    stretches = stretch_shares(lines)
    for name, values in cumulative_shares(lines).items():
        share.plot(
            x,
            stretches[name],
            color=colours[name],
            alpha=0.35,
            linewidth=0.8,
            label="_stretch",
            gid=f"stretch:{name}",
        )  # "_": left out of the legend
        share.plot(
            x, values, color=colours[name], linewidth=2.0, label=name, gid=f"cumulative:{name}"
        )
        target = [line.get("target_share", {}).get(name) for line in lines]
        points = [(a, t) for a, t in zip(x, target) if t is not None]
        if len(points) > 1:
            targets.append((points, colours[name]))
    # Targets are one dashed collection, so that the axes' lines are the realized shares.
    if targets:
        share.add_collection(
            LineCollection(
                [p for p, _ in targets],
                colors=[c for _, c in targets],
                linestyles="dashed",
                label="target (dashed)",
            )
        )
    share.set_ylabel("share of tokens")
    share.set_title(
        "realized share: cumulative (bold), per logged stretch (light); target (dashed)"
    )
    share.legend(fontsize="small")


def _draw_epochs(epochs, lines: list[dict[str, Any]], x: list, colours: dict[str, str]) -> None:
    epochs.set_label("epochs")
    epoch_names = _names(lines, "epochs")
    for name in epoch_names:
        epochs.plot(
            x,
            [line.get("epochs", {}).get(name, float("nan")) for line in lines],
            color=colours.get(name),
            label=name,
        )
    if epoch_names:
        epochs.legend(fontsize="small")
    else:
        epochs.text(
            0.5,
            0.5,
            "this log has no `epochs`",
            ha="center",
            va="center",
            transform=epochs.transAxes,
        )
    epochs.set_ylabel("epochs (completed passes)")


def _draw_loss(loss, lines: list[dict[str, Any]], x: list, colours: dict[str, str]) -> None:
    loss.set_label("loss")
    by_source = _names(lines, "loss_by_source")
    for name in by_source:
        loss.plot(
            x,
            [line.get("loss_by_source", {}).get(name, float("nan")) for line in lines],
            color=colours.get(name),
            label=name,
        )
    if not by_source:
        loss.plot(x, [line.get("loss", float("nan")) for line in lines], color="k", label="loss")
    loss.set_ylabel("loss")
    loss.legend(fontsize="small")


def write_report(metrics: str | Path, output: str | Path):
    """Read a metrics log and write its report to `output` (PNG); returns the figure."""
    plt = _pyplot()
    fig = report_figure(read_metrics(metrics))
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, format="png", dpi=100)
    plt.close(fig)
    return fig
