"""Where a request's time goes: queueing, prefill and decode (requests.csv's ``queue_s``,
``prefill_s``, ``decode_s``), for the run report."""

from __future__ import annotations

import numpy as np

from kvsim.reports.columns import Columns, as_columns
from kvsim.reports.frames import PHASE_COLUMNS, phase_columns
from kvsim.reports.plot import Figure, bar
from kvsim.reports.style import empty_figure, fmt_pct, fmt_seconds, style_figure

PHASES = (("queue_s", "queueing", "#dc2626"), ("prefill_s", "prefill", "#f59e0b"),
          ("decode_s", "decode", "#2563eb"))
MAX_BARS = 120


def completed_phases(requests) -> Columns:
    """The completed requests (a requests frame's), in arrival order, with their phase
    columns (computed if the frame lacks them)."""
    requests = as_columns(requests)
    if "completed" not in requests:     # (none known to have completed)
        return Columns({**{name: requests[name][:0] for name in requests.columns},
                        **{name: np.empty(0) for name in PHASE_COLUMNS}})
    done = requests.rows(requests["completed"] == 1)
    if not set(PHASE_COLUMNS) <= set(done.columns):
        done = Columns({**{name: done[name] for name in done.columns}, **phase_columns(done)})
    return done.rows(np.argsort(done["arrival_s"], kind="stable"))


def phase_shares(requests) -> dict[str, float]:
    """Each phase's share of all completed requests' end-to-end time."""
    done = completed_phases(requests)
    totals = {col: float(np.nansum(done[col])) for col, _, _ in PHASES}
    whole = sum(totals.values())
    return {col: (t / whole if whole else 0.0) for col, t in totals.items()}


def time_split_figure(requests) -> Figure:
    """Mean queueing, prefill and decode seconds of the requests arriving in each of at most
    :data:`MAX_BARS` equal arrival-time bins, stacked: a bar's height is their mean E2E
    latency (bins by time, not by count: requests sharing an arrival time share one bar)."""
    done = completed_phases(requests)
    if not len(done):
        return empty_figure("Where time goes", "no completed requests")
    bins, at = arrival_bins(done["arrival_s"].astype(float))
    count = np.bincount(bins)
    shown = np.flatnonzero(count)           # (the bins holding a request)
    x, count = at[shown], count[shown]
    width = float(at[1] - at[0]) * 0.95 if len(at) > 1 else None
    fig = Figure()
    for col, name, color in PHASES:
        values = done[col].astype(float)
        present = ~np.isnan(values)         # (a mean over the values there are)
        sums = np.bincount(bins, weights=np.where(present, values, 0.0))[shown]
        with np.errstate(invalid="ignore", divide="ignore"):
            means = sums / np.bincount(bins, weights=present)[shown]
        fig.add_trace(bar(
            x=x, y=means, width=width, name=name, marker=dict(color=color),
            customdata=count, hovertemplate=f"{name} %{{y:.3f}} s (mean of %{{customdata}} "
            "requests arriving near %{x:.1f} s)<extra></extra>"))
    fig.update_layout(barmode="stack", bargap=0.05)
    fig.update_xaxes(title=dict(text="arrival time (simulated s)"))
    fig.update_yaxes(title=dict(text="mean time per request (s)"))
    return style_figure(fig, "Where time goes, by arrival time", height=380)


def arrival_bins(arrivals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each arrival's bin among at most :data:`MAX_BARS` equal bins of the arrival span, and
    the bins' centres (one bin when all arrive at once)."""
    lo, hi = float(arrivals.min()), float(arrivals.max())
    num = min(MAX_BARS, len(arrivals)) if hi > lo else 1
    width = (hi - lo) / num
    if not width:
        return np.zeros(len(arrivals), dtype=np.int64), np.array([lo])
    bins = np.minimum(((arrivals - lo) / width).astype(np.int64), num - 1)
    return bins, lo + (np.arange(num) + 0.5) * width


def time_split_note(requests) -> str:
    """One sentence: the phases' shares of all end-to-end time, and what each measures."""
    shares = phase_shares(requests)
    done = completed_phases(requests)
    e2e = done["e2e_s"].astype(float) if "e2e_s" in done else np.empty(0)
    mean = float(np.nanmean(e2e)) if len(e2e) and not np.isnan(e2e).all() else float("nan")
    parts = ", ".join(f"{name} {fmt_pct(shares[col])}" for col, name, _ in PHASES)
    return (f"Of all completed requests' end-to-end time (mean {fmt_seconds(mean)}): {parts}. "
            "Queueing: arrival to first scheduled; prefill: first scheduled to first token "
            "(chunks and preemptions included); decode: first to last token.")
