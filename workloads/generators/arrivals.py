"""Arrival processes: Poisson, Gamma with a chosen burstiness, or a real trace's timestamps.

Every process yields arrival times in seconds starting at 0 (the first arrival), as an endless
iterator, so a generator can draw as many as it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import numpy as np

from kvsim.errors import ConfigError

KINDS = ("poisson", "gamma", "trace")
_CHUNK = 1024


@dataclass(frozen=True)
class Arrivals:
    """An arrival process.

    - ``poisson``: exponential gaps with mean ``1 / rate`` (CV 1);
    - ``gamma``: Gamma gaps with mean ``1 / rate`` and coefficient of variation ``cv``
      (shape ``1 / cv**2``): ``cv > 1`` is burstier than Poisson, ``cv < 1`` more regular;
    - ``trace``: the arrival times of the trace at ``path`` (relative to its first request;
      ``rate`` is ignored). When more arrivals are needed than the trace has, its gaps repeat.
    """

    kind: str = "poisson"
    rate: float = 1.0
    cv: float = 1.0
    path: str | None = None

    def checked(self) -> "Arrivals":
        if self.kind not in KINDS:
            raise ConfigError(f"unknown arrival process {self.kind!r}; expected one of "
                              f"{', '.join(KINDS)}", field="arrival")
        if self.kind == "trace" and not self.path:
            raise ConfigError("trace arrivals need a trace path", field="arrival_trace")
        if self.kind != "trace" and not (self.rate > 0 and np.isfinite(self.rate)):
            raise ConfigError(f"must be a finite number > 0, got {self.rate}", field="rate")
        if self.kind == "gamma" and not (self.cv > 0 and np.isfinite(self.cv)):
            raise ConfigError(f"must be a finite number > 0, got {self.cv}", field="cv")
        return self

    def times(self, rng: np.random.Generator) -> Iterator[float]:
        """Endless arrival times in seconds, the first at 0, non-decreasing."""
        self.checked()
        t = 0.0
        gaps = self._gaps(rng)
        while True:
            yield t
            t += next(gaps)

    def _gaps(self, rng: np.random.Generator) -> Iterator[float]:
        while True:
            if self.kind == "trace":
                chunk = trace_gaps(self.path)
            elif self.kind == "gamma":
                shape = 1.0 / self.cv ** 2
                chunk = rng.gamma(shape, 1.0 / (self.rate * shape), size=_CHUNK)
            else:
                chunk = rng.exponential(1.0 / self.rate, size=_CHUNK)
            yield from chunk.tolist()


@lru_cache(maxsize=4)
def trace_gaps(path: str) -> np.ndarray:
    """Inter-arrival gaps of a trace, with one mean gap appended to close the cycle."""
    from kvsim.workloads.loader import load_trace
    from kvsim.workloads.sources import resolve_trace
    times = np.fromiter((r.arrival_s for r in load_trace(resolve_trace(path)[0])),
                        dtype=np.float64)
    gaps = np.diff(times)
    closing = gaps.mean() if len(gaps) else 1.0
    return np.append(gaps, closing)


def first(times: Iterator[float], n: int) -> np.ndarray:
    """The next ``n`` times of an arrival iterator as an array."""
    return np.fromiter((next(times) for _ in range(n)), dtype=np.float64, count=n)
