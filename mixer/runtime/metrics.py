"""`loader.metrics()`: what a rank's lanes delivered, computed from the lane states it holds.

Everything comes from the plain-data lane states the main process keeps for the batches
already handed out, so a call costs a pass over this rank's lanes and sources (no I/O, no
worker round trip) and the figures are exactly those of the delivered batches.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mixer.config.recipe import Recipe

if TYPE_CHECKING:
    from mixer.pipeline.lanes import LaneState

log = logging.getLogger("mixer.loader")

PER_SOURCE_SUMS = ("tokens", "documents", "skipped", "oversize")
LISTING_REASON = "unreadable_file"  # files that listing skipped (on_error: skip)


@dataclass(frozen=True)
class MetricsSnapshot:
    """What a loader hands `loader_metrics`: plain data, read at the call."""

    names: list[str]  # the recipe's sources, in order
    lane_states: dict[int, LaneState | None]  # this rank's lanes: state as of the batches out
    listing_skipped: dict[str, int]  # files the listing skipped, per source
    target_share: list[float]  # at the next global batch
    global_tokens: int  # tokens of the global stream before it
    io: list[dict[str, int]]  # remote-read counters of each process
    next_global_batch: int
    next_global: Any  # the loader's per-rank position (state's own)


def loader_metrics(snapshot: MetricsSnapshot) -> dict[str, Any]:
    """This rank's metrics (see `Loader.metrics`)."""
    names = snapshot.names
    sums = {key: dict.fromkeys(names, 0) for key in PER_SOURCE_SUMS}
    reasons: dict[str, dict[str, int]] = {name: {} for name in names}
    epochs = dict.fromkeys(names, 0.0)
    lanes = list(snapshot.lane_states)
    for lane in lanes:
        for name, entry in (snapshot.lane_states[lane] or {}).get("sources", {}).items():
            if name not in epochs:
                continue  # a source removed from the recipe (refused on load anyway)
            for key in PER_SOURCE_SUMS:
                sums[key][name] += entry.get(key, 0)
            for reason, n in entry.get("reasons", {}).items():
                reasons[name][reason] = reasons[name].get(reason, 0) + n
            epochs[name] += entry.get("epochs", 0.0)
    for name, skipped in snapshot.listing_skipped.items():
        if skipped:
            sums["skipped"][name] += skipped
            reasons[name][LISTING_REASON] = skipped
    total = sum(sums["tokens"].values())
    io = {"requests": 0, "retries": 0, "bytes": 0}
    for counters in snapshot.io:
        for key in io:
            io[key] += counters[key]
    return {
        "tokens": sums["tokens"],
        "documents": sums["documents"],
        "target_share": dict(zip(names, snapshot.target_share)),
        "realized_share": {n: (t / total if total else 0.0) for n, t in sums["tokens"].items()},
        "epochs": {n: e / max(len(lanes), 1) for n, e in epochs.items()},
        "skipped": sums["skipped"],
        "skipped_by_reason": reasons,
        "oversize": sums["oversize"],
        "io": io,
        "next_global_batch": snapshot.next_global_batch,
        "global_tokens": snapshot.global_tokens,
        "next_global": snapshot.next_global,
    }


def sum_metrics(per_rank: list[dict[str, Any]], snapshot: MetricsSnapshot) -> dict[str, Any]:
    """The ranks' metrics summed (`metrics(all_ranks=True)`): counts add up, epochs are the
    mean over ranks (each holds an equal share of the lanes), shares are recomputed, and
    files skipped by the job's one listing count once."""
    names = snapshot.names
    out = {key: {n: sum(m[key][n] for m in per_rank) for n in names} for key in PER_SOURCE_SUMS}
    listing = snapshot.listing_skipped
    reasons: dict[str, dict[str, int]] = {n: {} for n in names}
    for m in per_rank:
        for name in names:
            for reason, n in m["skipped_by_reason"][name].items():
                reasons[name][reason] = reasons[name].get(reason, 0) + n
    for name in names:
        if listing.get(name):
            out["skipped"][name] -= listing[name] * (len(per_rank) - 1)
            reasons[name][LISTING_REASON] = listing[name]
    total = sum(out["tokens"].values())
    first = per_rank[0]
    return {
        **out,
        "target_share": first["target_share"],
        "realized_share": {n: (t / total if total else 0.0) for n, t in out["tokens"].items()},
        "epochs": {n: sum(m["epochs"][n] for m in per_rank) / len(per_rank) for n in names},
        "skipped_by_reason": reasons,
        "io": {k: sum(m["io"][k] for m in per_rank) for k in first["io"]},
        "next_global_batch": min(m["next_global_batch"] for m in per_rank),
        "global_tokens": min(m["global_tokens"] for m in per_rank),
        "next_global": first["next_global"],
    }


def warn_left_over(recipe: Recipe, epochs: dict[str, float], rank: int) -> None:
    """A finite stream ended: name the sources this rank's lanes had not finished (their
    weight was 0 from there on: a schedule, or `set_weights`), since their documents were
    never delivered."""
    left = [
        f"{src.name} ({epochs[src.name]:.4g} of {src.epochs} epochs)"
        for src in recipe.sources
        if src.epochs is not None and epochs[src.name] < src.epochs
    ]
    if left:
        log.warning(
            "rank %d's stream ended with documents left in %s: every source with "
            "weight had run out, and these weigh 0 from there on (the schedule or "
            "set_weights)",
            rank,
            ", ".join(left),
        )
