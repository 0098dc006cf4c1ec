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

TARGET_SCALE = 1000  # targets are whole milli-tokens: exact integers in the state


def shares(weights: list[float], active: list[bool]) -> list[float] | None:
    """Each source's part of a drawn row: its weight over the active sources' total (0 for
    an inactive source), or None when no active source weighs anything. A lane computes
    them once per batch (and again when a source runs out or is blocked)."""
    total_weight = sum(w for w, a in zip(weights, active) if a)
    if total_weight <= 0:
        return None
    return [
        weight / total_weight if is_active else 0.0 for weight, is_active in zip(weights, active)
    ]


def choose_by_share(
    parts: list[float], counters: list[int], targets: list[int], row_tokens: int
) -> int | None:
    """Index of the source with a positive part and the largest deficit after one more row
    of `row_tokens`, or None when there is none. `targets` are in milli-tokens."""
    best, best_deficit = None, 0.0
    for i, part in enumerate(parts):
        if part <= 0:
            continue
        deficit = targets[i] / TARGET_SCALE + part * row_tokens - counters[i]
        if best is None or deficit > best_deficit:
            best, best_deficit = i, deficit
    return best


def grow_by_share(targets: list[int], parts: list[float], tokens: int) -> None:
    """Add a drawn row's `tokens` to the targets, shared by `parts` (whole milli-tokens, so
    a saved state holds them exactly and compactly)."""
    for i, part in enumerate(parts):
        if part > 0:
            targets[i] += round(part * tokens * TARGET_SCALE)
