"""ADO (Jiang et al., 2024, "Adaptive Data Optimization: Dynamic Sample Selection with Scaling
Laws").

Each source k gets a power law of its training loss against the tokens n_k it has been
trained on, L_k(n) = ε_k + β_k·n^(−α_k) (power_law.py), refitted at every update from the
mean losses of the past updates. A source whose loss still falls steeply earns weight:

    ρ_k ∝ μ_k · h_k^s · (−dL_k/dn)(n_k)       μ: the recipe's weights (the prior)
    π   = γ2·ρ + (1 − γ2)·π̄,  then every trained source gets at least δ_min (renormalized)
    h   ← γ1·π + (1 − γ1)·h                   h: credit assignment, starts at μ
    π̄   ← ρ/(t + 1) + (1 − 1/(t + 1))·π̄       π̄: running mean of ρ, starts at μ

where t counts the updates. Updates at global batches up to `ignore_batches` feed no point to
the fits, and the weights stay μ before `start_batches`. A source with fewer than
`min_points` points has no slope yet (ρ_k = 0). When no source has a slope, ρ = μ.
"""

from __future__ import annotations

from typing import Any, TypedDict

from pydantic import Field, model_validator

from mixer.mixing.power_law import fit_power_law
from mixer.mixing.protocol import Params, register_algorithm


class AdoParams(Params):
    gamma1: float = Field(default=0.1, gt=0, le=1, description="Smoothing of the credit h.")
    gamma2: float = Field(default=0.1, gt=0, le=1, description="Weight of ρ against π̄.")
    s: float = Field(default=0.5, ge=0, le=10, description="Exponent of the credit h.")
    delta_min: float = Field(default=0.01, ge=0, lt=1, description="Floor of each weight.")
    ignore_batches: int = Field(
        default=500, ge=0, description="Losses of updates up to this global batch are not fitted."
    )
    start_batches: int = Field(
        default=1000, ge=0, description="The weights stay the prior before this global batch."
    )
    min_points: int = Field(default=3, ge=2, le=1 << 16, description="Points before a fit.")
    max_points: int = Field(
        default=256, ge=2, le=1 << 16, description="Latest points kept per source for the fit."
    )

    @model_validator(mode="after")
    def _points(self) -> AdoParams:
        if self.min_points > self.max_points:
            raise ValueError(f"min_points ({self.min_points}) is more than max_points")
        return self


def _normalized(values: list[float]) -> list[float]:
    total = sum(values)
    return [v / total for v in values]


class AdoState(TypedDict):
    """ADO's state, in source order: updates made, tokens reported, the fitted points
    ([tokens, mean loss] each), the credit h, the average π̄ and the weights."""

    t: int
    trained: list[int]
    points: list[list[list[float]]]
    h: list[float]
    pi_bar: list[float]
    weights: list[float]


class Ado:
    """Weights from each source's fitted rate of loss improvement times its prior share."""

    def __init__(self, names: list[str], prior: list[float], params: AdoParams) -> None:
        self.names = names
        self.prior = prior
        self.p = params
        self.t = 0
        self.trained = [0] * len(names)  # n_k: tokens reported per source
        self.points: list[list[list[float]]] = [[] for _ in names]  # [[n_k, mean loss], ...]
        self.h = list(prior)
        self.pi_bar = list(prior)
        self.weights = list(prior)

    def slopes(self) -> list[float]:
        """dL_k/dn at each source's n_k from its fitted power law (0 without a fit)."""
        out = []
        for k, points in enumerate(self.points):
            if len(points) < self.p.min_points or self.trained[k] <= 0:
                out.append(0.0)
                continue
            law = fit_power_law([n for n, _ in points], [loss for _, loss in points])
            out.append(law.slope(float(self.trained[k])))
        return out

    def update(
        self, losses: dict[str, float], tokens: dict[str, int], step: int
    ) -> dict[str, float]:
        self.t += 1
        for k, name in enumerate(self.names):
            self.trained[k] += int(tokens.get(name, 0))
            loss = losses.get(name)
            if loss is not None and loss > 0 and step > self.p.ignore_batches:
                self.points[k].append([float(self.trained[k]), float(loss)])
                del self.points[k][: -self.p.max_points]
        if step < self.p.start_batches:
            return dict(zip(self.names, self.weights))
        slopes = self.slopes()
        raw = [max(m * h**self.p.s * -d, 0.0) for m, h, d in zip(self.prior, self.h, slopes)]
        rho = _normalized(raw) if sum(raw) > 0 else list(self.prior)
        pi = _normalized(
            [self.p.gamma2 * r + (1 - self.p.gamma2) * b for r, b in zip(rho, self.pi_bar)]
        )
        pi = _normalized(
            [max(w, self.p.delta_min) if n > 0 else w for w, n in zip(pi, self.trained)]
        )
        g1 = self.p.gamma1
        self.h = [g1 * w + (1 - g1) * h for w, h in zip(pi, self.h)]
        a = 1.0 / (self.t + 1)
        self.pi_bar = _normalized([a * r + (1 - a) * b for r, b in zip(rho, self.pi_bar)])
        self.weights = pi
        return dict(zip(self.names, pi))

    def state_dict(self) -> AdoState:
        return {
            "t": self.t,
            "trained": list(self.trained),
            "points": [[list(p) for p in pts] for pts in self.points],
            "h": list(self.h),
            "pi_bar": list(self.pi_bar),
            "weights": list(self.weights),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t = int(state["t"])
        self.trained = [int(n) for n in state["trained"]]
        self.points = [[[float(n), float(v)] for n, v in pts] for pts in state["points"]]
        self.h = [float(v) for v in state["h"]]
        self.pi_bar = [float(v) for v in state["pi_bar"]]
        self.weights = [float(v) for v in state["weights"]]


@register_algorithm("ado", AdoParams)
def make_ado(names: list[str], prior: list[float], params: AdoParams) -> Ado:
    return Ado(names, prior, params)
