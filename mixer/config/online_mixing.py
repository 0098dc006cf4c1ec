"""The recipe's `online_mixing:` block: which algorithm sets the weights from the reported
losses, how often, and its parameters (docs/recipes.md#online-mixing)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, ValidationError, model_validator

from mixer.config.fields import Int, _Frozen
from mixer.mixing import ALGORITHMS

MAX_EVERY = 1 << 40


class OnlineMixing(_Frozen):
    """`{algorithm, every, ...parameters}`; the parameters are checked against the algorithm's
    own model (unknown keys and values out of range are refused, naming the key)."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=False, allow_inf_nan=False)

    algorithm: str = Field(description="A registered algorithm: odm | ado (or a plug-in's).")
    every: Int = Field(default=100, ge=1, le=MAX_EVERY, description="Global batches per update.")

    @model_validator(mode="after")
    def _known_algorithm(self) -> OnlineMixing:
        spec = ALGORITHMS.get(self.algorithm)
        if spec is None:
            raise ValueError(
                f"online_mixing.algorithm: unknown algorithm {self.algorithm!r}; known: "
                f"{', '.join(sorted(ALGORITHMS))}"
            )
        try:
            spec.params.model_validate(self.params)
        except ValidationError as exc:
            item = exc.errors()[0]
            key = ".".join(str(p) for p in item["loc"])
            msg = "unknown key" if item["type"] == "extra_forbidden" else item["msg"]
            where = f"online_mixing.{key}" if key else "online_mixing"
            raise ValueError(f"{where}: {msg.removeprefix('Value error, ')}") from None
        return self

    @property
    def params(self) -> dict[str, Any]:
        """The algorithm's parameters as the recipe gives them (defaults apply on top)."""
        return dict(self.model_extra or {})
