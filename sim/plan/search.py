"""The two searches of the capacity planner, free of any simulation.

Both assume a monotone predicate and call it as few times as they can; the planner memoises
the predicate, so every point is simulated once.

- :func:`fewest_passing`: the smallest integer ``n`` in ``1..limit`` with ``ok(n)``, assuming
  ``ok`` never turns false as ``n`` grows (more replicas never hurt). Exponential search up
  (1, 2, 4, ...) to the first passing ``n``, then bisection between it and the last failing one.
  A ``guess`` (an estimate from above, such as the load over one replica's sustainable rate)
  takes the place of the first power of two beyond it: 1, 2, 4, 7 for a guess of 7, so a good
  guess spares the larger (and slower to simulate) counts above it.
- :func:`largest_passing`: the largest ``x > 0`` with ``ok(x)``, assuming ``ok`` never turns
  true as ``x`` grows (a higher request rate never helps). From ``start`` it doubles (or halves)
  at most ``bracket_steps`` times to bracket the boundary, never past ``limit`` (the highest
  ``x`` that can be judged), then bisects the bracket geometrically a fixed ``iterations``
  times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


def fewest_passing(ok: Callable[[int], bool], limit: int, guess: int | None = None
                   ) -> int | None:
    """Smallest ``n`` in ``1..limit`` with ``ok(n)``, or ``None`` if ``ok(limit)`` fails.

    Whether or not ``ok`` is monotone, a returned ``n`` passed and ``n - 1`` failed (or
    ``n == 1``): the bisection ends with a failing and a passing neighbour.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    bad, n = 0, 1
    while not ok(n):
        if n >= limit:
            return None
        up = guess if guess is not None and n < guess < 2 * n else 2 * n
        bad, n = n, min(up, limit)
    good = n
    while good - bad > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


@dataclass(frozen=True)
class Boundary:
    """Where ``ok`` flips: ``passing`` passed (``None``: nothing tried passed) and ``failing``
    failed (``None``: nothing tried failed, the boundary lies above ``passing``)."""

    passing: float | None
    failing: float | None


def largest_passing(ok: Callable[[float], bool], start: float, iterations: int = 8,
                    bracket_steps: int = 10, limit: float = math.inf) -> Boundary:
    """The largest passing ``x`` up to ``limit``, to a ratio of ``2 ** (2 ** -iterations)``
    of the truth (``failing`` None: ``passing`` is ``limit``, or the most the bracket tried)."""
    if not 0 < start <= limit:
        raise ValueError(f"need 0 < start <= limit, got {start} and {limit}")
    lo, hi = _bracket(ok, start, bracket_steps, limit)
    if lo is None or hi is None:
        return Boundary(lo, hi)
    for _ in range(iterations):
        mid = math.sqrt(lo * hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return Boundary(lo, hi)


def _bracket(ok: Callable[[float], bool], start: float, steps: int, limit: float):
    """(passing, failing) neighbours at most a factor of two apart, either ``None`` when not
    found (``limit`` passing: no failing one)."""
    if ok(start):
        lo = start
        for _ in range(steps):
            if lo >= limit:
                break
            up = min(2 * lo, limit)
            if not ok(up):
                return lo, up
            lo = up
        return lo, None
    hi = start
    for _ in range(steps):
        if ok(hi / 2):
            return hi / 2, hi
        hi /= 2
    return None, hi
