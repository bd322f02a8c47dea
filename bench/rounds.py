"""Intervals over alternating rounds: the rounds of two configurations ran side by side, so
rounds (not single calls) are what is resampled, and the same rounds for both."""

from __future__ import annotations

import random
from collections.abc import Callable


def interval(rounds: int, stat: Callable[[list[int]], float], n: int = 2000, seed: int = 1) -> tuple[float, float]:
    """95 % bootstrap interval of ``stat(picked round indices)``, rounds drawn with replacement.

    The calls of one round share a plugin process and a stretch of the machine's background,
    so they are not independent: resampling them singly gives a narrow interval to a difference
    the next run does not repeat. ``stat`` takes the same picks for both sides of a comparison."""
    rng = random.Random(seed)
    d = sorted(stat(rng.choices(range(rounds), k=rounds)) for _ in range(n))
    return d[int(0.025 * n)], d[int(0.975 * n)]
