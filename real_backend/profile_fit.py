"""Fitting the cost model's *fitted* form to profiled step times (see :mod:`.profiling`).

A step with ``tokens`` new tokens over ``seqs`` requests, ``kv`` KV tokens read (``sum c + q``)
and ``units`` attention units (``sum q * (2c + q + 1)``) takes::

    step_s + per_batch_s[seqs] + per_seq_s * seqs + per_token_s * tokens
           + per_kv_token_s * kv + per_attn_unit_s * units

and a copy of ``n`` blocks ``copy_call_s + n * block_bytes * (host|device)_copy_s_per_byte``.
The functions take grid points (anything with ``group``, ``batch``, ``copy`` and
``features()``, see :class:`.profiling.Point`) and their measured seconds.
"""

from __future__ import annotations

import itertools
import statistics

import numpy as np

from kvsim.cache.step_plan import COMPACT, SWAP_OUT
from kvsim.sim.perf import cost_model

COMPUTE_TERMS = ("step_s", "per_seq_s", "per_token_s", "per_kv_token_s", "per_attn_unit_s")
GROUPS = ("prefill", "decode", "mixed", "transfer")

def nnls_small(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few columns, exactly: the optimum is the unconstrained
    least-squares solution on some subset of the columns, so try every subset and keep the
    best one whose coefficients are all >= 0 (2^5 subsets for the compute fit)."""
    n = a.shape[1]
    best, best_res = np.zeros(n), float(np.sum(b * b))
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            sol = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
            if (sol < 0).any():
                continue
            res = float(np.sum((a[:, cols] @ sol - b) ** 2))
            if res < best_res:
                best, best_res = np.zeros(n), res
                best[list(cols)] = sol
    return best


def batch_time(seqs: int, table, slope: float = 0.0) -> float:
    """``per_batch_s`` at ``seqs`` requests, as the cost model reads it (0 without a table)."""
    return float(cost_model.batch_time(table, slope, seqs)) if table else 0.0


#: A compute point whose relative fit error exceeds this many times the median (and
#: :data:`OUTLIER_FLOOR`) is left out of the refit: the linear form cannot follow it.
OUTLIER_FACTOR, OUTLIER_FLOOR = 4.0, 0.2


def fit_compute(points: list, times: list[float], table=(),
                slope: float = 0.0) -> dict[str, float]:
    """The five compute coefficients from every non-copy point, fitted to the measured time
    less ``per_batch_s``; fitted twice, the second time without the points the first fit misses
    by more than ``OUTLIER_FACTOR`` times its median error and ``OUTLIER_FLOOR`` (on a CPU
    before decode groups were capped, see ``real_backend.model_runner``: decode batches whose
    gathered KV outgrew the caches, where the time per KV token jumped)."""
    rows = [(p.features(), t, batch_time(len(p.batch), table, slope))
            for p, t in zip(points, times) if p.copy is None]
    x = np.array([r[0] for r in rows])
    y = np.array([r[1] for r in rows])
    base = np.array([r[2] for r in rows])
    keep = np.ones(len(rows), dtype=bool)
    for _ in range(2):
        coef = _fit_rest(x[keep], y[keep], base[keep])
        err = np.abs(x @ coef + base - y) / y
        limit = max(OUTLIER_FACTOR * float(np.median(err)), OUTLIER_FLOOR)
        if (err <= limit).all() or (err <= limit).sum() < x.shape[1]:
            break
        keep = err <= limit
    return dict(zip(COMPUTE_TERMS, coef.tolist()))


def _fit_rest(x: np.ndarray, y: np.ndarray, base: np.ndarray | None = None) -> np.ndarray:
    """Non-negative coefficients of ``x`` for ``y - base`` (``y`` without a base), errors
    relative to ``y``."""
    weights = 1.0 / y
    target = np.ones_like(y) if base is None else (y - base) * weights
    return nnls_small(x * weights[:, None], target)


#: Rounds of :func:`backfit_table` (the table and the linear terms fitted in turn).
BACKFIT_ROUNDS = 3


def backfit_table(points: list, times: list[float], coef: dict[str, float],
                  table: list[float], slope: float) -> list[float]:
    """``per_batch_s`` corrected by the decode points: entry ``n - 1`` moves by the median of
    what the model misses on the decode steps of ``n`` requests (held at >= 0).

    The table starts as the LM head timed alone; inside a whole step the head (and the other
    GEMMs of ``n`` rows) can run at another speed (other cache state, another kernel), so the
    decode steps themselves say what an ``n``-request step costs beyond the linear terms.
    Alternating this with the linear fit is backfitting an additive model: ``per_batch_s``
    becomes a free per-batch-size intercept wherever the grid has decode steps of that size,
    and stays the measured head time elsewhere."""
    coef = dict(coef, per_batch_s=table, per_batch_slope_s=slope)
    misses: dict[int, list[float]] = {}
    for p, t in zip(points, times):
        if p.group == "decode" and len(p.batch) <= len(table):
            misses.setdefault(len(p.batch), []).append(t - predict(p, coef, 0))
    out = list(table)
    for n, miss in misses.items():
        out[n - 1] = max(out[n - 1] + statistics.median(miss), 0.0)
    return out


def fit_copies(points: list, times: list[float], block_bytes: int) -> dict[str, float]:
    """``copy_call_s`` and seconds per byte host<->device and device->device."""
    out: dict[str, float] = {}
    calls = []
    for kind, key in ((SWAP_OUT, "host_copy_s_per_byte"), (COMPACT, "device_copy_s_per_byte")):
        rows = [(p.features(), t) for p, t in zip(points, times) if p.copy and p.copy[0] == kind]
        if not rows:
            out[key] = 0.0
            continue
        call_s, per_block = _fit_rest(np.array([r[0] for r in rows]),
                                      np.array([r[1] for r in rows]))
        out[key] = per_block / block_bytes
        calls.append(call_s)
    out["copy_call_s"] = float(np.mean(calls)) if calls else 0.0
    return out


def predict(point, coef: dict, block_bytes: int) -> float:
    """The fitted time of one grid point."""
    if point.copy is not None:
        kind, n = point.copy
        per_byte = coef["device_copy_s_per_byte" if kind == COMPACT else "host_copy_s_per_byte"]
        return coef["copy_call_s"] + n * block_bytes * per_byte
    return (float(np.dot(point.features(), [coef[k] for k in COMPUTE_TERMS]))
            + batch_time(len(point.batch), coef.get("per_batch_s", ()),
                         coef.get("per_batch_slope_s", 0.0)))


def fit_errors(points: list, times: list[float], coef: dict[str, float],
               block_bytes: int) -> dict[str, dict[str, float]]:
    """Per group: points, median and max absolute relative error of the fit."""
    out = {}
    for group in GROUPS:
        errs = [abs(predict(p, coef, block_bytes) - t) / t
                for p, t in zip(points, times) if p.group == group]
        if errs:
            out[group] = {"points": len(errs), "median_abs_rel_error": statistics.median(errs),
                          "max_abs_rel_error": max(errs)}
    return out


def batch_slope(table: list[float]) -> float:
    """Seconds per request beyond the table: the least-squares slope over its upper half
    (held at >= 0)."""
    if len(table) < 2:
        return 0.0
    half = table[len(table) // 2:] if len(table) >= 4 else table
    n = np.arange(len(table) - len(half) + 1, len(table) + 1, dtype=float)
    return max(float(np.polyfit(n, half, 1)[0]), 0.0)


def fit_profile(points: list, times: list[float], block_bytes: int,
                batch_table=None) -> dict:
    """Every coefficient of a fitted profile (``kvsim.sim.perf.profile.FITTED_TERMS``), and
    ``per_batch_s``/``per_batch_slope_s`` when a ``batch_table`` (seconds for 1, 2, ...
    requests; see :func:`measure_batch_table`) is given."""
    table = [float(v) for v in batch_table or ()]
    slope = batch_slope(table)
    fitted = fit_compute(points, times, table, slope)
    for _ in range(BACKFIT_ROUNDS if table else 0):
        table = backfit_table(points, times, fitted, table, slope)
        slope = batch_slope(table)
        fitted = fit_compute(points, times, table, slope)
    coef: dict = {k: float(v) for k, v in fitted.items()}
    coef.update({k: float(v) for k, v in fit_copies(points, times, block_bytes).items()})
    if table:
        coef.update(per_batch_s=table, per_batch_slope_s=slope)
    return coef
