"""Plotly figures built from result frames (docs/frames.md), read as
:class:`~kvsim.reports.columns.Columns` (a DataFrame given is read through
:func:`~kvsim.reports.columns.as_columns`).

Functions taking ``runs`` accept a list of ``(label, frame)`` pairs: one pair draws a single run,
several overlay runs (one colour each, for ``kvsim compare``). Every function tolerates empty
frames and missing columns, drawing an explanatory empty figure instead.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kvsim.reports.columns import Columns, as_columns, numbers
from kvsim.reports.plot import Figure, bar, make_subplots, scatter
from kvsim.reports.style import (FRAG_COLORS, FRAG_KEYS, FRAG_LABELS, KV_COLORS, empty_figure, fmt_pct,
                    fmt_seconds, is_number, parse_slo, series_color, style_figure)

LATENCY_METRICS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E latency"))
CDF_MAX_POINTS = 2000

Runs = Sequence[tuple[str, Columns]]


def _tables(runs) -> list[tuple[str, Columns]]:
    return [(label, as_columns(df)) for label, df in runs]


def _num_unfinished(df: Columns) -> int:
    """Requests of a requests frame that never completed (rejected, or cut off)."""
    return int((df["completed"] == 0).sum()) if "completed" in df else 0


def _values(df: Columns, col: str) -> np.ndarray:
    """Finite values of ``df[col]`` as floats (empty when the column is missing)."""
    if col not in df or len(df) == 0:
        return np.empty(0)
    v = numbers(df[col])
    return v[np.isfinite(v)]


def _has_rows(runs: Runs, col: str) -> bool:
    return any(col in df and len(df) > 0 for _, df in runs)


def cdf_points(values: np.ndarray, max_points: int = CDF_MAX_POINTS):
    """``(x, y)`` of the empirical CDF, thinned to at most ``max_points`` quantiles."""
    v = np.sort(values)
    n = len(v)
    if n <= max_points:
        return v, np.arange(1, n + 1) / n
    q = np.linspace(1.0 / n, 1.0, max_points)
    return np.quantile(v, q), q


def latency_cdf_figure(runs: Runs, slo: dict | None = None) -> Figure:
    """CDFs of TTFT, TPOT and E2E side by side; SLO targets as dashed vertical lines."""
    runs = _tables(runs)
    if not any(len(_values(df, m)) for _, df in runs for m, _ in LATENCY_METRICS):
        return empty_figure("Latency distribution (CDF)", "no completed requests")
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in LATENCY_METRICS],
                        horizontal_spacing=0.06)
    for col, (metric, title) in enumerate(LATENCY_METRICS, start=1):
        drawn = False
        for i, (label, df) in enumerate(runs):
            v = _values(df, metric)
            if len(v) == 0:
                continue
            x, y = cdf_points(v)
            fig.add_trace(scatter(
                x=x, y=y, mode="lines", name=label, legendgroup=label,
                showlegend=col == 1 and len(runs) > 1,
                line=dict(color=series_color(i), width=2),
                hovertemplate=f"{label}<br>{title} %{{x:.4g}} s<br>CDF %{{y:.3f}}<extra></extra>",
            ), row=1, col=col)
            drawn = True
        if not drawn:
            axis = "" if col == 1 else str(col)
            fig.add_annotation(text="no data", showarrow=False, x=0.5, y=0.5,
                               xref=f"x{axis} domain", yref=f"y{axis} domain",
                               font=dict(color="#6b7280"))
        fig.update_xaxes(title=dict(text="seconds"), row=1, col=col)
    _add_slo_lines(fig, runs, slo)
    for col in (1, 2, 3):
        fig.update_yaxes(range=[0, 1.02], tickformat=".0%", row=1, col=col,
                         title=dict(text="requests ≤ x"))
    return style_figure(fig, "Latency distribution (CDF)", height=380, hovermode="closest")


def _add_slo_lines(fig: Figure, runs: Runs, slo: dict | None) -> None:
    cols = {m: i for i, (m, _) in enumerate(LATENCY_METRICS, start=1)}
    for metric, pct, target in parse_slo(slo):
        if metric not in cols:
            continue
        text = f"SLO p{pct:g} ≤ {fmt_seconds(target)}"
        if len(runs) == 1:
            v, missed = _values(runs[0][1], metric), _num_unfinished(runs[0][1])
            if len(v) + missed:     # (a rejected or unfinished request misses every target)
                text += f" · {fmt_pct(np.count_nonzero(v <= target) / (len(v) + missed))} within"
            if missed:
                text += f" ({missed} not completed count as misses)"
        fig.add_vline(x=target, line=dict(color="#dc2626", dash="dash", width=1.5),
                      row=1, col=cols[metric], label=text,
                      label_font=dict(color="#dc2626", size=11))
        fig.add_hline(y=pct / 100, line=dict(color="#dc2626", dash="dot", width=1),
                      row=1, col=cols[metric])


def throughput_queue_figure(runs: Runs) -> Figure:
    """Output-token throughput (top) and queue lengths (bottom) over simulated time."""
    runs = _tables(runs)
    if not _has_rows(runs, "throughput_tokens_per_s"):
        return empty_figure("Throughput and queue", "no timeline data")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=["Output throughput (tokens/s)", "Requests"])
    single = len(runs) == 1
    for i, (label, df) in enumerate(runs):
        if len(df) == 0:
            continue
        color = series_color(i)
        fig.add_trace(scatter(x=df["time_s"], y=df["throughput_tokens_per_s"], mode="lines",
                              name="throughput" if single else label, legendgroup=label,
                              line=dict(color=color, width=1.6),
                              fill="tozeroy" if single else None), row=1, col=1)
        if single and "num_running" in df:
            fig.add_trace(scatter(x=df["time_s"], y=df["num_running"], mode="lines",
                                  name="running", line=dict(color="#16a34a")), row=2, col=1)
        if "num_waiting" in df:
            fig.add_trace(scatter(
                x=df["time_s"], y=df["num_waiting"], mode="lines",
                name="waiting" if single else f"{label} waiting", legendgroup=label,
                showlegend=single, line=dict(color="#dc2626" if single else color,
                                             dash="solid" if single else "dot")), row=2, col=1)
    fig.update_xaxes(title=dict(text="simulated time (s)"), row=2, col=1)
    fig.update_yaxes(title=dict(text="tokens/s"), row=1, col=1)
    fig.update_yaxes(title=dict(text="requests"), row=2, col=1)
    return style_figure(fig, "Throughput and queue length over time", height=480)


def kv_pool_figure(df: Columns, pool_blocks: float | None = None,
                   replicas: int = 1) -> Figure:
    """GPU KV pool stacked (used / cached-idle / empty) over time, all replicas together (as
    ``timeline.csv`` sums them), plus the host tier if used; the pools' size (``pool_blocks``
    a replica) is drawn as a dashed line."""
    df = as_columns(df)
    needed = ("kv_used_blocks", "kv_cached_idle_blocks", "kv_free_blocks")
    if len(df) == 0 or any(c not in df for c in needed):
        return empty_figure("KV pool", "no timeline data")
    host = "host_used_blocks" in df and float(np.nansum(df["host_used_blocks"])) > 0
    fig = make_subplots(rows=2 if host else 1, cols=1, shared_xaxes=True,
                        vertical_spacing=0.1, row_heights=[0.7, 0.3] if host else None,
                        subplot_titles=["GPU pool (blocks)", "Host tier (blocks)"] if host
                        else None)
    for col, name, key in ((needed[0], "used by requests", "used"),
                           (needed[1], "cached, idle", "cached_idle"),
                           (needed[2], "empty (free, nothing cached)", "free")):
        fig.add_trace(scatter(x=df["time_s"], y=df[col], name=name, mode="lines",
                              stackgroup="gpu", line=dict(width=0.5, color=KV_COLORS[key]),
                              fillcolor=KV_COLORS[key]), row=1, col=1)
    if is_number(pool_blocks):
        total = float(pool_blocks) * replicas
        label = f"pool {total:,.0f} blocks" + (
            f" ({replicas} replicas x {float(pool_blocks):,.0f})" if replicas > 1 else "")
        fig.add_hline(y=total, line=dict(color="#111827", dash="dash", width=1),
                      row=1, col=1, label=label)
    if host:
        fig.add_trace(scatter(x=df["time_s"], y=df["host_used_blocks"], name="host tier used",
                              mode="lines", fill="tozeroy",
                              line=dict(width=1, color=KV_COLORS["host"])), row=2, col=1)
    fig.update_xaxes(title=dict(text="simulated time (s)"), row=2 if host else 1, col=1)
    fig.update_yaxes(title=dict(text="blocks"), row=1, col=1)
    if host:
        fig.update_yaxes(title=dict(text="blocks"), row=2, col=1)
    return style_figure(fig, "KV pool over time", height=480 if host else 380)


def fragmentation_time_figure(df: Columns) -> Figure:
    """Stacked shares of the GPU pool (token states … free) over time."""
    df = as_columns(df)
    cols = [f"frag_{k}" for k in FRAG_KEYS]
    if len(df) == 0 or any(c not in df for c in cols):
        return empty_figure("Memory use", "no timeline data")
    fig = Figure()
    for key, col in zip(FRAG_KEYS, cols):
        fig.add_trace(scatter(
            x=df["time_s"], y=df[col], name=FRAG_LABELS[key], mode="lines", stackgroup="frag",
            line=dict(width=0.5, color=FRAG_COLORS[key]), fillcolor=FRAG_COLORS[key],
            hovertemplate="%{y:.1%}"))
    fig.update_yaxes(tickformat=".0%", range=[0, 1], title=dict(text="share of GPU KV pool"))
    fig.update_xaxes(title=dict(text="simulated time (s)"))
    return style_figure(fig, "GPU KV pool by token state over time", height=380)


def fragmentation_bar_figure(items: Sequence[tuple[str, dict]]) -> Figure:
    """One horizontal 100% bar per run: token states / reservation / internal / external / free."""
    items = [(label, frag) for label, frag in items if isinstance(frag, dict) and frag]
    if not items:
        return empty_figure("Breakdown", "no fragmentation data")
    labels = [label for label, _ in items]
    fig = Figure()
    for key in FRAG_KEYS:
        vals = [float(f.get(key) or 0.0) for _, f in items]
        fig.add_trace(bar(y=labels, x=vals, name=FRAG_LABELS[key], orientation="h",
                          marker=dict(color=FRAG_COLORS[key]), text=[fmt_pct(v) for v in vals],
                          textposition="inside", insidetextanchor="middle",
                          hovertemplate=f"{FRAG_LABELS[key]}: %{{x:.1%}}<extra>%{{y}}</extra>"))
    fig.update_layout(barmode="stack", uniformtext=dict(minsize=9, mode="hide"),
                      legend=dict(traceorder="normal"))
    fig.update_xaxes(tickformat=".0%", range=[0, 1],
                     title=dict(text="share of GPU KV pool (time-averaged)"))
    fig.update_yaxes(autorange="reversed")
    height = max(170 + 46 * len(items), 300) + 40
    style_figure(fig, "Time-averaged breakdown", height=height, hovermode="closest",
                 legend="bottom")
    # the legend below the axis title, not on it: 62 px down, as a share of the plot's height
    bottom = 110
    fig.update_layout(margin=dict(b=bottom), legend=dict(y=-62 / (height - 70 - bottom)))
    return fig


def hit_rate_figure(runs: Runs) -> Figure:
    """Prefix-cache hit rate per interval and cumulative, over time."""
    runs = _tables(runs)
    if not _has_rows(runs, "prefix_hit_rate"):
        return empty_figure("Prefix cache", "no timeline data")
    fig = Figure()
    single = len(runs) == 1
    for i, (label, df) in enumerate(runs):
        if len(df) == 0:
            continue
        color = series_color(i)
        rate = df["prefix_hit_rate"].astype(float)
        if "prefix_queries_tokens" in df:  # no lookups in an interval: no rate, not 0%
            rate = np.where(df["prefix_queries_tokens"].astype(float) > 0, rate, np.nan)
        if single:
            fig.add_trace(scatter(x=df["time_s"], y=rate, mode="lines+markers",
                                  name="per interval", connectgaps=False,
                                  line=dict(color="#93c5fd", width=1),
                                  marker=dict(color="#93c5fd", size=3)))
            # (markers: an interval with lookups between two without draws no line)
        if {"prefix_hit_tokens", "prefix_queries_tokens"} <= set(df.columns):
            q = np.cumsum(np.nan_to_num(df["prefix_queries_tokens"].astype(float)))
            h = np.cumsum(np.nan_to_num(df["prefix_hit_tokens"].astype(float)))
            with np.errstate(invalid="ignore", divide="ignore"):
                cum = np.where(q > 0, h / q, np.nan)
            fig.add_trace(scatter(x=df["time_s"], y=cum, mode="lines",
                                  name="cumulative" if single else label,
                                  line=dict(color="#1d4ed8" if single else color, width=2.2)))
    if not any(len(df) and float(np.nansum(df.get("prefix_queries_tokens", 0))) > 0
               for _, df in runs):
        fig.add_annotation(text="no prefix-cache lookups recorded in the timeline",
                           showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                           font=dict(size=14, color="#6b7280"))
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02], title=dict(text="hit tokens / looked-up"))
    fig.update_xaxes(title=dict(text="simulated time (s)"))
    return style_figure(fig, "Prefix cache hit rate over time", height=360)


TRANSFER_COLUMNS = (("swap_out_blocks", "swap out"), ("swap_in_blocks", "swap in"),
                    ("offload_blocks", "offload"), ("promote_blocks", "promote"),
                    ("compact_blocks", "compaction moves"))


def events_figure(df: Columns) -> Figure:
    """Preemptions per interval (top) and block transfers per interval (bottom)."""
    df = as_columns(df)
    if len(df) == 0 or "preemptions" not in df:
        return empty_figure("Preemptions and transfers", "no timeline data")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=["Preemptions per interval", "Blocks moved per interval"])
    fig.add_trace(bar(x=df["time_s"], y=df["preemptions"], name="preemptions",
                      marker=dict(color="#dc2626", line=dict(width=0))), row=1, col=1)
    present = [(c, n) for c, n in TRANSFER_COLUMNS if c in df]
    shown = [(c, n) for c, n in present if float(np.nansum(df[c])) > 0] or present[:1]
    for i, (col, name) in enumerate(shown):
        fig.add_trace(scatter(x=df["time_s"], y=df[col], name=name, mode="lines",
                              line=dict(color=series_color(i), width=1.4)), row=2, col=1)
    for row, empty, text in ((1, not float(np.nansum(df["preemptions"])) > 0,
                              "no preemptions in this run"),
                             (2, not any(float(np.nansum(df[c])) > 0 for c, _ in present),
                              "no block transfers in this run")):
        if empty:       # (counts: an empty panel from 0, not centred on it)
            axis = "" if row == 1 else "2"
            fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5,
                               xref=f"x{axis} domain", yref=f"y{axis} domain",
                               font=dict(color="#6b7280"))
            fig.update_yaxes(range=[0, 1], row=row, col=1)
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(bargap=0)
    fig.update_xaxes(title=dict(text="simulated time (s)"), row=2, col=1)
    fig.update_yaxes(title=dict(text="preemptions"), row=1, col=1)
    fig.update_yaxes(title=dict(text="blocks"), row=2, col=1)
    return style_figure(fig, "Preemptions and transfers over time", height=460)
