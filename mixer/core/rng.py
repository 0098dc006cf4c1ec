"""Counter-based randomness that never changes between versions or processes.

Every random choice in mixer is a pure function of a key derived from names and integers
(recipe seed, stage, source name, lane, epoch, window) and a counter. Nothing depends on
`PYTHONHASHSEED`, global random state or a library's RNG stream.
"""

from __future__ import annotations

import hashlib

_MASK64 = (1 << 64) - 1


def derive_key(*parts: int | str) -> int:
    """A 64-bit key from an ordered tuple of ints and strings (stable across processes)."""
    text = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def splitmix64(x: int) -> int:
    """One SplitMix64 output for counter `x` (a bijective 64-bit mix)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def permutation(n: int, key: int) -> list[int]:
    """A Fisher–Yates permutation of range(n) drawn from the counter stream of `key`."""
    order = list(range(n))
    counter = key
    for i in range(n - 1, 0, -1):
        bound = i + 1
        # Rejection sampling keeps the draw exactly uniform.
        limit = _MASK64 - (_MASK64 + 1) % bound
        while True:
            counter = (counter + 1) & _MASK64
            r = splitmix64(counter)
            if r <= limit:
                break
        j = r % bound
        order[i], order[j] = order[j], order[i]
    return order
