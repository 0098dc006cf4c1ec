"""`loader.metrics()`: what a rank's lanes delivered, computed from the lane states it holds.

Everything comes from the plain-data lane states the main process keeps for the batches
already handed out, so a call costs a pass over this rank's lanes and sources (no I/O, no
worker round trip) and the figures are exactly those of the delivered batches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mixer.loader import Loader

PER_SOURCE_SUMS = ("tokens", "documents", "skipped", "oversize")
LISTING_REASON = "unreadable_file"   # files that listing skipped (on_error: skip)


def loader_metrics(loader: Loader) -> dict[str, Any]:
    """This rank's metrics (see `Loader.metrics`)."""
    names = loader.recipe.names
    sums = {key: dict.fromkeys(names, 0) for key in PER_SOURCE_SUMS}
    reasons: dict[str, dict[str, int]] = {name: {} for name in names}
    epochs = dict.fromkeys(names, 0.0)
    lanes = loader.own_lanes()
    for lane in lanes:
        for name, entry in (loader._lane_states.get(lane) or {}).get("sources", {}).items():
            if name not in epochs:
                continue   # a source removed from the recipe (refused on load anyway)
            for key in PER_SOURCE_SUMS:
                sums[key][name] += entry.get(key, 0)
            for reason, n in entry.get("reasons", {}).items():
                reasons[name][reason] = reasons[name].get(reason, 0) + n
            epochs[name] += entry.get("epochs", 0.0)
    for table in loader.tables:
        if table.skipped:
            sums["skipped"][table.name] += len(table.skipped)
            reasons[table.name][LISTING_REASON] = len(table.skipped)
    total = sum(sums["tokens"].values())
    next_global = loader.next_global_batch
    _, target = loader._plan.at(next_global)
    io = {"requests": 0, "retries": 0, "bytes": 0}
    for counters in loader._io.values():
        for key in io:
            io[key] += counters[key]
    return {
        "tokens": sums["tokens"],
        "documents": sums["documents"],
        "target_share": dict(zip(names, target)),
        "realized_share": {n: (t / total if total else 0.0) for n, t in sums["tokens"].items()},
        "epochs": {n: e / max(len(lanes), 1) for n, e in epochs.items()},
        "skipped": sums["skipped"],
        "skipped_by_reason": reasons,
        "oversize": sums["oversize"],
        "io": io,
        "next_global_batch": next_global,
        "global_tokens": loader._plan.tokens_at(next_global),
        "next_global": loader._next_global,
    }


def sum_metrics(per_rank: list[dict[str, Any]], loader: Loader) -> dict[str, Any]:
    """The ranks' metrics summed (`metrics(all_ranks=True)`): counts add up, epochs are the
    mean over ranks (each holds an equal share of the lanes), shares are recomputed, and
    files skipped by the job's one listing count once."""
    names = loader.recipe.names
    out = {key: {n: sum(m[key][n] for m in per_rank) for n in names} for key in PER_SOURCE_SUMS}
    listing = {t.name: len(t.skipped) for t in loader.tables}
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
