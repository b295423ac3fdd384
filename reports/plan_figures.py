"""The figures of ``kvsim plan``'s page (cost against each SLO'd latency with its Pareto
front, and the sustainable rate of one replica) and the names and rate texts they share with
its tables."""

from __future__ import annotations

from kvsim.reports.plot import Figure, bar, make_subplots, scatter
from kvsim.reports.style import empty_figure, series_color, style_figure

PLAN_FIGURE_IDS = ("fig-pareto", "fig-max-rate")
_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}


def metric_name(key: str) -> str:
    """``ttft_p99_s`` → ``TTFT p99``."""
    metric, pct = key.removesuffix("_s").split("_")
    return f"{_NAMES.get(metric, metric.upper())} {pct}"


def max_rate_text(row: dict) -> str:
    """The sustainable rate; ``< X`` when even the lowest rate tried (X) failed, ``≥ X`` when
    the highest tried (X) still met the SLOs (no limit found), ``X-Y`` when the search left
    a wide bracket (its note says so)."""
    found = row.get("max_rate") or {}
    rate, failing = found.get("request_rate_per_s"), found.get("failing_request_rate_per_s")
    if rate is None:
        return "—" if failing is None else f"< {failing:.3g}"
    if failing is None:
        return f"≥ {rate:,.2f}"
    return f"{rate:,.2f}-{failing:,.2f}" if found.get("note") else f"{rate:,.2f}"   # (coarse)


def cost_points(result: dict) -> list[dict]:
    """Every simulated (candidate, replicas) point at the planned load with a known price:
    ``label``, ``replicas``, ``cost``, ``meets`` and its latencies, in candidate order."""
    points = []
    for row in sorted(result["candidates"], key=lambda r: r["index"]):
        price, tp = row["price_per_gpu_hour_usd"], row["settings"]["tp"]
        for ev in row["evaluations"] if price is not None else ():
            points.append({"index": row["index"], "label": row["label"],
                           "replicas": ev["replicas"], "cost": ev["replicas"] * tp * price,
                           "meets": ev["meets"], **ev["latency"]})
    return points


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points that no other point beats on both cost and latency (lower is
    better), cheapest first."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    front, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def pareto_figure(result: dict) -> Figure:
    """Cost per hour against each SLO'd latency, every simulated point, the Pareto front
    (dashed) and the target (dotted)."""
    points, keys = cost_points(result), list(result["slo"])
    if not points:
        simulated = any(r["evaluations"] for r in result["candidates"])
        return empty_figure("Cost vs latency", "no simulated point with a known price"
                            if simulated else "nothing simulated: every candidate was ruled "
                            "out before (see the reasons in the table)")
    fig = make_subplots(rows=1, cols=len(keys), subplot_titles=[metric_name(k) for k in keys])
    for col, key in enumerate(keys, start=1):
        _pareto_panel(fig, points, key, result["slo"][key], col)
    fig.update_xaxes(title=dict(text="cost per hour (USD)"))
    fig.update_yaxes(title=dict(text="latency (s)"), type="log", tickvals=_LOG_TICKS,
                     ticktext=[f"{v:g}" for v in _LOG_TICKS])    # (0.2, not a bare "2")
    return style_figure(fig, "Cost vs latency (lower left is better; filled: meets every SLO)",
                        height=440, hovermode="closest", legend="bottom")


#: Latency ticks of a log axis, 1-2-5 in each decade, each labelled in full.
_LOG_TICKS = [m * 10.0 ** e for e in range(-4, 5) for m in (1, 2, 5)]


def _pareto_panel(fig: Figure, points: list[dict], key: str, target: float, col: int):
    usable = [p for p in points if p.get(key) is not None]
    for index in dict.fromkeys(p["index"] for p in usable):
        mine = [p for p in usable if p["index"] == index]
        fig.add_trace(scatter(
            x=[p["cost"] for p in mine], y=[p[key] for p in mine], mode="markers",
            name=mine[0]["label"], legendgroup=str(index), showlegend=col == 1,
            marker=dict(size=10, color=series_color(index),
                        symbol=["circle" if p["meets"] else "circle-open" for p in mine]),
            text=[f"{p['label']} x {p['replicas']}" for p in mine],
            hovertemplate="%{text}<br>$%{x:,.2f}/h<br>%{y:.3g} s<extra></extra>"),
            row=1, col=col)
    front = [usable[i] for i in pareto_front([(p["cost"], p[key]) for p in usable])]
    fig.add_trace(scatter(x=[p["cost"] for p in front], y=[p[key] for p in front],
                          mode="lines", line=dict(color="#111827", dash="dash", shape="hv"),
                          name="Pareto front", legendgroup="front", showlegend=col == 1,
                          hoverinfo="skip"), row=1, col=col)
    costs = [p["cost"] for p in usable] or [0.0]
    fig.add_trace(scatter(x=[min(costs), max(costs)], y=[target, target], mode="lines",
                          line=dict(color="#dc2626", dash="dot"), name="SLO target",
                          legendgroup="slo", showlegend=col == 1, hoverinfo="skip"),
                  row=1, col=col)


def max_rate_figure(result: dict) -> Figure:
    """Largest sustainable request rate of one replica, per candidate."""
    rows = [r for r in result["candidates"] if (r["max_rate"] or {}).get("request_rate_per_s")]
    if not rows:
        tested = any(r["max_rate"] for r in result["candidates"])
        return empty_figure("Sustainable rate", "no candidate sustains any tested rate"
                            if tested else "no rate was tested (no candidate met the SLOs)")
    fig = Figure(bar(   # (the table's text: "≥ X" where the highest rate tried still met them)
        x=[r["max_rate"]["request_rate_per_s"] for r in rows], y=[r["label"] for r in rows],
        orientation="h", marker=dict(color=[series_color(r["index"]) for r in rows]),
        text=[max_rate_text(r) for r in rows], textposition="auto",
        hovertemplate="%{y}<br>%{text} req/s<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title=dict(text="requests per second"))
    return style_figure(fig, "Largest sustainable request rate of one replica",
                        height=max(240, 60 + 28 * len(rows)), hovermode="closest")
