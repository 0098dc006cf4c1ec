"""The shape of a loader state's JSON payload, checked once when a state is loaded.

Lanes, packers and streams read their states as plain dicts; validating the whole payload
here first turns any structural damage (missing keys, wrong types, negative counters) into a
`StateError` naming the path inside the state, instead of a KeyError deep in a worker.
Unknown keys are ignored, as the consumers ignore them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from mixer.errors import StateError

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
    target: Annotated[float, Field(ge=0, strict=False)]
    documents: Count
    skipped: Count
    epochs: Annotated[float, Field(ge=0, strict=False)] = 0.0
    reasons: dict[str, Count] = {}
    oversize: Count = 0
    packer: dict[str, Any] | None   # its shape depends on the packing (checked below)


class LaneState(_Shape):
    v: int
    lane: Count
    batches: Count
    exhausted: Bit
    regime: str = Field(max_length=4096)
    sources: dict[str, SourceEntry]


class Override(_Shape):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, populate_by_name=True)
    at_global: Count = Field(alias="global")
    weights: dict[str, Annotated[float, Field(ge=0, strict=False)]]


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
    lanes: dict[LaneKey, LaneState | None]
    listing_skipped: dict[str, Count]
    global_tokens: Count = 0                   # position of global batch `next_global`
    schedule: dict[str, Any] | None = None     # points at or before it (schedule.py)
    override: Override | None = None           # the set_weights call in force


def _where(loc: tuple[Any, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f"[{p!r}]" for p in loc) or "the state"


def _refuse(exc: ValidationError, prefix: tuple[Any, ...] = ()) -> StateError:
    first = exc.errors()[0]
    more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
    return StateError(f"loader state is damaged at {_where(prefix + tuple(first['loc']))}: "
                      f"{first['msg']}{more}")


def check_payload(data: Any) -> None:
    """Raise `StateError` unless `data` has the shape `Loader.state_dict()` writes."""
    try:
        payload = Payload.model_validate(data)
    except ValidationError as exc:
        raise _refuse(exc) from None
    if payload.rank >= payload.world_size:
        raise StateError(f"loader state is damaged: rank {payload.rank} is outside world_size "
                         f"{payload.world_size}")
    lanes = payload.fingerprint.stream.lanes
    packer = BestFitPackerState if payload.fingerprint.stream.packing == "best_fit" else (
        ConcatPackerState)
    for key, lane in payload.lanes.items():
        if int(key) >= lanes:
            raise StateError(f"loader state is damaged: lane {key} of a {lanes}-lane recipe")
        if lane is None:
            continue
        if lane.lane != int(key):
            raise StateError(f"loader state is damaged: lane {key} holds the state of lane "
                             f"{lane.lane}")
        for name, entry in lane.sources.items():
            if entry.packer is None:
                continue
            try:
                packer.model_validate(entry.packer)
            except ValidationError as exc:
                raise _refuse(exc, ("lanes", key, "sources", name, "packer")) from None
