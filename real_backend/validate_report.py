"""Show a validation report: a terminal table, ``validation.json`` and ``validation.html``."""

from __future__ import annotations

import os
from pathlib import Path

import plotly.graph_objects as go

from kvsim.reports.io import write_json_atomic
from kvsim.reports.page import cards, card, esc, figure_div, panel, render_page, settings_block
from kvsim.reports.style import fmt_pct, style_figure


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def error_rows(report: dict) -> list[tuple[str, str, str, str]]:
    """``(quantity, real, sim, error)`` rows: step durations, then the run metrics."""
    sd = report["step_duration"]
    rows = [(f"step duration ({k}, {v['steps']} steps)", "", "",
             f"{_pct(v['median_abs_rel_error'])} median, {_pct(v['p90_abs_rel_error'])} p90")
            for k, v in sd.items() if isinstance(v, dict)]
    rows.append(("total busy time", "", "", _pct(sd["total_time_rel_error"])))
    ms = report["mean_step_s"]
    rows.append(("mean step (s)", _num(ms["real"]), _num(ms["sim"]), ""))
    for name, m in report["metrics"].items():
        rows.append((name, _num(m["real"]), _num(m["sim"]), _pct(m["rel_error"])))
    return rows


def decision_lines(report: dict) -> list[str]:
    d = report["decisions"]
    verdict = "IDENTICAL" if d["identical"] else "DIFFERENT"
    totals = ", ".join(f"{k} {a}/{b}" for k, (a, b) in d["totals"].items() if a or b)
    return [f"cache decisions (real/sim): {verdict}; steps {d['num_steps'][0]}/"
            f"{d['num_steps'][1]}; {totals}",
            f"per-step schedule identical: {d['per_step_identical']}; per-request cached "
            f"tokens identical: {d['cached_tokens_identical']}"]


def note_lines(report: dict) -> list[str]:
    lines = [f"warning: profile measured with {k}={a!r}, this run uses {b!r}"
             for k, (a, b) in report.get("profile_mismatch", {}).items()]
    nf = report.get("noise_floor")
    if not nf:
        return lines
    step = nf.get("step_median_abs_rel_diff")
    return lines + [f"noise floor (real run vs a second real run): step {_pct(step)} "
                    f"median, throughput {_pct(nf['throughput_rel_diff'])}, total busy time "
                    f"{_pct(nf['total_time_rel_diff'])}"]


def render_table(report: dict) -> str:
    """The error table as plain text."""
    s = report["settings"]
    head = (f"validate {s['model']} on {s['device']} ({report['device_name']}), "
            f"{report['num_requests']} requests, profile: {report['profile_source']}")
    lines = [head, f"{'quantity':<36}{'real':>12}{'sim':>12}  error"]
    lines += [f"{q:<36}{r:>12}{m:>12}  {e}" for q, r, m, e in error_rows(report)]
    return "\n".join(lines + decision_lines(report) + note_lines(report))


def step_figure(report: dict) -> go.Figure:
    steps = report["steps"]
    x = list(range(len(steps["measured_s"])))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=steps["measured_s"], name="measured (real backend)",
                             mode="lines"))
    fig.add_trace(go.Scatter(x=x, y=steps["predicted_s"], name="predicted (cost model)",
                             mode="lines"))
    fig.update_xaxes(title="engine step")
    fig.update_yaxes(title="step duration (s)")
    return style_figure(fig, "Step durations, aligned by step", legend="bottom")


def scatter_figure(report: dict) -> go.Figure:
    steps = report["steps"]
    fig = go.Figure(go.Scatter(x=steps["measured_s"], y=steps["predicted_s"], mode="markers",
                               text=[f"{k}, {b} requests, {t} tokens, {kv} KV tokens"
                                     for k, b, t, kv in zip(
                                         steps["kind"], steps["batch_size"],
                                         steps["scheduled_tokens"], steps["kv_tokens"])],
                               name="steps"))
    top = max(steps["measured_s"] + steps["predicted_s"] + [0.0])
    fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="exact",
                             line=dict(dash="dot")))
    fig.update_xaxes(title="measured (s)")
    fig.update_yaxes(title="predicted (s)")
    return style_figure(fig, "Predicted vs measured step duration", hovermode="closest")


def _table_html(report: dict) -> str:
    body = "".join(f"<tr><td>{esc(q)}</td><td>{esc(r)}</td><td>{esc(m)}</td><td>{esc(e)}"
                   f"</td></tr>" for q, r, m, e in error_rows(report))
    return (f"<table><thead><tr><th>quantity</th><th>real</th><th>sim</th><th>error</th></tr>"
            f"</thead><tbody>{body}</tbody></table>"
            + "".join(f"<p>{esc(line)}</p>"
                      for line in decision_lines(report) + note_lines(report)))


def write_html(path: str | os.PathLike, report: dict) -> Path:
    """A self-contained HTML page of the report."""
    m = report["metrics"]["throughput_output_tokens_per_s"]
    sd = report["step_duration"]["all"]
    header = cards([
        card("median step error", fmt_pct(sd["median_abs_rel_error"]), f"{sd['steps']} steps"),
        card("throughput error", fmt_pct(m["rel_error"]), f"real {m['real']:.1f} tok/s"),
        card("decisions", "identical" if report["decisions"]["identical"] else "different"),
    ])
    body = (panel("Errors (sim vs real)", _table_html(report))
            + panel("Steps", figure_div(step_figure(report), "steps")
                    + figure_div(scatter_figure(report), "scatter"))
            + panel("Settings", settings_block({"backend": report["settings"],
                                                "engine": report["config"]}, open_=True)))
    return render_page(path, title="kvsim validation", header=header, body=body)


def write_outputs(out_dir: str | os.PathLike, report: dict, html: bool = True) -> dict:
    """Write ``validation.json`` (and ``validation.html``); returns their paths."""
    out = Path(out_dir)
    paths = {"json": str(write_json_atomic(out / "validation.json", report))}
    if html:
        paths["html"] = str(write_html(out / "validation.html", report))
    return paths
