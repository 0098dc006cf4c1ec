"""The recipe's `schedule:`: target weights that change over global tokens."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from mixer.config.fields import Float, _Frozen, normalize

MAX_SCHEDULE_POINTS = 1 << 14


class SchedulePoint(_Frozen):
    """One point of a schedule: from `at_tokens` global tokens on, these target weights."""

    at_tokens: Float = Field(ge=0, le=1e18, description="Global tokens where the point is.")
    weights: dict[str, Float] = Field(description="Weight per source name (others: 0).")

    @field_validator("at_tokens")
    @classmethod
    def _whole_tokens(cls, value: float) -> float:
        if value != int(value):
            raise ValueError(f"at_tokens must be a whole number of tokens, got {value}")
        return value


class Schedule(_Frozen):
    """Target weights that change over global tokens (docs/recipes.md#schedules)."""

    interpolate: Literal["step", "linear"] = Field(
        default="step",
        description="step: a point holds until the next; linear: weights "
        "move linearly from each point to the next.",
    )
    points: list[SchedulePoint] = Field(min_length=1, max_length=MAX_SCHEDULE_POINTS)

    def weights_at(self, names: list[str], tokens: float) -> list[float]:
        """Normalized target weights of `names` at global position `tokens`."""
        points = self.points
        i = self.point_index(tokens)
        raw = [points[i].weights.get(n, 0.0) for n in names]
        if self.interpolate == "linear" and i + 1 < len(points):
            # (every point has a positive weight, so both ends normalize)
            b = points[i + 1]
            t = (tokens - points[i].at_tokens) / (b.at_tokens - points[i].at_tokens)
            start = normalize(raw)
            end = normalize([b.weights.get(n, 0.0) for n in names])
            raw = [w0 * (1 - t) + w1 * t for w0, w1 in zip(start, end)]
        return normalize(raw)

    def point_index(self, tokens: float) -> int:
        """Index of the last point at or before `tokens`."""
        lo, hi = 0, len(self.points) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.points[mid].at_tokens <= tokens:
                lo = mid
            else:
                hi = mid - 1
        return lo
