"""Downsampling a timeline for drawing: runs of consecutive rows merged into at most
``max_points`` rows (counts summed, states averaged over time, rates recomputed)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from kvsim.reports.columns import Columns, as_columns, is_missing
from kvsim.reports.frames import TIMELINE_SUM_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_MAX_POINTS = 2000


def downsample(df: pd.DataFrame | Columns, max_points: int = DEFAULT_MAX_POINTS, *,
               sum_columns=TIMELINE_SUM_COLUMNS) -> pd.DataFrame | Columns:
    """Merge runs of consecutive rows so that at most ``max_points`` rows remain (a
    DataFrame stays one; :class:`Columns` too).

    Meant for timeline frames: ``time_s`` keeps each group's first value (other columns that
    are not numbers their first value present), ``sum_columns`` (event counts,
    ``interval_s``) are summed, other numeric columns are averaged weighted by ``interval_s``
    when present, and the rates ``throughput_tokens_per_s`` and ``prefix_hit_rate`` are
    recomputed from the summed counts. A frame already small enough is returned unchanged.
    """
    if max_points < 1:
        raise ValueError("max_points must be >= 1")
    n = len(df)
    if n <= max_points:
        return df
    table = as_columns(df)
    group_size = math.ceil(n / max_points)
    starts = np.arange(0, n, group_size)
    groups = np.arange(n) // group_size
    weights = (table["interval_s"].astype(float) if "interval_s" in table else np.ones(n))
    weights = np.where(np.isfinite(weights) & (weights > 0), weights, 0.0)
    out = {}
    for col in table.columns:
        values = table[col]
        if col == "time_s" or values.dtype.kind not in "iuf":
            out[col] = _firsts(values, starts)
        elif col in sum_columns:
            out[col] = _sums(values, starts)
        else:
            out[col] = _weighted_mean(values.astype(float), weights, groups)
    _recompute_rates(out)
    result = Columns(out)
    return result if isinstance(df, Columns) else result.to_pandas()


def _firsts(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Each group's first value that is not missing (NaN or None), else its first."""
    first = np.flatnonzero(~_missing(values))
    if not len(first):
        return values[starts]
    at = np.searchsorted(first, starts)       # the first present row from each start on
    found = first[np.minimum(at, len(first) - 1)]
    ends = np.append(starts[1:], len(values))
    return values[np.where((at < len(first)) & (found < ends), found, starts)]


def _missing(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind == "f":
        return np.isnan(values)
    if values.dtype.kind == "O":
        return np.array([is_missing(v) for v in values.tolist()], dtype=bool)
    return np.zeros(len(values), dtype=bool)


def _sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Each group's sum, NaN where it holds no number (integers stay integers)."""
    if values.dtype.kind != "f":
        return np.add.reduceat(values, starts)
    present = ~np.isnan(values)
    sums = np.add.reduceat(np.where(present, values, 0.0), starts)
    return np.where(np.add.reduceat(present, starts) > 0, sums, np.nan)


def _weighted_mean(values: np.ndarray, weights: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per-group weighted mean ignoring NaN values; groups with no weight fall back to mean."""
    ok = np.isfinite(values)
    w = np.where(ok, weights, 0.0)
    v = np.where(ok, values, 0.0)
    num = np.bincount(groups, weights=v * w)
    den = np.bincount(groups, weights=w)
    cnt = np.bincount(groups, weights=ok.astype(float))
    plain = np.bincount(groups, weights=v)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.where(cnt > 0, plain / cnt, np.nan))


def _recompute_rates(columns: dict) -> None:
    with np.errstate(invalid="ignore", divide="ignore"):
        if {"throughput_tokens_per_s", "output_tokens", "interval_s"} <= set(columns):
            iv = columns["interval_s"].astype(float)
            tok = columns["output_tokens"].astype(float)
            columns["throughput_tokens_per_s"] = np.where(iv > 0, tok / iv, np.nan)
        if {"prefix_hit_rate", "prefix_hit_tokens", "prefix_queries_tokens"} <= set(columns):
            q = columns["prefix_queries_tokens"].astype(float)
            h = columns["prefix_hit_tokens"].astype(float)
            columns["prefix_hit_rate"] = np.where(q > 0, h / q, np.nan)
