"""The weights a loader's batches are drawn with: the recipe's schedule, `set_weights`' override
and the online mixing updates, agreed across the ranks of a torch.distributed job."""

from __future__ import annotations

from typing import Any

import torch

from mixer.config.recipe import Recipe
from mixer.core.errors import RecipeError, StateError, TopologyError
from mixer.pipeline.schedule import (
    Override,
    OverrideState,
    ScheduleState,
    WeightPlan,
    check_schedule,
    override_weights,
    schedule_snapshot,
)
from mixer.runtime import dist
from mixer.runtime.loss_sums import source_sums
from mixer.runtime.mixing_state import MixingLoop, MixingState, to_fixed


class Mixture:
    """The weight plan in force and, with `online_mixing`, the loop that updates it."""

    def __init__(self, recipe: Recipe, world_size: int, distributed: bool) -> None:
        self.recipe = recipe
        self.world_size = world_size
        self.collective = distributed and world_size > 1
        self.plan = WeightPlan(recipe)
        self.mixing = MixingLoop(recipe) if recipe.online_mixing is not None else None
        if self.mixing is not None and self.mixing.every % world_size:
            raise TopologyError(
                f"online_mixing.every ({self.mixing.every}) must be a multiple of the world "
                f"size ({world_size}): every rank updates the weights at the same step"
            )

    def _override(self, next_global: int, weights: tuple[float, ...]) -> None:
        tokens = self.plan.tokens_at(next_global)
        self.plan = WeightPlan(self.recipe, next_global, tokens, Override(next_global, weights))

    def set_weights(self, weights: dict[str, float], next_global: int) -> None:
        """`Loader.set_weights` from global batch `next_global` on (checked, and under
        torch.distributed the same on every rank)."""
        if self.mixing is not None:
            raise RecipeError(
                "set_weights: the recipe's online_mixing sets the weights; remove "
                "online_mixing to set them by hand"
            )
        normalized = override_weights(weights, self.recipe.names)
        if self.collective:
            mine = (next_global, normalized)
            gathered = dist.all_gather_objects(mine)
            if any(g != mine for g in gathered):
                detail = "; ".join(
                    f"rank {r}: step {g[0] // self.world_size}, weights "
                    f"{[round(w, 6) for w in g[1]]}"
                    for r, g in enumerate(gathered)
                )
                raise StateError(
                    "set_weights is a collective: every rank must call it at "
                    f"the same step with the same weights, got {detail}"
                )
        self._override(next_global, normalized)

    # -- online mixing -----------------------------------------------------------------------
    def report_loss(self, token_loss: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
        """Add a batch's per-source loss to the sums of the next update."""
        if self.mixing is None:
            raise RecipeError("report_loss: the recipe has no online_mixing block")
        sums = source_sums(token_loss, batch, len(self.recipe.names))
        self.mixing.add([(to_fixed(loss), tokens) for loss, tokens in sums])

    def update(self, next_global: int) -> bool:
        """At an update point: the new weights from all ranks' sums (a collective inside a
        torch.distributed job), in force from `next_global` on. True when it updated."""
        mixing = self.mixing
        if mixing is None or not mixing.due(next_global):
            return False
        combined = mixing.pending
        if self.collective:
            gathered = dist.all_gather_objects((next_global, mixing.pending))
            if any(g[0] != next_global for g in gathered):
                steps = [g[0] // self.world_size for g in gathered]
                raise StateError(f"online mixing update out of step: ranks at steps {steps}")
            combined = [
                [sum(g[1][i][0] for g in gathered), sum(g[1][i][1] for g in gathered)]
                for i in range(len(mixing.names))
            ]
        weights = mixing.update(combined, next_global)
        self._override(next_global, override_weights(weights, self.recipe.names))
        return True

    def mixing_metrics(self, target_share: list[float]) -> dict[str, Any] | None:
        """`metrics()["mixing"]` (the same on every rank), or None without online mixing."""
        if self.mixing is None:
            return None
        return {
            "algorithm": self.mixing.algorithm_name,
            "updates": self.mixing.updates,
            "weights": dict(zip(self.recipe.names, target_share)),
            "losses": dict(self.mixing.losses),
        }

    # -- state -------------------------------------------------------------------------------
    def payload(self, next_global: int) -> tuple[ScheduleState | None, OverrideState | None]:
        """The state's `schedule` and `override` entries at global batch `next_global`."""
        override = self.plan.override
        return (
            schedule_snapshot(self.recipe, self.plan.tokens_at(next_global)),
            override.to_dict(self.plan.names) if override else None,
        )

    def mixing_payload(self) -> MixingState | None:
        return self.mixing.payload() if self.mixing is not None else None

    def load(
        self,
        next_global: int,
        tokens: int,
        schedule: ScheduleState | None,
        override: OverrideState | None,
        mixing: MixingState | None,
        keep_pending: bool,
    ) -> None:
        """Resume from a state's entries (checked against the recipe); `keep_pending`: this
        rank takes the saved sums not yet used."""
        check_schedule(schedule, self.recipe, tokens)
        loaded = Override.from_dict(override, self.recipe.names) if override else None
        if self.mixing is not None:
            self.mixing.load(mixing, keep_pending=keep_pending)
        self.plan = WeightPlan(self.recipe, next_global, tokens, loaded)
