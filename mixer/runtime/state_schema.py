"""The shape of a loader state's JSON payload, checked once when a state is loaded.

Lanes, packers and streams read their states as plain dicts; validating the whole payload
here first turns any structural damage (missing keys, wrong types, negative counters) into a
`StateError` naming the path inside the state, instead of a KeyError deep in a worker.
Unknown keys are ignored, as the consumers ignore them. A loader checks in depth only the
lanes it will run (`lanes=`): with 8,192 lanes, checking all of them on every rank would cost
each rank what the job needs once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from mixer.core.errors import StateError

Count = Annotated[int, Field(ge=0, lt=1 << 63)]
Bit = Annotated[int, Field(ge=0, le=1)]
LaneKey = Annotated[str, StringConstraints(pattern=r"^(0|[1-9][0-9]{0,8})$")]


class _Shape(BaseModel):
    # Strict: JSON gives ints and floats as they were written; `true` is no counter.
    model_config = ConfigDict(strict=True, allow_inf_nan=False)


class StreamState(_Shape):
    epoch: Count
    window: Count
    slot: Count
    index: Count
    offset: Count
    pos: Count
    skipped: Count
    done: Bit
    oversize: Count = 0
    reasons: dict[str, Count] = {}


class ConcatPackerState(_Shape):
    stream: StreamState
    offset: Count
    exhausted: Bit


class BestFitPackerState(_Shape):
    stream: StreamState
    emitted: Count
    exhausted: Bit


class SourceEntry(_Shape):
    tokens: Count
    mix: Count
    deficit: Annotated[int, Field(gt=-(1 << 63), lt=1 << 63)]  # target - mix, milli-tokens
    documents: Count
    skipped: Count
    epochs: Annotated[float, Field(ge=0, strict=False)] = 0.0
    reasons: dict[str, Count] = {}
    oversize: Count = 0


class ConcatSourceEntry(SourceEntry):
    packer: ConcatPackerState | None


class BestFitSourceEntry(SourceEntry):
    packer: BestFitPackerState | None


class LaneState(_Shape):
    v: int
    lane: Count
    batches: Count
    exhausted: Bit
    regime: str = Field(max_length=4096)


class ConcatLaneState(LaneState):
    sources: dict[str, ConcatSourceEntry]


class BestFitLaneState(LaneState):
    sources: dict[str, BestFitSourceEntry]


# One validator call for all the lanes checked (the packer's shape follows the packing).
_LANES = {
    "concat": TypeAdapter(dict[str, ConcatLaneState | None]),
    "best_fit": TypeAdapter(dict[str, BestFitLaneState | None]),
}


class Override(_Shape):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, populate_by_name=True)
    at_global: Count = Field(alias="global")
    weights: dict[str, Annotated[float, Field(ge=0, strict=False)]]


class MixingState(_Shape):
    algorithm: str
    names: list[str]
    next_update: Count
    updates: Count
    state: dict[str, Any]
    losses: dict[str, Annotated[float, Field(strict=False)]]
    pending: dict[str, Annotated[list[int], Field(min_length=2, max_length=2)]]


class StreamFingerprint(_Shape):
    model_config = ConfigDict(extra="allow")
    lanes: int = Field(ge=1)
    packing: str


class Fingerprint(_Shape):
    stream: StreamFingerprint
    sources: dict[str, dict[str, Any]]


class Payload(_Shape):
    kind: Literal["global", "rank"]
    fingerprint: Fingerprint
    next_global: Count
    world_size: int = Field(ge=1, lt=1 << 31)
    rank: Count
    lanes: dict[LaneKey, Any]
    listing_skipped: dict[str, Count]
    global_tokens: Count = 0  # position of global batch `next_global`
    schedule: dict[str, Any] | None = None  # points at or before it (schedule.py)
    override: Override | None = None  # the set_weights call in force
    mixing: MixingState | None = None  # online mixing (mixing_state.py)


def _where(loc: tuple[Any, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f"[{p!r}]" for p in loc) or "the state"


def _refuse(exc: ValidationError, prefix: tuple[Any, ...] = ()) -> StateError:
    first = exc.errors()[0]
    more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
    return StateError(
        f"loader state is damaged at {_where(prefix + tuple(first['loc']))}: {first['msg']}{more}"
    )


def check_payload(data: Any, *, lanes: Iterable[int] | None = None) -> None:
    """Raise `StateError` unless `data` has the shape `Loader.state_dict()` writes.

    `lanes`: check only these lanes' states in depth (None: all of them).
    """
    try:
        payload = Payload.model_validate(data)
    except ValidationError as exc:
        raise _refuse(exc) from None
    if payload.rank >= payload.world_size:
        raise StateError(
            f"loader state is damaged: rank {payload.rank} is outside world_size "
            f"{payload.world_size}"
        )
    count = payload.fingerprint.stream.lanes
    for key in payload.lanes:
        if int(key) >= count:
            raise StateError(f"loader state is damaged: lane {key} of a {count}-lane recipe")
    keys = payload.lanes.keys() if lanes is None else [str(i) for i in lanes]
    chosen = {k: payload.lanes[k] for k in keys if k in payload.lanes}
    adapter = _LANES["best_fit" if payload.fingerprint.stream.packing == "best_fit" else "concat"]
    try:
        checked = adapter.validate_python(chosen)
    except ValidationError as exc:
        raise _refuse(exc, ("lanes",)) from None
    for key, lane in checked.items():
        if lane is not None and lane.lane != int(key):
            raise StateError(
                f"loader state is damaged: lane {key} holds the state of lane {lane.lane}"
            )
