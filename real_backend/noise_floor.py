"""The noise floor of a validation, and each error judged against it.

The *noise floor* is how much the real backend disagrees with itself on the very same steps:
the real run's step plans (snapshotted as they ran, block tables included) are replayed through
a second :class:`~.executor.TorchExecutor` on the same runner, in the same order, each after
the engine-like host work of :func:`~.executor.interlude`, and the two measured durations of
every step are compared. No prediction can match one real run better than another real run
does, so an error at or below the floor says nothing about the cost model except that it is as
good as this host lets anyone tell.

:func:`judge` gives each error one verdict: ``within noise floor`` when the error is at most
the floor (neither a pass nor a fail), else ``pass`` or ``fail`` against the target.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from kvsim.cache.step_plan import BlockTransfer, ScheduledRequest, StepPlan

#: The validation targets (offline replays, CPU or GPU): median per-step error and error of
#: output throughput, sim vs real.
TARGETS = {"step_median": 0.05, "throughput": 0.05}
WITHIN, PASS, FAIL, UNJUDGED = "within noise floor", "pass", "fail", "not judged"


def snapshot(plan: StepPlan) -> StepPlan:
    """A copy of ``plan`` that stays valid after the step: the scheduler's live block tables
    become a frozen dict."""
    tables = {s.request_id: list(plan.block_table(s.request_id)) for s in plan.scheduled}
    return dataclasses.replace(
        plan, scheduled=[ScheduledRequest(s.request_id, s.num_new_tokens, s.num_computed_tokens)
                         for s in plan.scheduled],
        transfers=[BlockTransfer(t.kind, list(t.pairs)) for t in plan.transfers],
        preempted=list(plan.preempted), admitted=list(plan.admitted),
        block_table=tables.__getitem__)


def replay(executor, plans: list[StepPlan],
           between: Callable[[], object] | None = None) -> list[float]:
    """Measured seconds of every plan, run in order through ``executor`` (a fresh
    :class:`~.executor.TorchExecutor` over the same requests), ``between`` before each (by
    default the engine-like host work of :func:`~.torch_executor.interlude`). This module
    imports no torch: the verdicts are read where torch is not needed."""
    if between is None:
        from kvsim.real_backend.torch_executor import interlude
        between = interlude
    out = []
    for plan in plans:
        between()
        out.append(executor.step_duration(plan))
    return out


def floor(first: list[float], second: list[float], duration_s: float) -> dict:
    """How much two measurements of the same steps differ: per step (median and p90 of
    ``|second / first - 1|``), in total busy time, and in output throughput (the first run's
    duration with its busy time replaced by the second's; idle gaps kept)."""
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    timed = a > 0
    step = np.abs(b[timed] - a[timed]) / a[timed]
    busy_a, busy_b = float(a.sum()), float(b.sum())
    duration_b = duration_s - busy_a + busy_b
    return {"steps": int(timed.sum()),
            "step_median_abs_rel_diff": float(np.median(step)) if step.size else None,
            "step_p90_abs_rel_diff": float(np.percentile(step, 90)) if step.size else None,
            "total_time_rel_diff": abs(busy_b - busy_a) / busy_a if busy_a else None,
            "total_time_signed_rel_diff": (busy_b - busy_a) / busy_a if busy_a else None,
            "throughput_rel_diff": abs(duration_s / duration_b - 1) if duration_b else None}


def judge(error: float | None, noise: float | None, target: float) -> dict:
    """One error against the noise floor and the target."""
    if error is None or noise is None:
        verdict = UNJUDGED
    elif error <= noise:
        verdict = WITHIN
    else:
        verdict = PASS if error <= target else FAIL
    ratio = error / noise if error is not None and noise else None
    return {"error": error, "noise_floor": noise, "target": target, "times_floor": ratio,
            "verdict": verdict, "floor_above_target": bool(noise is not None and noise > target)}


def verdicts(report: dict) -> dict:
    """The step-median and throughput verdicts of a validation report (with ``noise_floor``;
    without one, both are ``not judged``)."""
    nf = report.get("noise_floor") or {}
    step = report["step_duration"]["all"]["median_abs_rel_error"]
    thr = report["metrics"]["throughput_output_tokens_per_s"]["rel_error"]
    return {"step_median": judge(step, nf.get("step_median_abs_rel_diff"),
                                 TARGETS["step_median"]),
            "throughput": judge(thr, nf.get("throughput_rel_diff"), TARGETS["throughput"])}


def speed_refit(measured: list[float], predicted: list[float], fraction: float = 0.1) -> dict:
    """How much of the error is one speed offset between the profile and the run: the ratio
    of measured to predicted busy time over the run's first ``fraction`` of timed steps
    (``factor``), applied to the predictions of the remaining steps, and their errors before
    (``*_before``) and after (``*_after``): median per-step and total busy time. An error that
    drops to the noise floor after it was the host's speed, not the cost model's shape."""
    m, p = np.asarray(measured, dtype=float), np.asarray(predicted, dtype=float)
    timed = m > 0
    m, p = m[timed], p[timed]
    first = max(int(len(m) * fraction), 1)
    if len(m) <= first or p[:first].sum() <= 0:
        return {"first_steps": first, "factor": None}
    factor = float(m[:first].sum() / p[:first].sum())
    rest_m, rest_p = m[first:], p[first:]
    return {"first_steps": first, "factor": factor,
            "step_median_before": float(np.median(np.abs(rest_p / rest_m - 1))),
            "step_median_after": float(np.median(np.abs(factor * rest_p / rest_m - 1))),
            "busy_time_before": float(rest_p.sum() / rest_m.sum() - 1),
            "busy_time_after": float(factor * rest_p.sum() / rest_m.sum() - 1)}
