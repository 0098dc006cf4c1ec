"""What every recipe model shares: frozen strict models, numbers that are not booleans,
weight normalization."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict


def normalize(weights: list[float]) -> list[float]:
    """Weights scaled to sum to 1; scaled by the largest first when their sum overflows."""
    total = sum(weights)
    if not math.isfinite(total):
        top = max(weights)
        weights = [w / top for w in weights]
        total = sum(weights)
    return [w / total for w in weights]


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, not a boolean")
    return value


# Numbers parse as pydantic's lax mode does (YAML reads `1e-3` as a string) except booleans.
Int = Annotated[int, BeforeValidator(_not_bool)]
Float = Annotated[float, BeforeValidator(_not_bool)]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False)
