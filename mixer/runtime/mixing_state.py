"""The loader's side of online mixing: the reported sums waiting for the next update point,
the recipe's algorithm, and their state (torch-free; `loss_sums.py` turns losses into sums).

Reported loss sums are kept in fixed point (units of 2^-32, Python integers), so adding them
is exact and associative: the sums combined over 1, 2 or 64 ranks, or carried through a
checkpoint and `merge_states`, are the same numbers, and so are the weights computed from them.
"""

from __future__ import annotations

from typing import Any, TypedDict

from mixer.config.recipe import Recipe
from mixer.core.errors import StateError
from mixer.mixing import Algorithm, make_algorithm

FIXED_POINT = 1 << 32  # loss sums are counted in units of 2^-32


def to_fixed(value: float) -> int:
    return round(value * FIXED_POINT)


class MixingState(TypedDict):
    """The `mixing` entry of a loader state: the algorithm (by name) and its own state, the
    sources it was made for, the update point due next and the updates made, the mean loss per
    source at the last update, and the sums reported since: source → [loss sum (fixed
    point), tokens]."""

    algorithm: str
    names: list[str]
    next_update: int
    updates: int
    state: dict[str, Any]  # the algorithm's (`OdmState`, `AdoState`, ...)
    losses: dict[str, float]
    pending: dict[str, list[int]]


class MixingLoop:
    """Pending per-source sums, the algorithm, and when the next update is due."""

    def __init__(self, recipe: Recipe) -> None:
        config = recipe.online_mixing
        assert config is not None
        self.names = list(recipe.names)
        self.algorithm_name = config.algorithm
        self.every = config.every
        self.algorithm: Algorithm = make_algorithm(
            config.algorithm, self.names, list(recipe.weights), config.params
        )
        self.next_update = config.every  # global batch of the next update point
        self.updates = 0
        self.pending = [[0, 0] for _ in self.names]  # [loss sum (fixed point), tokens]
        self.losses: dict[str, float] = {}  # mean loss per source at the last update

    def add(self, sums: list[tuple[int, int]]) -> None:
        """Add one report's [loss sum (fixed point), tokens] per source."""
        for slot, (loss, tokens) in zip(self.pending, sums):
            slot[0] += loss
            slot[1] += tokens

    def due(self, next_global: int) -> bool:
        return next_global >= self.next_update

    def update(self, combined: list[list[int]], next_global: int) -> dict[str, float]:
        """The algorithm's weights from the sums of all ranks (the pending sums are reset)."""
        losses = {
            name: loss / FIXED_POINT / tokens
            for name, (loss, tokens) in zip(self.names, combined)
            if tokens > 0
        }
        tokens = {name: int(t) for name, (_, t) in zip(self.names, combined)}
        weights = self.algorithm.update(losses, tokens, self.next_update)
        self.losses.update(losses)
        self.updates += 1
        self.pending = [[0, 0] for _ in self.names]
        while self.next_update <= next_global:
            self.next_update += self.every
        return weights

    # -- state -------------------------------------------------------------------------------
    def payload(self) -> MixingState:
        return {
            "algorithm": self.algorithm_name,
            "names": self.names,
            "next_update": self.next_update,
            "updates": self.updates,
            "state": dict(self.algorithm.state_dict()),
            "losses": dict(self.losses),
            "pending": {n: list(p) for n, p in zip(self.names, self.pending)},
        }

    def load(self, saved: MixingState | None, *, keep_pending: bool) -> None:
        """Resume from a payload's `mixing` entry. `keep_pending`: this rank takes the saved
        pending sums (its own, or a merged state's on rank 0); the other ranks start from 0."""
        if saved is None:
            raise StateError(
                "cannot resume: the recipe has online_mixing but the state was saved without "
                "it (start online mixing from a fresh run, or remove it from the recipe)"
            )
        if saved.get("algorithm") != self.algorithm_name:
            raise StateError(
                f"cannot resume: online_mixing.algorithm changed from "
                f"{saved.get('algorithm')!r} to {self.algorithm_name!r}"
            )
        if saved.get("names") != self.names:
            raise StateError(
                "cannot resume online mixing after changing the sources: the state has "
                f"{saved.get('names')}, the recipe {self.names}"
            )
        try:
            self.algorithm.load_state_dict(saved["state"])
            self.next_update = int(saved["next_update"])
            self.updates = int(saved["updates"])
            self.losses = {str(k): float(v) for k, v in saved["losses"].items()}
            pending = saved["pending"]
            self.pending = [
                [int(pending[n][0]), int(pending[n][1])] if keep_pending else [0, 0]
                for n in self.names
            ]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise StateError(f"loader state is damaged at ['mixing']: {exc!r}") from None


def merge_mixing(entries: list[MixingState | None]) -> MixingState | None:
    """One `mixing` entry of all ranks' entries of one step: the algorithm's state is the same
    on every rank; the pending sums are added up."""
    first = entries[0]
    if first is None:
        if any(e is not None for e in entries):
            raise StateError("some ranks' states have online mixing and others do not")
        return None
    rest = {k: v for k, v in first.items() if k != "pending"}
    pending = {n: [0, 0] for n in first["pending"]}
    for rank, entry in enumerate(entries):
        if entry is None or {k: v for k, v in entry.items() if k != "pending"} != rest:
            raise StateError(
                f"rank {rank}'s online mixing state differs from rank 0's: states of one "
                "step of one job are needed"
            )
        for name, (loss, tokens) in entry["pending"].items():
            pending[name][0] += int(loss)
            pending[name][1] += int(tokens)
    return {**first, "pending": pending}  # (the rest is the same on every rank)
