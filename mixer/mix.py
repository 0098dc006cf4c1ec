"""The deficit rule that decides which source supplies a lane's next sequence.

Each source's token counter is compared with its weight's share of all tokens drawn so far;
the source lagging most supplies the next row (the rule Megatron uses for its blending
index). There is no randomness; the state is the counters. Sources that ran out are dropped and
the weights of the others renormalize.
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


def phase_counters(weights: list[float], rows: int, row_tokens: int) -> list[int]:
    """Counters after `rows` virtual rows: a lane-specific phase so lanes err differently."""
    counters = [0] * len(weights)
    active = [True] * len(weights)
    for _ in range(rows):
        i = choose_source(weights, counters, active, row_tokens)
        counters[i] += row_tokens
    return counters
