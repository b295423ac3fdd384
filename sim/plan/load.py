"""The load a plan is made for: the trace's own request rate, the rate scale that gives the
planned rate, and whether the trace lasts long enough to judge that rate as a sustained one.

A trace stands for a sustained rate only over enough arrivals. Arrivals spanning ``S``
seconds at ``r`` times the rate a deployment can serve take it about ``r * S`` to serve, so
the request arriving at a share ``q`` of the span waits about ``(r - 1) * q * S`` longer than
it would alone: a target ``pNN <= T`` on TTFT or E2E (``q`` about ``NN / 100``) shows an
overload ``r`` once that exceeds ``T``. Over a span of :data:`SUSTAINED_SPANS` times
``T / q`` every overload above ``1 / SUSTAINED_SPANS`` (10 %) shows; over a shorter one, a
burst that ends in time passes though no deployment could keep its rate up. TPOT targets do
not grow with a queue and set no span.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

from kvsim.errors import ConfigError
from kvsim.workloads import TraceOptions, load_trace

SUSTAINED_SPANS = 10
#: How a planner text says that arrivals are over too soon (:func:`needed_span`).
TOO_SHORT = (f"too short for a {100 // SUSTAINED_SPANS}% overload to show against the "
             "TTFT/E2E targets")


def resolve_load(path: str, opts: TraceOptions, target_rate: float | None,
                 left_out: Counter | None = None, prompt_limit: int | None = None
                 ) -> tuple[TraceOptions, float | None, int, int, int]:
    """(options at the planned rate scale, native mean rate, request count, requests that
    generate more than one token: those a TPOT is measured on, prompts of ``prompt_limit``
    tokens or more).

    Reads the trace once at rate scale 1 (validating every kept line; ``left_out`` counts
    the rows holding no request). ``target_rate`` (requests/s), when given, replaces
    ``opts.rate_scale`` by ``target_rate / native rate``.
    """
    count, span, decoding, too_long = 0, 0.0, 0, 0
    limit = prompt_limit or math.inf
    for request in load_trace(path, replace(opts, rate_scale=1.0), left_out):
        count, span = count + 1, request.arrival_s
        decoding += request.output_tokens > 1
        too_long += request.prompt_tokens >= limit
    native = count / span if span > 0 else None
    if target_rate is None:
        return opts.checked(), native, count, decoding, too_long
    if not (math.isfinite(target_rate) and target_rate > 0):
        raise ConfigError(f"must be a request rate > 0, got {target_rate}", field="target_rate")
    if native is None:
        raise ConfigError("the trace spans no time, so it has no rate to scale to "
                          "--target-rate", location=str(path))
    return (replace(opts, rate_scale=target_rate / native).checked(), native, count, decoding,
            too_long)


def needed_span(targets) -> tuple[float, str] | None:
    """Seconds of arrivals that judging ``targets`` (``[(key, metric, pct, seconds)]``) as
    a sustained load needs, and the target that needs most; None without a TTFT/E2E one."""
    spans = [(SUSTAINED_SPANS * t * 100 / pct, f"{metric[:-2].upper()} p{pct:g} <= {t:g} s")
             for _, metric, pct, t in targets if metric != "tpot_s"]
    return max(spans) if spans else None


def judged_scale(native_rate_per_s: float | None, num_requests: int, targets) -> float:
    """The highest rate scale at which a trace of ``num_requests`` at that native rate lasts
    :func:`needed_span` (``inf`` without a TTFT/E2E target or a rate)."""
    needed = needed_span(targets)
    if needed is None or not native_rate_per_s:
        return math.inf
    return (num_requests / native_rate_per_s) / needed[0]


def check_sustained(opts: TraceOptions, native_rate_per_s: float | None, num_requests: int,
                    targets, where: str, by_target_rate: bool) -> None:
    """Refuse a planned load (``opts.rate_scale``; ``by_target_rate``: set by a target rate)
    whose arrivals are over too soon to judge it as sustained, saying what would do."""
    cap = judged_scale(native_rate_per_s, num_requests, targets)
    if opts.rate_scale <= cap * (1 + 1e-9):     # (the cap itself, through rounding)
        return
    seconds, target = needed_span(targets)
    rate = native_rate_per_s * opts.rate_scale
    more = (" (raise --limit / limit=, or a longer trace)" if opts.limit == num_requests
            else " (a longer trace)")
    field = ("target_rate" if by_target_rate else "rate_scale" if opts.rate_scale != 1
             else "trace")
    raise ConfigError(
        f"at {_rate(rate)} req/s (rate scale {opts.rate_scale:.4g}) the trace's "
        f"{num_requests:,} requests arrive within {num_requests / rate:.3g} s, {TOO_SHORT} "
        f"(a burst that ends in time passes): judging {target} as a sustained load needs "
        f"{seconds:.3g} s of arrivals. Give at least "
        f"{math.ceil(seconds * rate):,} requests{more}, plan for at most "
        f"{_rate(_down(native_rate_per_s * cap))} req/s (rate scale {_down(cap):g}), or plan "
        "these arrivals as one burst (--burst; burst=True in Python)",
        location=where, field=field)


def _down(x: float, digits: int = 3) -> float:
    """``x`` rounded down to ``digits`` significant digits (a bound that holds as shown)."""
    step = 10 ** (math.floor(math.log10(x)) - digits + 1)
    return math.floor(x / step) * step


def _rate(x: float) -> str:
    """A request rate as ``--target-rate`` takes it: ``2000``, ``42.9``, ``0.123``."""
    return f"{x:.0f}" if x >= 1000 else f"{x:.3g}"
