"""Target weights per global batch: the recipe's weights or schedule, and `set_weights` calls.

The position on a schedule is counted in global tokens: global batch g begins at
`tokens_at(g) = base_tokens + (g - base_global) · batch_size · seq_len`, the base being where
the loader (re)started. A resume with another per-rank batch size continues from the saved
position. A `set_weights` call overrides the schedule from its global batch on.

Each global batch falls in a *regime*: a stretch whose counters the deficit rule shares. A
step schedule's point, a `set_weights` call and fixed weights each start a regime (the lane's
mixing counters restart there); a linear schedule is one regime whose weights move from batch
to batch (each batch follows the weights at its first token; see mix.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from mixer.config.recipe import Recipe, normalize
from mixer.core.errors import RecipeError, StateError

# The `override` entry of a loader state: the global batch of the `set_weights` call in force
# and its normalized weights by source name ("global" is a keyword: the functional form).
OverrideState = TypedDict("OverrideState", {"global": int, "weights": dict[str, float]})


class ScheduleState(TypedDict):
    """The `schedule` entry of a loader state: the schedule's `interpolate` and a digest of
    each of its points at or before the state's position."""

    interpolate: Literal["step", "linear"]
    points: list[str]


@dataclass(frozen=True)
class Override:
    """Weights set by `loader.set_weights` from global batch `at_global` on."""

    at_global: int
    weights: tuple[float, ...]  # normalized, in the recipe's source order

    def to_dict(self, names: list[str]) -> OverrideState:
        return {"global": self.at_global, "weights": {n: w for n, w in zip(names, self.weights)}}

    @classmethod
    def from_dict(cls, data: OverrideState, names: list[str]) -> Override:
        weights = data["weights"]
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise StateError(
                f"the state's set_weights override names sources {unknown} that "
                "the recipe no longer has"
            )
        # Saved already normalized: normalizing again would move them by a rounding step and
        # the deficit rule could break a tie the other way after the resume.
        restored = tuple(float(weights.get(n, 0.0)) for n in names)
        if not abs(sum(restored) - 1) < 1e-6:
            raise StateError(
                f"loader state is damaged at ['override']['weights']: they sum "
                f"to {sum(restored):g}, not 1"
            )
        return cls(int(data["global"]), restored)


def _digest(weights: list[float]) -> str:
    """A short name for a set of weights (a regime key must not grow with the sources)."""
    return _digest_of(tuple(weights))


@functools.lru_cache(maxsize=256)
def _digest_of(weights: tuple[float, ...]) -> str:
    # (asked for every batch: the regimes of a run are few, their digests made once)
    text = ",".join(f"{w:.9g}" for w in weights)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class WeightPlan:
    """Which weights (and which regime) the deficit rule follows for each global batch."""

    recipe: Recipe
    base_global: int = 0
    base_tokens: int = 0
    override: Override | None = None
    names: list[str] = field(init=False)
    # (regime key, weights) of a recipe without a schedule: `at` is asked for every batch
    _fixed: tuple[str, tuple[float, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", self.recipe.names)
        weights = self.recipe.weights
        object.__setattr__(self, "_fixed", ("fixed:" + _digest(weights), tuple(weights)))

    @property
    def batch_tokens(self) -> int:
        return self.recipe.batch_size * self.recipe.seq_len

    def tokens_at(self, g: int) -> int:
        """Global tokens before global batch g."""
        return self.base_tokens + (g - self.base_global) * self.batch_tokens

    def at(self, g: int) -> tuple[str, list[float]]:
        """(regime key, normalized target weights) for global batch g."""
        if self.override is not None and g >= self.override.at_global:
            return f"set@{self.override.at_global}", list(self.override.weights)
        schedule = self.recipe.schedule
        tokens = self.tokens_at(g)
        if schedule is None:
            return self._fixed[0], list(self._fixed[1])
        weights = schedule.weights_at(self.names, tokens)
        if schedule.interpolate == "linear":
            return "linear", weights
        index = schedule.point_index(tokens)
        return f"step{index}:" + _digest(weights), weights

    def may_draw_later(self, g: int, active: list[bool]) -> bool:
        """True when a schedule point after global batch g gives an `active` source a positive
        weight (a `set_weights` call still can, whatever this says)."""
        schedule = self.recipe.schedule
        if schedule is None or (self.override is not None and g >= self.override.at_global):
            return False
        tokens = self.tokens_at(g)
        live = [n for n, a in zip(self.names, active) if a]
        return any(
            p.at_tokens > tokens and any(p.weights.get(n, 0) > 0 for n in live)
            for p in schedule.points
        )


def _point_digest(point: list) -> str:
    """A short digest of one point, `[at_tokens, {name: weight}]`: a state holds one per point
    passed, so its size does not grow with the sources."""
    at, weights = point
    text = json.dumps([int(at), {n: float(w) for n, w in sorted(weights.items())}])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def schedule_snapshot(recipe: Recipe, tokens: int) -> ScheduleState | None:
    """Digests of the schedule's points at or before `tokens` (what a resume must find
    unchanged)."""
    if recipe.schedule is None:
        return None
    points = [
        _point_digest([p.at_tokens, p.weights])
        for p in recipe.schedule.points
        if p.at_tokens <= tokens
    ]
    return {"interpolate": recipe.schedule.interpolate, "points": points}


def check_schedule(saved: ScheduleState | None, recipe: Recipe, tokens: int) -> None:
    """Refuse a recipe whose schedule changed at or before the checkpoint's position."""
    now = schedule_snapshot(recipe, tokens)
    if saved is None or now is None:
        if saved != now and tokens > 0:
            what = "removed" if now is None else "added"
            raise StateError(
                f"cannot resume: the recipe's schedule was {what} since the "
                f"checkpoint, at global token {tokens:,} (points at or before "
                "the checkpoint must stay unchanged)"
            )
        return
    if saved["interpolate"] != now["interpolate"] and tokens > 0:
        raise StateError(
            f"cannot resume: schedule.interpolate changed from "
            f"{saved['interpolate']!r} to {now['interpolate']!r}"
        )
    was = saved["points"]
    points = recipe.schedule.points if recipe.schedule is not None else []
    for i in range(max(len(was), len(now["points"]))):
        old = was[i] if i < len(was) else None
        new = now["points"][i] if i < len(now["points"]) else None
        if old != new:
            what = "was removed" if new is None else "was added" if old is None else "changed"
            current = (
                f"; it is now at_tokens {points[i].at_tokens:g}, weights {dict(points[i].weights)}"
                if new is not None
                else ""
            )
            raise StateError(
                f"cannot resume: schedule.points[{i}] {what} at or before the checkpoint's "
                f"position (global token {tokens:,}){current}; only points after it may be "
                "edited, added or removed"
            )


def override_weights(weights: object, names: list[str]) -> tuple[float, ...]:
    """`Loader.set_weights`'s argument checked (source name → finite weight >= 0, one
    positive; unnamed sources weigh 0) and normalized, in the recipe's source order."""
    if not isinstance(weights, dict) or not weights:
        raise RecipeError("set_weights: expected a non-empty dict of source name → weight")
    unknown = sorted(str(k) for k in weights if k not in names)
    if unknown:
        raise RecipeError(f"set_weights: unknown source(s) {unknown}; sources: {names}")
    for name, w in weights.items():
        if (
            isinstance(w, bool)
            or not isinstance(w, (int, float))
            or not (math.isfinite(w) and w >= 0)
        ):
            raise RecipeError(
                f"set_weights: weight of {name!r} must be a finite number >= 0, got {w!r}"
            )
    raw = [float(weights.get(n, 0.0)) for n in names]
    if not any(w > 0 for w in raw):
        raise RecipeError("set_weights: every weight is 0 (at least one must be positive)")
    return tuple(normalize(raw))
