"""Length distributions: fixed, uniform, lognormal, or resampled from a real trace.

A :class:`Lengths` draws integer token counts with a numpy ``Generator``; its text form (used by
``kvsim gen --input-len / --output-len``) is one of::

    fixed:N              always N
    uniform:LO:HI        integers LO..HI inclusive, equally likely
    lognormal:MEAN:SIGMA lognormal with this mean and log-space sigma, rounded, clipped to
                         1..1,000,000
    trace:PATH           resampled (with replacement) from a trace's prompt or output lengths
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from kvsim.errors import ConfigError
from kvsim.workloads.fields import MAX_TOKENS

KINDS = ("fixed", "uniform", "lognormal", "trace")


@dataclass(frozen=True)
class Lengths:
    """A distribution of token counts, always clipped to ``[low, high]``.

    ``kind`` is one of :data:`KINDS`. ``fixed`` uses ``value``; ``uniform`` draws from
    ``low..high``; ``lognormal`` has mean ``mean`` and log-space std ``sigma`` (median
    ``mean * exp(-sigma**2 / 2)``); ``trace`` resamples the ``field`` (``"prompt"`` or
    ``"output"``) lengths of the trace at ``path``.
    """

    kind: str
    value: int = 0
    mean: float = 0.0
    sigma: float = 1.0
    low: int = 1
    high: int = 1_000_000
    path: str | None = None
    field: str = "prompt"

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` token counts as ``numpy.int64``."""
        if self.kind == "fixed":
            raw = np.full(n, self.value, dtype=np.float64)
        elif self.kind == "uniform":
            raw = rng.integers(self.low, self.high, size=n, endpoint=True).astype(np.float64)
        elif self.kind == "lognormal":
            mu = math.log(self.mean) - self.sigma ** 2 / 2
            raw = np.rint(rng.lognormal(mu, self.sigma, size=n))
        else:
            raw = rng.choice(trace_lengths(self.path, self.field), size=n).astype(np.float64)
        return np.clip(raw, self.low, self.high).astype(np.int64)

    def one(self, rng: np.random.Generator) -> int:
        """A single draw."""
        return int(self.sample(rng, 1)[0])


def fixed(value: int) -> Lengths:
    return Lengths("fixed", value=value, low=value, high=value)


def uniform(low: int, high: int) -> Lengths:
    return Lengths("uniform", low=low, high=high)


def lognormal(mean: float, sigma: float, low: int = 1, high: int = 1_000_000) -> Lengths:
    return Lengths("lognormal", mean=mean, sigma=sigma, low=low, high=high)


def resampled(path, field: str = "prompt") -> Lengths:
    return Lengths("trace", path=str(path), field=field)


@lru_cache(maxsize=8)
def trace_lengths(path: str, field: str) -> np.ndarray:
    """The prompt (``field="prompt"``) or output lengths of every request of a trace."""
    from kvsim.workloads.loader import load_trace
    from kvsim.workloads.sources import resolve_trace
    attr = "prompt_tokens" if field == "prompt" else "output_tokens"
    return np.fromiter((getattr(r, attr) for r in load_trace(resolve_trace(path)[0])),
                       dtype=np.int64)


def parse_lengths(text: str, field: str = "prompt") -> Lengths:
    """A :class:`Lengths` from its text form (see the module docstring)."""
    kind, _, rest = text.partition(":")
    args = rest.split(":") if rest else []
    try:
        return _build(kind.strip().lower(), args, rest, field)
    except ConfigError:
        raise
    except (ValueError, TypeError):
        raise ConfigError(f"cannot read length distribution {text!r}; expected fixed:N, "
                          "uniform:LO:HI, lognormal:MEAN:SIGMA or trace:PATH",
                          field=f"{field} lengths") from None


def _build(kind: str, args: list[str], rest: str, field: str) -> Lengths:
    if kind == "trace" and rest:
        return resampled(rest, field)
    if kind == "fixed" and len(args) == 1:
        return fixed(_count(args[0], field))
    if kind == "uniform" and len(args) == 2:
        low, high = _count(args[0], field), _count(args[1], field)
        if low > high:
            raise ConfigError(f"uniform:{low}:{high}: LO is above HI", field=f"{field} lengths")
        return uniform(low, high)
    if kind == "lognormal" and len(args) == 2 and float(args[1]) >= 0:
        mean = float(args[0])
        if not 0 < mean <= Lengths.high:
            raise ConfigError(f"lognormal mean {args[0]}: must be above 0 and at most "
                              f"{Lengths.high:,} tokens (draws are clipped to "
                              f"1..{Lengths.high:,})", field=f"{field} lengths")
        return lognormal(mean, float(args[1]))
    raise ValueError(kind)


def _count(text: str, field: str) -> int:
    """A length of the text form: a whole number of tokens that a trace may hold."""
    n = int(text)
    if not 1 <= n <= MAX_TOKENS:
        raise ConfigError(f"{n} tokens: a length must be from 1 to {MAX_TOKENS:,}",
                          field=f"{field} lengths")
    return n
