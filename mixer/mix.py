"""The deficit rule that decides which source supplies a lane's next sequence.

Each source's token counter is compared with its weight's share of all tokens drawn so far;
the source lagging most supplies the next row (the rule Megatron uses for its blending
index). There is no randomness; the state is the counters. Sources that ran out are dropped and
the weights of the others renormalize.

Every lane runs the same schedule from zero. The greedy rule keeps each source within one row
of its exact share at every prefix, so a rank (whose lanes then err alike) is within
1 / (25 · batch_size) of the weights once it holds 25 batches per lane: under one point for
batch_size ≥ 4. Offsetting the lanes' phases (as DESIGN.md suggests) helps ranks with many
lanes but doubles the worst case of a rank with one lane, so it is not done.
"""

from __future__ import annotations


def choose_source(weights: list[float], counters: list[int], active: list[bool],
                  row_tokens: int) -> int | None:
    """Index of the active source with the largest deficit after one more row, or None."""
    total_weight = sum(w for w, a in zip(weights, active) if a)
    if total_weight <= 0:
        return None
    drawn = sum(c for c, a in zip(counters, active) if a) + row_tokens
    best, best_deficit = None, 0.0
    for i, (weight, count, is_active) in enumerate(zip(weights, counters, active)):
        if not is_active:
            continue
        deficit = weight / total_weight * drawn - count
        if best is None or deficit > best_deficit:
            best, best_deficit = i, deficit
    return best
