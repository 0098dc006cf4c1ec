"""The registries a recipe names entries of: file formats and packers.

They are filled by the layers that implement the entries (`mixer.sources.formats`,
`mixer.pipeline.packers`), which `import mixer` always loads; the recipe's validation looks
names up here without importing those layers.
"""

from __future__ import annotations

from typing import Any

FORMATS: dict[str, Any] = {}  # name -> mixer.sources.formats.Format
PACKERS: dict[str, Any] = {}  # name -> mixer.pipeline.packers.PackerFactory


def infer_format(name: str) -> str | None:
    """The format whose longest extension ends `name` (case-insensitive), if any."""
    lower = name.lower()
    best: tuple[int, str] | None = None
    for fmt in FORMATS.values():
        for ext in fmt.extensions:
            if lower.endswith(ext) and (best is None or len(ext) > best[0]):
                best = (len(ext), fmt.name)
    return best[1] if best else None
