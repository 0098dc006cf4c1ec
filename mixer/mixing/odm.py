"""ODM (Albalak et al., 2023, "Efficient Online Data Mixing for Language Model Pre-Training").

Each source is an arm of an EXP3 bandit whose reward is the source's training loss: a source
the model still finds hard earns weight. At update t (t = 1, 2, ...), for every source i that
received reported tokens, the importance-weighted reward estimate is smoothed,

    R_i ← α·R_i + (1 − α)·L_i / π_i          (π: the weights the losses were drawn with),

and the new weights are

    π_i = (1 − K·ε_t) · μ_i·exp(ε_{t−1}·R_i) / Σ_j μ_j·exp(ε_{t−1}·R_j) + ε_t,
    ε_t = min(1/K, sqrt(ln K / (K·t))),   ε_0 = 1/K,

μ being the recipe's weights (uniform weights give the paper's rule exactly). Sources without
reported tokens keep their estimate R_i.
"""

from __future__ import annotations

import math
from typing import Any, TypedDict

from pydantic import Field

from mixer.mixing.protocol import Params, register_algorithm


class OdmParams(Params):
    smoothing: float = Field(
        default=0.9, ge=0, lt=1, description="α: weight of the old reward estimate."
    )


def exploration(t: int, k: int) -> float:
    """ε_t = min(1/K, sqrt(ln K / (K·t))); ε_0 = 1/K."""
    if t <= 0:
        return 1.0 / k
    return min(1.0 / k, math.sqrt(math.log(k) / (k * t)))


class OdmState(TypedDict):
    """ODM's state: updates made, the reward estimates and the weights, in source order."""

    t: int
    rewards: list[float]
    weights: list[float]


class Odm:
    """EXP3 over the sources with the smoothed, importance-weighted training loss as reward."""

    def __init__(self, names: list[str], prior: list[float], params: OdmParams) -> None:
        self.names = names
        self.prior = prior
        self.smoothing = params.smoothing
        self.t = 0
        self.rewards = [0.0] * len(names)
        self.weights = list(prior)

    def update(
        self, losses: dict[str, float], tokens: dict[str, int], step: int
    ) -> dict[str, float]:
        k = len(self.names)
        a = self.smoothing
        for i, name in enumerate(self.names):
            if name in losses and self.weights[i] > 0:
                self.rewards[i] = a * self.rewards[i] + (1 - a) * losses[name] / self.weights[i]
        self.t += 1
        eps_prev, eps = exploration(self.t - 1, k), exploration(self.t, k)
        top = max(eps_prev * r for r in self.rewards)  # (for exp's range; cancels out)
        raw = [m * math.exp(eps_prev * r - top) for m, r in zip(self.prior, self.rewards)]
        total = sum(raw)
        self.weights = [(1 - k * eps) * w / total + eps for w in raw]
        return dict(zip(self.names, self.weights))

    def state_dict(self) -> OdmState:
        return {"t": self.t, "rewards": list(self.rewards), "weights": list(self.weights)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t = int(state["t"])
        self.rewards = [float(r) for r in state["rewards"]]
        self.weights = [float(w) for w in state["weights"]]


@register_algorithm("odm", OdmParams)
def make_odm(names: list[str], prior: list[float], params: OdmParams) -> Odm:
    return Odm(names, prior, params)
