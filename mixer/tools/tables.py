"""Plain-text tables for the CLI and the benchmarks."""

from __future__ import annotations

from typing import Any


def format_table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """A plain-text table; `columns` are (key, title) pairs."""
    cells = [[title for _, title in columns]]
    for row in rows:
        cells.append([_fmt(row[key]) for key, _ in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
