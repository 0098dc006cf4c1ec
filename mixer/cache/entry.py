"""A token-cache entry as loaded: its tokens, document index and record table, checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mixer.cache.blocks import TokenFile


@dataclass(frozen=True)
class CachedSplit:
    """An entry whose .json, .idx and .rec are checked: its tokens, index and record table."""

    tokens: TokenFile
    starts: np.ndarray     # int64[D + 1]: element offset of each document, then the end
    records: np.ndarray    # int64[R, 4]
    errors: list[list[Any]]
    key: str
