"""A deterministic fit of a source's loss against the tokens it was trained on:
L(n) = ε + β·n^(−α), ε >= 0, β >= 0, α in (0, 0.8].

For each α on a fixed grid, ε and β are the least-squares solution of the linear problem in
x = n^(−α) (clamped to be non-negative); the α kept is the one whose curve has the least
squared error in log space (ADO fits in log space). No optimizer and no random start: the same
points give the same curve on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALPHAS = np.linspace(0.8 / 64, 0.8, 64)  # α ≤ 0.8, the bound ADO's fit uses


@dataclass(frozen=True)
class PowerLaw:
    epsilon: float
    beta: float
    alpha: float

    def loss(self, n: float) -> float:
        return self.epsilon + self.beta * n ** (-self.alpha)

    def slope(self, n: float) -> float:
        """dL/dn at n (<= 0 while the loss still falls)."""
        return -self.alpha * (self.loss(n) - self.epsilon) / n


def fit_power_law(tokens: list[float], losses: list[float]) -> PowerLaw:
    """The curve through (tokens, loss) points (tokens > 0, loss > 0; at least two)."""
    n = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    x = np.exp(-ALPHAS[:, None] * np.log(n)[None, :])  # [alphas, points]
    xm, ym = x.mean(axis=1), y.mean()
    var = ((x - xm[:, None]) ** 2).sum(axis=1)
    cov = ((x - xm[:, None]) * (y - ym)[None, :]).sum(axis=1)
    beta = np.where(var > 0, cov / np.where(var > 0, var, 1.0), 0.0)
    beta = np.maximum(beta, 0.0)
    eps = ym - beta * xm
    # ε < 0: the best curve through the origin instead
    through0 = (x * y[None, :]).sum(axis=1) / np.maximum((x * x).sum(axis=1), 1e-300)
    beta = np.where(eps < 0, through0, beta)
    eps = np.maximum(eps, 0.0)
    pred = np.maximum(eps[:, None] + beta[:, None] * x, 1e-300)
    err = ((np.log(pred) - np.log(y)[None, :]) ** 2).sum(axis=1)
    best = int(np.argmin(err))
    return PowerLaw(float(eps[best]), float(beta[best]), float(ALPHAS[best]))
