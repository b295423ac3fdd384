"""Views across several runs (``kvsim compare``: overlays, trade-off scatter, SLO ranking) and
miss-ratio curves (``kvsim hitrate``), for the HTML pages of :mod:`kvsim.reports.html`."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from kvsim.reports.grid_table import identical_to, result_fingerprint
from kvsim.reports.page import esc, flatten, fmt_setting
from kvsim.reports.plot import Figure, make_subplots, scatter
from kvsim.reports.style import (empty_figure, fmt_num, fmt_pct, fmt_seconds, get, is_number, series_color,
                    parse_slo, slo_met, style_figure)

Run = tuple[str, dict, pd.DataFrame, pd.DataFrame]


def kv_usage_overlay(runs: Sequence[tuple[str, pd.DataFrame]]) -> Figure:
    """KV usage (used / pool) over time, one line per run."""
    if not any("kv_usage" in df and len(df) for _, df in runs):
        return empty_figure("KV usage", "no timeline data")
    fig = Figure()
    for i, (label, df) in enumerate(runs):
        if len(df) and "kv_usage" in df:
            fig.add_trace(scatter(x=df["time_s"], y=df["kv_usage"], mode="lines", name=label,
                                  line=dict(color=series_color(i), width=1.8)))
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02], title=dict(text="used / GPU pool"))
    fig.update_xaxes(title=dict(text="simulated time (s)"))
    return style_figure(fig, "KV usage over time", height=360)


def events_overlay(runs: Sequence[tuple[str, pd.DataFrame]]) -> Figure:
    """Cumulative preemptions and cumulative swapped blocks over time, one colour per run."""
    if not any("preemptions" in df and len(df) for _, df in runs):
        return empty_figure("Preemptions and transfers", "no timeline data")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                        subplot_titles=["Preemptions (cumulative)",
                                        "Blocks swapped out + in (cumulative)"])
    for i, (label, df) in enumerate(runs):
        if not len(df):
            continue
        color = series_color(i)
        pre = np.cumsum(np.nan_to_num(np.asarray(df["preemptions"], dtype=float)))
        fig.add_trace(scatter(x=df["time_s"], y=pre, mode="lines", name=label,
                              legendgroup=label, line=dict(color=color)), row=1, col=1)
        swaps = sum(np.nan_to_num(np.asarray(df[c], dtype=float))
                    for c in ("swap_out_blocks", "swap_in_blocks") if c in df)
        fig.add_trace(scatter(x=df["time_s"], y=np.cumsum(swaps) if np.ndim(swaps) else
                              np.zeros(len(df)), mode="lines", name=label, legendgroup=label,
                              showlegend=False, line=dict(color=color)), row=1, col=2)
    fig.update_xaxes(title=dict(text="simulated time (s)"))
    fig.update_yaxes(title=dict(text="preemptions"), row=1, col=1)
    fig.update_yaxes(title=dict(text="blocks"), row=1, col=2)
    return style_figure(fig, "Preemptions and transfers over time", height=360)


def _p99(summary: dict, metric: str) -> float | None:
    v = get(summary, metric, "p99")
    return float(v) if is_number(v) else None


def tradeoff_scatter(runs: Sequence[Run], slo: dict | None = None) -> Figure:
    """Throughput against p99 TTFT and p99 E2E latency, one point per run numbered by its
    rank (the ranking table's ``#``)."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=["Throughput vs p99 TTFT", "Throughput vs p99 E2E"])
    drawn, ranks = False, rank_labels(runs, slo)
    for i, (label, summary, _, _) in enumerate(runs):
        x = get(summary, "throughput_output_tokens_per_s")
        for col, metric in ((1, "ttft_s"), (2, "e2e_s")):
            y = _p99(summary, metric)
            if not is_number(x) or y is None:
                continue
            fig.add_trace(scatter(      # numbered points: long labels live in the legend
                x=[x], y=[y], mode="markers+text", text=[ranks[i]], textposition="middle center",
                textfont=dict(color="white", size=10), name=f"{ranks[i]}. {label}",
                legendgroup=label, showlegend=col == 1,
                marker=dict(size=18, color=series_color(i), line=dict(width=1, color="white")),
                hovertemplate=f"{esc(label)}<br>%{{x:,.0f}} tok/s<br>p99 %{{y:.3g}} s"
                              "<extra></extra>"), row=1, col=col)
            drawn = True
    if not drawn:
        return empty_figure("Throughput vs p99 latency", "no completed requests in any run")
    fig.update_xaxes(title=dict(text="output throughput (tokens/s)"))
    fig.update_yaxes(title=dict(text="p99 TTFT (s)"), row=1, col=1)
    fig.update_yaxes(title=dict(text="p99 E2E (s)"), row=1, col=2)
    return style_figure(fig, "Throughput vs tail latency (up-left is better)", height=420,
                        hovermode="closest")


def common_slo(runs: Sequence[Run], slo: dict | None = None) -> dict | None:
    """The SLO all runs are judged by: ``slo`` if given, else the first run's that has one."""
    if slo is not None:
        return slo
    return next((s["slo"] for _, s, _, _ in runs if parse_slo(s.get("slo"))), None)


def meets_slo(summary: dict, slo: dict | None) -> bool | None:
    """True/False against the targets in ``slo``; None when there are none."""
    targets = parse_slo(slo)
    if not targets:
        return None
    return all(slo_met(summary, metric, pct, target) for metric, pct, target in targets)


def rank_runs(runs: Sequence[Run], slo: dict | None = None) -> list[int]:
    """Indices of ``runs`` best first: SLO-meeting runs first (see :func:`common_slo`), then
    by output throughput."""
    slo = common_slo(runs, slo)

    def key(i: int):
        summary = runs[i][1]
        ok = meets_slo(summary, slo)
        tput = get(summary, "throughput_output_tokens_per_s")
        return (0 if ok in (True, None) else 1, -(float(tput) if is_number(tput) else -1.0), i)
    return sorted(range(len(runs)), key=key)


def rank_labels(runs: Sequence[Run], slo: dict | None = None) -> list[str]:
    """Each run's rank as the ranking table shows it (``3``; ``=1`` for a run whose results
    are identical to the first-ranked one's), in the order of ``runs``."""
    shown, first_rank = [""] * len(runs), {}
    for rank, i in enumerate(rank_runs(runs, slo), start=1):
        key = result_fingerprint(runs[i][1])
        shown[i] = f"={first_rank[key]}" if key in first_rank else str(rank)
        first_rank.setdefault(key, rank)
    return shown


def varying_settings(runs: Sequence[Run]) -> list[str]:
    """Flattened config keys whose values differ between runs (what the comparison varies)."""
    flats = [flatten(get(s, "config", default={}) or {}) for _, s, _, _ in runs]
    keys = sorted(set().union(*flats)) if flats else []
    return [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1]


_RANK_COLUMNS = (
    ("Output tok/s", lambda s: fmt_num(get(s, "throughput_output_tokens_per_s"))),
    ("Req/s", lambda s: fmt_num(get(s, "request_throughput_per_s"), 2)),
    ("TTFT p50", lambda s: fmt_seconds(get(s, "ttft_s", "p50"))),
    ("TTFT p99", lambda s: fmt_seconds(get(s, "ttft_s", "p99"))),
    ("TPOT p50", lambda s: fmt_seconds(get(s, "tpot_s", "p50"))),
    ("TPOT p99", lambda s: fmt_seconds(get(s, "tpot_s", "p99"))),
    ("E2E p99", lambda s: fmt_seconds(get(s, "e2e_s", "p99"))),
    ("Hit rate", lambda s: fmt_pct(get(s, "prefix_cache", "hit_rate"))),
    ("Preemptions", lambda s: fmt_num(get(s, "preemptions"))),
    ("Peak KV", lambda s: fmt_pct(get(s, "kv", "peak_usage"))),
)


def ranked_table(runs: Sequence[Run], slo: dict | None = None,
                 pages: dict[str, str] | None = None) -> str:
    """HTML table of the runs, best first, with the settings that differ between them; a
    run's label links to its own page where ``pages`` (label -> relative URL) has one."""
    slo = common_slo(runs, slo)
    order = rank_runs(runs, slo)
    varying = varying_settings(runs)
    has_slo = any(meets_slo(s, slo) is not None for _, s, _, _ in runs)
    same = identical_to([label for label, *_ in runs], [s for _, s, _, _ in runs])
    shown_ranks = rank_labels(runs, slo)
    head = ['<th>#</th>', '<th class="label">Run</th>']
    head += [f'<th class="label">{esc(k)}</th>' for k in varying]
    head += [f"<th>{esc(name)}</th>" for name, _ in _RANK_COLUMNS]
    head += ["<th>SLO</th>"] if has_slo else []
    head += ['<th class="label">Identical to</th>'] if any(same) else []
    rows = []
    for rank, i in enumerate(order, start=1):
        label, summary = runs[i][0], runs[i][1]
        flat = flatten(get(summary, "config", default={}) or {})
        key = result_fingerprint(summary)
        page = (pages or {}).get(label)
        name = f'<a href="{esc(page)}">{esc(label)}</a>' if page else esc(label)
        cells = [f"<td>{shown_ranks[i]}</td>", f'<td class="label"><span class="swatch" '
                 f'style="background:{series_color(i)}"></span>{name}</td>']
        cells += [f'<td class="label">{esc(fmt_setting(flat.get(k)))}</td>' for k in varying]
        cells += [f"<td>{esc(fn(summary))}</td>" for _, fn in _RANK_COLUMNS]
        if has_slo:
            ok = meets_slo(summary, slo)
            cells.append('<td>—</td>' if ok is None else
                         ('<td>met</td>' if ok else '<td class="bad">missed</td>'))
        if any(same):
            twin = next((runs[j][0] for j in order[:rank - 1]
                         if result_fingerprint(runs[j][1]) == key), "")
            cells.append(f'<td class="label">{esc(twin)}</td>')
        row_attr = ' class="best"' if rank == 1 else ""
        rows.append(f'<tr{row_attr}>{"".join(cells)}</tr>')
    return (f'<div class="table-scroll"><table class="ranked" id="ranked-table"><thead><tr>'
            f'{"".join(head)}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>')


def miss_ratio_figure(curves: pd.DataFrame) -> Figure:
    """Miss ratio (1 − hit rate) against cache capacity, one line per policy."""
    needed = {"policy", "capacity_blocks", "hit_rate"}
    if len(curves) == 0 or not needed <= set(curves.columns):
        return empty_figure("Miss-ratio curves", "no hit-rate data")
    fig = Figure()
    for i, (policy, df) in enumerate(curves.groupby("policy", sort=True)):
        df = df.sort_values("capacity_blocks")
        fig.add_trace(scatter(
            x=df["capacity_blocks"], y=1.0 - df["hit_rate"].astype(float), mode="lines+markers",
            name=str(policy), line=dict(color=series_color(i), width=2),
            hovertemplate=f"{esc(policy)}<br>%{{x:,}} blocks<br>miss ratio %{{y:.3f}}"
                          "<extra></extra>"))
    caps = curves["capacity_blocks"].astype(float)
    log_x = caps.min() > 0 and caps.max() / caps.min() >= 20
    fig.update_xaxes(title=dict(text="cache capacity (blocks)"), type="log" if log_x else "linear")
    fig.update_yaxes(title=dict(text="miss ratio"), tickformat=".0%", rangemode="tozero")
    return style_figure(fig, "Miss-ratio curves per eviction policy", height=460,
                        hovermode="x unified")


def hitrate_table(curves: pd.DataFrame) -> str:
    """HTML table: hit rate per capacity (rows) and policy (columns, as asked; the best of a
    row in bold), and, with ``belady`` among them, each online policy's share of Belady's
    gain over LRU (as the terminal prints it)."""
    if len(curves) == 0 or not {"policy", "capacity_blocks", "hit_rate"} <= set(curves.columns):
        return '<p class="note">No hit-rate data.</p>'
    html = _capacity_table(curves, "hit_rate", "hitrate-table", bold_best=True)
    if "belady_share" in curves and curves["belady_share"].notna().any():
        shares = curves[curves["belady_share"].notna()]
        html += ('<p class="note">Share of Belady\'s gain over LRU (0% = LRU, 100% = Belady: '
                 'how much of the best possible improvement each policy reaches):</p>'
                 + _capacity_table(shares, "belady_share", "belady-share-table"))
    return html


def _capacity_table(curves: pd.DataFrame, value: str, table_id: str,
                    bold_best: bool = False) -> str:
    """``value`` (a share) per capacity (rows) and policy (columns, in their order)."""
    pivot = curves.pivot_table(index="capacity_blocks", columns="policy", values=value,
                               aggfunc="mean").sort_index()
    pivot = pivot[[p for p in dict.fromkeys(curves["policy"]) if p in pivot.columns]]
    head = "".join(f"<th>{esc(p)}</th>" for p in pivot.columns)
    rows = []
    for cap, row in pivot.iterrows():
        best = row.max() if bold_best else None
        bold = ' style="font-weight:650"'
        cells = "".join(f'<td{bold if is_number(v) and v == best else ""}>{esc(fmt_pct(v))}</td>'
                        for v in row)
        rows.append(f"<tr><td class=\"label\">{esc(fmt_num(cap))}</td>{cells}</tr>")
    return (f'<div class="table-scroll"><table class="ranked" id="{table_id}"><thead><tr>'
            f'<th class="label">Capacity (blocks)</th>{head}</tr></thead><tbody>'
            f'{"".join(rows)}</tbody></table></div>')


def describe_runs(runs: Sequence[Run]) -> dict[str, Any]:
    """Small facts for the compare header: count, traces, models, GPUs."""
    def values(key: str) -> list[str]:
        return sorted({str(get(s, "config", key)) for _, s, _, _ in runs})
    return {"count": len(runs), "traces": values("trace"), "models": values("model"),
            "gpus": values("gpu")}
