"""What `mixer plan` reports: where N training tokens will come from, before training.

The plan integrates the target weights (the schedule's, else the sources' `weight`) over
[0, N] global tokens. A capped source (`epochs: k`) runs out once it has supplied k times its
estimated size; from there the others' weights renormalize over the sources still active, as
the deficit rule does (mix.py). Sizes are `mixer inspect`'s estimates (report.py), so the plan
is as good as those: exact for known record counts and uniform documents, otherwise a sample.
The model is global; a real run exhausts a capped source lane by lane, so its end is spread
over roughly one lane's share of the source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mixer.config.recipe import Recipe
from mixer.core.errors import MixerError
from mixer.runtime.topology import fits, valid_workers

REPEAT_WARNING = 4.0  # epochs; beyond ~4 repeats extra data is worth little (data-constrained
#                          scaling, Muennighoff et al. 2023)
_LINEAR_STEPS = 256  # sub-steps per linear schedule segment (and at least 1/65536 of N:
#                          the midpoint rule is exact for linear weights; sub-steps only
#                          matter once a capped source is gone and the others renormalize)
_EPS = 1e-9


@dataclass(frozen=True)
class SourceSize:
    """What the plan needs to know about one source (from `inspect_recipe`'s row)."""

    tokens: float  # estimated tokens per epoch
    bytes: int = 0
    documents: float = 0.0
    splits: int = 1
    read_amplification: float = 1.0
    compressed_split_bytes: int = 0  # largest split with no access points (0: none)
    lanes_without_documents: int = 0  # lanes that get none of it in an epoch (striped, few docs)
    skipped_in_sample: int = 0  # bad input met by inspect's sample (on_error: skip)
    first_skipped: str | None = None  # the first of them, in words


def simulate(recipe: Recipe, sizes: dict[str, SourceSize], total: int) -> dict[str, Any]:
    """Tokens per source over [0, `total`], with caps running out and renormalizing.

    Returns `tokens` ({name: float}), `runs_out_at` ({name: global tokens}),
    `renormalizations` (list of {at_tokens, source, weights}) and `ends_at` (global tokens
    where no active source has a positive target, or None).
    """
    names = recipe.names
    caps = [None if s.epochs is None else s.epochs * sizes[s.name].tokens for s in recipe.sources]
    supplied = [0.0] * len(names)
    active = [cap is None or cap > 0 for cap in caps]
    runs_out: dict[str, float] = {n: 0.0 for n, a in zip(names, active) if not a}
    events: list[dict[str, Any]] = []
    t, ends_at = 0.0, None
    while t < total - _EPS:
        stop = min(float(total), _next_boundary(recipe, t, total / 65536))
        linear = recipe.schedule is not None and recipe.schedule.interpolate == "linear"
        probe = (t + stop) / 2 if linear else t
        # A fractional position: the midpoint rule is exact for linear weights.
        target = recipe.weights_at(probe)
        raw = [w if a else 0.0 for w, a in zip(target, active)]
        mass = sum(raw)
        if mass <= 0:
            ends_at = t
            break
        rates = [w / mass for w in raw]
        for i, (cap, rate) in enumerate(zip(caps, rates)):
            if cap is not None and rate > 0:
                stop = min(stop, t + (cap - supplied[i]) / rate)
        for i, rate in enumerate(rates):
            supplied[i] += rate * (stop - t)
        t = stop
        for i, cap in enumerate(caps):
            if active[i] and cap is not None and supplied[i] >= cap - _EPS * max(cap, 1.0):
                supplied[i] = cap
                active[i] = False
                runs_out[names[i]] = t
                after = [w if a else 0.0 for w, a in zip(recipe.weights_at(t), active)]
                mass = sum(after)
                events.append(
                    {
                        "at_tokens": round(t),
                        "source": names[i],
                        "weights": {
                            n: round(w / mass, 6)
                            for n, w, a in zip(names, after, active)
                            if a and mass > 0
                        },
                    }
                )
    return {
        "tokens": dict(zip(names, supplied)),
        "runs_out_at": runs_out,
        "renormalizations": events,
        "ends_at": ends_at,
    }


def _next_boundary(recipe: Recipe, t: float, min_step: float) -> float:
    """The next global token position where the target weights change shape."""
    schedule = recipe.schedule
    if schedule is None:
        return float("inf")
    i = schedule.point_index(int(t))
    if i + 1 >= len(schedule.points):
        return float("inf")
    nxt = schedule.points[i + 1].at_tokens
    if schedule.interpolate == "linear":
        width = (nxt - schedule.points[i].at_tokens) / _LINEAR_STEPS
        return min(nxt, t + max(width, min_step, 1.0))
    return nxt


def topology(recipe: Recipe, world_size: int, num_workers: int | None) -> dict[str, Any]:
    """Valid num_workers for `world_size`, nearby valid lanes, and whether the asked one fits."""
    lanes = recipe.lanes
    valid = valid_workers(lanes, world_size)
    unit = world_size * max(num_workers or 1, 1)
    below = lanes // unit * unit
    valid_lanes = sorted({unit * k for k in (1, 2, 4, 8)} | {below or unit, below + unit})
    out = {
        "world_size": world_size,
        "num_workers": num_workers,
        "lanes": lanes,
        "valid_num_workers": valid,
        "valid_lanes": valid_lanes,
        "valid": fits(lanes, world_size, num_workers or 0)
        if num_workers is not None
        else bool(valid),
        "lanes_per_rank": lanes / world_size,
        # Invariant 6: a rank's shares are within a point of the targets after this.
        "exact_mixture_after_tokens_per_rank": 25
        * lanes
        / world_size
        * recipe.batch_size
        * recipe.seq_len,
    }
    if num_workers is not None and out["valid"]:
        out["lanes_per_worker"] = lanes // unit
        out["open_streams_per_worker"] = lanes // unit * len(recipe.sources)
    return out


def resume_cost(recipe: Recipe, size: SourceSize) -> int:
    """Worst bytes re-read when one (lane, source) stream resumes.

    One shuffle window from its start cursor (times the read amplification: a striped lane
    reads m records for each it keeps), or, inside a split with no access points (single-frame .zst,
    .gz), everything from the file's start: the whole split.
    """
    per_doc = size.bytes / size.documents if size.documents else 0.0
    window = min(recipe.shuffle_window * per_doc, recipe.shuffle_window_bytes)
    # A window ends with the lane's slice: at most ceil(splits / lanes) average splits.
    splits = max(size.splits, 1)
    slice_bytes = size.bytes / splits * -(-splits // recipe.lanes)
    window = min(window * size.read_amplification, slice_bytes)
    return round(max(window, size.compressed_split_bytes))


def plan(
    recipe: Recipe,
    tokens: int,
    *,
    world_size: int = 1,
    num_workers: int | None = None,
    sizes: dict[str, SourceSize] | None = None,
) -> dict[str, Any]:
    """The plan of a run of `tokens` training tokens (JSON-able; keys in docs/recipes.md).

    Raises `TopologyError` for a world size or worker count out of range (one that does not
    divide the lanes is only reported: `topology.valid` is false)."""
    from mixer.runtime.topology import check_ranks

    check_ranks(0, world_size, num_workers or 0)
    if tokens <= 0:
        raise MixerError(f"training tokens must be positive, got {tokens:,}")
    if sizes is None:
        sizes = measure(recipe)
    sim = simulate(recipe, sizes, tokens)
    sources: dict[str, Any] = {}
    warnings: list[str] = []
    for src in recipe.sources:
        size = sizes[src.name]
        got = sim["tokens"][src.name]
        epochs = got / size.tokens if size.tokens else None
        out_at = sim["runs_out_at"].get(src.name)
        sources[src.name] = {
            "target_tokens": round(got),
            "share": got / tokens if tokens else 0.0,
            "epochs": epochs,
            "epochs_cap": src.epochs,
            "tokens_per_epoch": round(size.tokens),
            "runs_out_at_tokens": None if out_at is None else round(out_at),
            "read_amplification": size.read_amplification,
            "resume_bytes_per_stream": resume_cost(recipe, size),
        }
        warnings += _source_warnings(recipe, src, size, epochs, out_at, tokens)
    if sim["ends_at"] is not None:
        warnings.append(
            f"the stream ends at {sim['ends_at']:,.0f} tokens, before {tokens:,}: "
            "no source with a positive weight is left"
        )
    topo = topology(recipe, world_size, num_workers)
    if not topo["valid"]:
        warnings.append(
            f"topology: lanes={recipe.lanes} does not fit world_size {world_size}"
            f" × num_workers {num_workers or 1}; valid num_workers: "
            f"{topo['valid_num_workers'] or 'none'}; valid lanes near it: "
            f"{topo['valid_lanes']}"
        )
    per_lane = sum(s["resume_bytes_per_stream"] for s in sources.values())
    return {
        "training_tokens": tokens,
        "planned_tokens": round(sum(sim["tokens"].values())),
        "ends_at_tokens": None if sim["ends_at"] is None else round(sim["ends_at"]),
        "schedule": recipe.schedule.interpolate if recipe.schedule else None,
        "lanes": recipe.lanes,
        "seq_len": recipe.seq_len,
        "batch_size": recipe.batch_size,
        "sources": sources,
        "renormalizations": sim["renormalizations"],
        "topology": topo,
        "resume": {
            "worst_bytes_per_rank": round(per_lane * recipe.lanes / world_size),
            "worst_bytes_all_ranks": per_lane * recipe.lanes,
        },
        "warnings": warnings,
    }


def _source_warnings(
    recipe: Recipe,
    src: Any,
    size: SourceSize,
    epochs: float | None,
    out_at: float | None,
    tokens: int,
) -> list[str]:
    """What the plan warns of about one source."""
    out: list[str] = []
    if epochs is not None and epochs > REPEAT_WARNING:
        out.append(
            f"source {src.name!r} repeats {epochs:.3g} times in {tokens:,} "
            f"tokens; beyond ~{REPEAT_WARNING:g} epochs repeated data adds "
            "little (data-constrained scaling): add data or lower its weight"
        )
    if out_at is not None and out_at < tokens:
        out.append(
            f"source {src.name!r} (epochs: {src.epochs}) runs out at "
            f"{out_at:,.0f} tokens, before {tokens:,}; the other sources' "
            "weights renormalize from there"
        )
    if size.tokens <= 0:
        out.append(f"source {src.name!r} has no tokens in its estimate (empty?)")
    if size.lanes_without_documents:
        out.append(
            f"source {src.name!r}: {size.lanes_without_documents} of "
            f"{recipe.lanes} lanes get none of its documents (fewer documents "
            "per split than the lanes sharing it), so it gets less than its "
            "weight and this plan overstates it: give it at least as many "
            "files as lanes"
        )
    if size.skipped_in_sample:
        out.append(
            f"source {src.name!r}: {size.skipped_in_sample} bad input(s) in inspect's "
            f"sample, skipped (on_error: skip) and left out of its size; the first: "
            f"{size.first_skipped}"
        )
    return out


def measure(recipe: Recipe) -> dict[str, SourceSize]:
    """Per-source sizes from `mixer inspect`'s listing and sampled estimates."""
    from mixer.tools.inspect_report import inspect_recipe

    rows = inspect_recipe(recipe)["sources"]
    return {
        row["name"]: SourceSize(
            tokens=float(row["est_tokens"]),
            bytes=row["bytes"],
            documents=float(row["est_documents"]),
            splits=row["splits"],
            read_amplification=row["read_amplification"],
            compressed_split_bytes=row["worst_resume_bytes"],
            lanes_without_documents=row["lanes_without_documents"],
            skipped_in_sample=row["skipped_in_sample"],
            first_skipped=row["first_skipped"],
        )
        for row in rows
    }
