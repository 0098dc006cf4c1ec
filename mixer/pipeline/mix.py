"""The deficit rule that decides which source supplies a lane's next sequence.

Each source has a target: its weight's share of every token drawn in the current regime (a
fixed mix, a step of a schedule, a `set_weights` call; see schedule.py), accumulated row by
row with the weights in force for that row. The source lagging most behind its target after
one more row supplies it (with fixed weights this is the rule Megatron uses for its blending
index). There is no randomness; the state is the counters. Sources that ran out, and sources
whose weight is 0, draw nothing; the weights of the others renormalize.

Every lane runs the same rule from zero. The greedy rule keeps each source within about one
row of its target at every prefix, so a rank (whose lanes then err alike) is within about
1 / (25 · batch_size) of the weights once it holds 25 batches per lane: under one point for
batch_size ≥ 4 with up to four sources, ≥ 8 with more (five sources at batch_size 4 measured
up to 1.08 points: tests/test_mix.py). Under a linear schedule the targets follow the moving
weights, so the share over any stretch is within the same bound of the mean target weight
over it. Offsetting the lanes' phases (as DESIGN.md suggests) helps ranks with many lanes but
doubles the worst case of a rank with one lane, so it is not done.
"""

from __future__ import annotations

TARGET_SCALE = 1000   # targets are whole milli-tokens: exact integers in the state


def choose_source(weights: list[float], counters: list[int], targets: list[int],
                  active: list[bool], row_tokens: int) -> int | None:
    """Index of the active, positively weighted source with the largest deficit after one
    more row of `row_tokens`, or None when there is none. `targets` are in milli-tokens."""
    total_weight = sum(w for w, a in zip(weights, active) if a)
    if total_weight <= 0:
        return None
    best, best_deficit = None, 0.0
    for i, (weight, count, target, is_active) in enumerate(
            zip(weights, counters, targets, active)):
        if not is_active or weight <= 0:
            continue
        deficit = target / TARGET_SCALE + weight / total_weight * row_tokens - count
        if best is None or deficit > best_deficit:
            best, best_deficit = i, deficit
    return best


def grow_targets(targets: list[int], weights: list[float], active: list[bool],
                 tokens: int) -> None:
    """Add a drawn row's `tokens` to the active sources' targets, shared by weight (whole
    milli-tokens, so a saved state holds them exactly and compactly)."""
    total_weight = sum(w for w, a in zip(weights, active) if a)
    if total_weight <= 0:
        return
    for i, (weight, is_active) in enumerate(zip(weights, active)):
        if is_active:
            targets[i] += round(weight / total_weight * tokens * TARGET_SCALE)
