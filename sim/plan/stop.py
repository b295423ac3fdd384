"""Stop a planner simulation as soon as it certainly misses an SLO target.

The planner asks one question of a simulation: does every request complete, and is every
SLO percentile at or below its target? The verdict is often certain long before the run ends:

- a percentile of ``n`` latencies is numpy's linear interpolation between the sorted values
  ``v[lo]`` and ``v[lo + 1]``, ``lo = floor((n - 1) * pct / 100)``, so it is at least ``v[lo]``;
  once :func:`late_allowance` ``(n, pct) = n - lo`` latencies are certainly above the target,
  ``v[lo]`` is, and the percentile is too;
- a request's TTFT (E2E) is certainly above the target once ``target`` seconds have passed
  since its arrival without its first (last) token: the token comes at ``now`` or later. A
  request whose token came is late when its latency, computed as the results frame computes
  it, is above the target. TPOT is known when a request finishes;
- a rejected request never completes: the run fails at once.

:class:`SloStop` keeps these counts from the request log's callbacks (arrival, first token,
finish, rejection): one pointer per deadline-based target walks the requests in arrival order as
simulated time passes, so each request is looked at once. ``stopped`` turns True with the
first certain miss; the runner checks it between events. A run that is not stopped is the very
same run (the watch only reads), so a verdict reached at the end is unchanged.

Early *passing* is not attempted: passing also needs every request completed, which is known
only once the last one arrived, and the p99 then needs all but 1 % of them finished under the
target: too little of the run is left to be worth a rule.

``n`` is the trace's request count. For TPOT only requests with two or more output tokens count,
at most ``n`` of them; as ``late_allowance`` never falls as ``n`` grows, using ``n`` is safe.
"""

from __future__ import annotations

import math

from kvsim.sim.plan.bounds import METRIC_NAMES, fmt_latency

#: The request-log column whose time ends each deadline-based latency.
DEADLINE_COLUMNS = {"ttft_s": "first_token_s", "e2e_s": "finish_s"}


def late_allowance(n: int, pct: float) -> int:
    """How many of ``n`` values above a target make ``numpy.percentile(values, pct)`` (linear
    interpolation) exceed it for certain: ``n - floor((n - 1) * pct / 100)``."""
    if n < 1:
        raise ValueError(f"need at least one value, got {n}")
    return n - math.floor((n - 1) * (pct / 100))


class _Target:
    """One SLO target's count of latencies certainly above it."""

    def __init__(self, key: str, metric: str, pct: float, target: float, n: int):
        self.key, self.metric, self.target = key, metric, target
        self.pct = pct
        self.allowance = late_allowance(n, pct)
        self.num_late = 0
        self.next_row = 0          # deadline targets: rows before it are decided

    @property
    def missed(self) -> bool:
        return self.num_late >= self.allowance

    def describe(self, n: int, now: float) -> str:
        name = METRIC_NAMES[self.metric.removesuffix("_s")]
        return (f"{name} p{self.pct:g} above {fmt_latency(self.target)} for certain at "
                f"t={now:.1f} s: {self.num_late} of {n:,} requests late (p{self.pct:g} is "
                f"above the target from {self.allowance})")


class SloStop:
    """A request log's watch (:class:`~kvsim.sim.serving.recorder.RequestLog` ``watch``) that sets
    ``stopped`` once the run certainly misses a target of ``targets``
    ``[(key, metric, pct, seconds)]`` over ``num_requests`` requests; ``reason`` says which."""

    def __init__(self, targets, num_requests: int):
        self.num_requests = num_requests
        self.stopped = False
        self.reason: str | None = None
        all_targets = [_Target(k, m, p, t, num_requests) for k, m, p, t in targets]
        self._deadline = [t for t in all_targets if t.metric in DEADLINE_COLUMNS]
        self._tpot = [t for t in all_targets if t.metric == "tpot_s"]

    # --- the request log's callbacks --------------------------------------------------------

    def on_arrival(self, log, row: int) -> None:
        self._pass_deadlines(log, log.columns["arrival_s"][row])

    def on_first_token(self, log, row: int, now: float) -> None:
        self._pass_deadlines(log, now)

    def on_finish(self, log, row: int, now: float) -> None:
        self._pass_deadlines(log, now)
        if self._tpot:
            self._count_tpot(log, row, now)

    def on_rejected(self, log, row: int) -> None:
        self._stop("a request was rejected, so not every request completes")

    # --- counting --------------------------------------------------------------------------

    def _pass_deadlines(self, log, now: float) -> None:
        """Decide every request whose deadline (arrival + target) lies before ``now``."""
        arrival, n = log.columns["arrival_s"], len(log)
        for t in self._deadline:
            done, row = log.columns[DEADLINE_COLUMNS[t.metric]], t.next_row
            while row < n and now - arrival[row] > t.target:
                if not done[row] - arrival[row] <= t.target:     # NaN: not yet, so late
                    t.num_late += 1
                row += 1
            t.next_row = row
            if t.missed:
                self._stop(t.describe(self.num_requests, now))

    def _count_tpot(self, log, row: int, now: float) -> None:
        c = log.columns
        generated = c["generated_tokens"][row]
        if generated < 2:
            return
        tpot = (c["finish_s"][row] - c["first_token_s"][row]) / (generated - 1)
        for t in self._tpot:
            if tpot > t.target:
                t.num_late += 1
                if t.missed:
                    self._stop(t.describe(self.num_requests, now))

    def _stop(self, reason: str) -> None:
        if not self.stopped:
            self.stopped, self.reason = True, reason
