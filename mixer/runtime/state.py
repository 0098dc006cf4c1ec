"""Loader state: versioned plain data with a fingerprint of what defines the stream.

`Loader.state_dict()` returns a fixed shape, `{"format", "version", "json"}`, so that
`torch.distributed.checkpoint` can load it into a fresh loader's template. The JSON holds:
the next global batch, the topology that wrote it, one small state per lane, and the
fingerprint checked on load. The lanes are written column by column (`state_codec`), which
keeps the merged state of a 1,024-rank × 8-worker job (8,192 lanes) under a megabyte.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Literal, TypedDict, cast

from mixer.config.images import ImageSettings
from mixer.config.recipe import Recipe
from mixer.core.errors import StateError
from mixer.core.token_info import TokenizerInfo
from mixer.pipeline.lanes import LaneState
from mixer.pipeline.schedule import OverrideState, ScheduleState
from mixer.runtime.mixing_state import MixingState, merge_mixing
from mixer.runtime.state_codec import decode_lanes, encodable, encode_lanes
from mixer.runtime.state_schema import check_payload
from mixer.sources import SourceTable

STATE_FORMAT = "mixer.loader"
STATE_VERSION = 4
_STREAM_FIELDS = (
    "seed",
    "seq_len",
    "lanes",
    "packing",
    "pack_window",
    "shuffle_window",
    "shuffle_window_bytes",
    "shuffle_budget_bytes",
    "split_bytes",
    "max_document_bytes",
    "mask_document_boundaries",
)


class Fingerprint(TypedDict):
    """What defines the stream: the recipe's stream fields (`_STREAM_FIELDS`, the
    tokenizer's digest and eos id, the `images` and `audio` blocks), and per source its
    settings and digests of its files, splits and their content versions."""

    stream: dict[str, Any]
    sources: dict[str, dict[str, Any]]


class _PayloadFields(TypedDict):
    kind: Literal["global", "rank"]  # global: every lane (any topology); rank: its own lanes
    fingerprint: Fingerprint
    next_global: int
    world_size: int
    rank: int
    lanes: dict[str, LaneState | None]  # lane index (a decimal string) → its state
    listing_skipped: dict[str, int]  # source → files the listing skipped
    global_tokens: int  # position of global batch `next_global`
    schedule: ScheduleState | None  # points at or before it
    override: OverrideState | None  # the set_weights call in force


class LoaderPayload(_PayloadFields, total=False):
    """The JSON inside a loader state (`pack`, `unpack`; `state_schema` checks its shape)."""

    mixing: MixingState  # online mixing; absent for the recipes without it


def fingerprint(recipe: Recipe, tokenizer: TokenizerInfo, tables: list[SourceTable]) -> Fingerprint:
    """What must not change for a state to resume (weights and batch size may change)."""
    stream = {name: getattr(recipe, name) for name in _STREAM_FIELDS}
    stream["tokenizer"] = tokenizer.digest
    stream["eos_id"] = tokenizer.eos_id
    if recipe.images is not None:
        stream["images"] = _image_stream(recipe.images)
    if recipe.audio is not None:
        stream["audio"] = recipe.audio.model_dump(mode="json")
    sources = {}
    for src, table in zip(recipe.sources, tables):
        files = hashlib.sha256(json.dumps(table.fingerprint()).encode()).hexdigest()[:16]
        splits = hashlib.sha256(json.dumps([s.to_list() for s in table.splits]).encode())
        sources[src.name] = {
            "text_field": src.text_field,
            "format": src.format,
            "epochs": src.epochs,
            "on_error": src.on_error,
            "files": files,
            "splits": splits.hexdigest()[:16],
            "versions": _versions(table),
        }
    return {"stream": stream, "sources": sources}


def _image_stream(images: ImageSettings) -> dict:
    """The `images` block as the fingerprint holds it: `resize` only when it is not the
    default (`pil`), so the states of image recipes are those tests/test_golden.py holds."""
    block = images.model_dump(mode="json")
    if block.get("resize") == "pil":
        del block["resize"]
    return block


def _versions(table: SourceTable) -> list[str]:
    """[kind, digest] of the files' content versions (ETags, or local modification times).

    Kept apart from names and sizes: versions are compared only between listings of the same
    kind, so a checkpoint taken on S3 still resumes on a local copy of the bucket.
    """
    kinds = sorted({f.version.split(":", 1)[0] for f in table.files})
    digest = hashlib.sha256(json.dumps([[f.key, f.version] for f in table.files]).encode())
    return ["+".join(kinds), digest.hexdigest()[:16]]


def _changes(was: dict, now: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(path, old, new) of each changed setting; a block present on both sides (`images`)
    is compared field by field, so its paths read `images.max_pixels`."""
    out = []
    for key in sorted(set(was) | set(now)):
        old, new = was.get(key), now.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            out += _changes(old, new, f"{prefix}{key}.")
        elif old != new:
            out.append((f"{prefix}{key}", old, new))
    return out


def check_fingerprint(saved: Fingerprint, current: Fingerprint) -> None:
    """Refuse a state written for a different stream, naming what changed (each field of a
    block such as `images` by its own path)."""
    changed = _changes(saved["stream"], current["stream"])
    if changed:
        details = ", ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in changed)
        raise StateError(f"cannot resume after changing {details}")
    for name, was in saved["sources"].items():
        now = current["sources"].get(name)
        if now is None:
            raise StateError(
                f"cannot resume: source {name!r} was removed from the recipe "
                "(adding sources is allowed, removing or renaming is not)"
            )
        diff = [k for k in was if k != "versions" and was[k] != now.get(k)]
        versions_now, versions_was = now.get("versions"), was.get("versions")
        if (
            not diff
            and isinstance(versions_was, list)
            and versions_now
            and versions_was
            and versions_was[0] == versions_now[0]
            and versions_was != versions_now
        ):
            kind = "ETags" if versions_now[0] == "etag" else "modification times"
            raise StateError(
                f"cannot resume: source {name!r} has files whose content changed since the "
                f"checkpoint (same names and sizes, other {kind}); resuming would read other "
                "documents at the saved offsets. If the files are exact copies, restore their "
                "modification times (cp -p, rsync -t)"
            )
        if diff == ["splits"]:
            raise StateError(
                f"cannot resume: source {name!r} is cut into other splits than at "
                "the checkpoint (a manifest from `mixer index` was added or "
                "removed, or its row groups changed); resume with the same "
                "manifest setting"
            )
        if diff:
            what = "its files (names or sizes)" if "files" in diff else ", ".join(diff)
            raise StateError(f"cannot resume: source {name!r} changed {what} since the checkpoint")


def pack(payload: LoaderPayload) -> dict[str, Any]:
    """The fixed-shape state of a payload (its lanes encoded column by column):
    `{"format": STATE_FORMAT, "version": STATE_VERSION, "json": the payload}`. A plain dict,
    as `torch.distributed.checkpoint`'s `Stateful` has it."""
    data: Any = payload  # (a test may pack a damaged payload, even one that is no dict)
    if isinstance(payload, dict) and encodable(payload.get("lanes")):
        data = {**payload, "lanes": encode_lanes(payload["lanes"])}
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "json": json.dumps(data, separators=(",", ":"), sort_keys=True),
    }


def unpack(state: dict[str, Any], *, lanes: Iterable[int] | None = None) -> LoaderPayload:
    """The payload of a state, its shape checked (`StateError` otherwise).

    `lanes`: decode and check only these lanes' states (a loader needs its own; the others
    are checked by the ranks that load them, and left out here as `{}`); None: every lane.
    """
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise StateError("not a mixer loader state (expected the dict from loader.state_dict())")
    if state.get("version") != STATE_VERSION:
        raise StateError(
            f"loader state version {state.get('version')} is not supported "
            f"(this mixer writes version {STATE_VERSION})"
        )
    try:
        payload = json.loads(state["json"])
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        raise StateError(f"loader state is damaged: {exc!r}") from None
    if isinstance(payload, dict) and "lanes" in payload:
        keep = None if lanes is None else {str(i) for i in lanes}
        payload["lanes"] = decode_lanes(payload["lanes"], keep)
    check_payload(payload, lanes=lanes)
    return cast(LoaderPayload, payload)  # (the shape just checked)


def merge_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine the states of all ranks of one job (same step) into a global state.

    The result loads into a loader of any topology that the recipe's lanes allow. Every
    rank's state is checked in full (once, here).
    """
    if not states:
        raise StateError("merge_states needs the state of every rank, got none")
    return pack(merge_payloads([unpack(s) for s in states]))


def merge_payloads(payloads: list[LoaderPayload]) -> LoaderPayload:
    """The global payload of all ranks' payloads (checked shapes, one per rank, same step).

    Linear in the lanes: the fingerprints are compared, the lane dicts joined.
    """
    first = payloads[0]
    if all(p["kind"] == "global" for p in payloads):
        if any(p != first for p in payloads[1:]):
            raise StateError("global states to merge differ; they come from different steps")
        return first
    world = first["world_size"]
    ranks = sorted(p["rank"] for p in payloads)
    if ranks != list(range(world)):
        raise StateError(
            f"merge_states needs exactly one state per rank 0..{world - 1}, got ranks {ranks}"
        )
    lanes: dict[str, LaneState | None] = {}
    skipped: dict[str, int] = {}
    for p in payloads:
        if p["fingerprint"] != first["fingerprint"]:
            raise StateError(f"rank {p['rank']}'s state comes from a different recipe")
        if p["next_global"] != first["next_global"] or p["world_size"] != world:
            raise StateError(
                f"rank {p['rank']} is at global batch {p['next_global']}, rank "
                f"{first['rank']} at {first['next_global']}: states of one step "
                "are needed"
            )
        for key in ("global_tokens", "schedule", "override"):
            if p.get(key) != first.get(key):
                raise StateError(
                    f"rank {p['rank']}'s {key} differs from rank "
                    f"{first['rank']}'s: states of one step of one job are needed"
                )
        lanes.update(p["lanes"])
        skipped = p["listing_skipped"]
    if len(lanes) != first["fingerprint"]["stream"]["lanes"]:
        raise StateError("the ranks' states do not cover every lane")
    merged: LoaderPayload = {
        "kind": "global",
        "fingerprint": first["fingerprint"],
        "next_global": first["next_global"],
        "world_size": world,
        "rank": 0,
        "lanes": lanes,
        "listing_skipped": skipped,
        "global_tokens": first.get("global_tokens", 0),
        "schedule": first.get("schedule"),
        "override": first.get("override"),
    }
    mixing = merge_mixing([p.get("mixing") for p in payloads])
    if mixing is not None:
        merged["mixing"] = mixing
    return merged
