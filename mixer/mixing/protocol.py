"""The plug-in protocol of an online mixing algorithm and the registry that names them.

An algorithm is made once per loader from the recipe's sources, their starting weights (the
prior) and its validated parameters. At each update point the loader calls
`update(losses, tokens, step)` with the figures of all ranks combined:

- `losses`: source → mean per-token loss since the last update, only for sources that
  received reported tokens (the others keep their estimate),
- `tokens`: source → tokens reported since the last update (every source, 0 allowed),
- `step`: the global batch at which the new weights take effect (k · every),

and it returns source → weight (>= 0, normalized by the loader). It must be a deterministic
function of its state and those arguments: every rank computes the weights itself, and a
resumed run must compute the same ones. `state_dict()` returns plain JSON data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict


@runtime_checkable
class Algorithm(Protocol):
    """What `register_algorithm` registers a factory of."""

    def update(
        self, losses: dict[str, float], tokens: dict[str, int], step: int
    ) -> dict[str, float]: ...

    def state_dict(self) -> Mapping[str, Any]:
        """Plain JSON data (each algorithm's own TypedDict: `OdmState`, `AdoState`)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from what `state_dict()` returned, after a JSON round trip."""
        ...


class Params(BaseModel):
    """Base of an algorithm's parameters: frozen, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False)


Factory = Callable[[list[str], list[float], Any], Algorithm]


@dataclass(frozen=True)
class AlgorithmSpec:
    """A registered algorithm: its parameters' model and its factory
    `make(names, prior_weights, params) -> Algorithm`."""

    name: str
    params: type[BaseModel]
    make: Factory


ALGORITHMS: dict[str, AlgorithmSpec] = {}


def register_algorithm(name: str, params: type[BaseModel] = Params) -> Callable[[Factory], Factory]:
    """Register `make(names, prior_weights, params)` under `name`, so that a recipe's
    `online_mixing: {algorithm: name, ...}` selects it. `params` is a pydantic model of the
    recipe keys it takes besides `algorithm` and `every` (unknown keys are refused)."""

    def wrap(make: Factory) -> Factory:
        ALGORITHMS[name] = AlgorithmSpec(name, params, make)
        return make

    return wrap


def make_algorithm(
    name: str, names: list[str], prior: list[float], params: dict[str, Any]
) -> Algorithm:
    """The registered algorithm `name` for these sources and starting weights."""
    spec = ALGORITHMS[name]
    return spec.make(list(names), list(prior), spec.params.model_validate(params))
