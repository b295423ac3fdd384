"""Show a validation report: a terminal table, ``validation.json`` and ``validation.html``."""

from __future__ import annotations

import os
from pathlib import Path

from kvsim.reports.frames import VALIDATION_FILE, VALIDATION_REPORT
from kvsim.reports.io import write_json_atomic
from kvsim.reports.outdir import OutputDir
from kvsim.reports.page import cards, card, esc, figure_div, panel, render_page, settings_block
from kvsim.reports.plot import Figure, scatter
from kvsim.reports.style import fmt_pct, fmt_seconds, style_figure

from kvsim.real_backend.breakdown import part_table
from kvsim.real_backend.noise_floor import WITHIN


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _fine(value) -> str:
    """A share as :func:`_pct`, with two decimals below 1% (``0.04%``, not ``0.0%``, beside
    a ratio of two such shares)."""
    return "n/a" if value is None else f"{value:.2%}" if abs(value) < 0.01 else _pct(value)


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def error_rows(report: dict) -> list[tuple[str, str, str, str]]:
    """``(quantity, real, sim, error)`` rows: step durations (unsigned errors, step by step),
    then the run metrics, their errors signed (``-`` where kvsim is below the real run)."""
    sd = report["step_duration"]
    rows = [(f"step duration ({k}, {v['steps']} step{'s' * (v['steps'] != 1)})", "", "",
             f"{_pct(v['median_abs_rel_error'])} median, {_pct(v['p90_abs_rel_error'])} p90")
            for k, v in sd.items() if isinstance(v, dict)]
    rows.append(("total busy time", "", "", _pct(sd["total_time_rel_error"])))
    ms = report["mean_step_s"]
    rows.append(("mean step", fmt_seconds(ms["real"]), fmt_seconds(ms["sim"]),
                 _signed(_signed_error(ms["sim"], ms["real"]))))
    for key, m in report["metrics"].items():
        name, show = _metric(key)
        rows.append((name, show(m["real"]), show(m["sim"]),
                     _signed(_signed_error(m["sim"], m["real"]))))
    return rows


def _metric(key: str):
    """A metric's name for people and how to show its values: ``ttft_s.p50`` is
    ``TTFT p50`` in seconds; a throughput in tokens/s."""
    metric, _, pct = key.partition(".")
    if metric == "throughput_output_tokens_per_s":
        return "output throughput (tok/s)", _num
    if metric.endswith("_s"):
        return f"{metric[:-2].upper()} {pct}".strip(), fmt_seconds
    return metric.replace("_", " "), _num


def _signed_error(sim, real) -> float | None:
    return None if sim is None or real is None or real == 0 else (sim - real) / abs(real)


def decision_lines(report: dict) -> list[str]:
    d = report["decisions"]
    verdict = "IDENTICAL" if d["identical"] else "DIFFERENT"
    totals = ", ".join(f"{k} {a}/{b}" for k, (a, b) in d["totals"].items() if a or b)
    lines = [f"cache decisions (real/sim): {verdict}; steps {d['num_steps'][0]}/"
             f"{d['num_steps'][1]}; {totals}",
             f"per-step schedule identical: {_yes(d['per_step_identical'])}; per-request "
             f"cached tokens identical: {_yes(d['cached_tokens_identical'])}"]
    if not d["per_step_identical"] and not report.get("offline"):
        lines.append("(timed arrivals: an arrival can fall one step earlier or later on the "
                     "simulated clock than on the real one; --offline rules that out)")
    return lines


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def note_lines(report: dict) -> list[str]:
    """Warnings about the profile, the noise floor, and each error judged against it."""
    lines = [f"warning: profile measured with {k}={a!r}, this run uses {b!r}"
             for k, (a, b) in report.get("profile_mismatch", {}).items()]
    lines += profile_lines(report.get("profile_quality"))
    nf = report.get("noise_floor")
    if not nf:
        return lines + ["noise floor: not measured (--no-noise-floor): no error below can be "
                        "told from the host's own noise"]
    lines.append(f"noise floor (the real steps replayed once more): step "
                 f"{_pct(nf.get('step_median_abs_rel_diff'))} median, throughput "
                 f"{_pct(nf['throughput_rel_diff'])}, total busy time "
                 f"{_pct(nf['total_time_rel_diff'])}")
    return (lines + verdict_lines(report.get("verdicts", {}), bool(report.get("offline")))
            + refit_lines(report)
            + breakdown_lines(report))


def refit_lines(report: dict) -> list[str]:
    """How much of the error one speed offset explains (see ``noise_floor.speed_refit``)."""
    r = report.get("speed_refit") or {}
    if r.get("factor") is None:
        return []
    return [f"host speed vs profile, refitted on the first {r['first_steps']} steps: "
            f"x{r['factor']:.3f}; on the other steps the step error goes "
            f"{_pct(r['step_median_before'])} -> {_pct(r['step_median_after'])} (median), busy "
            f"time {_signed(r['busy_time_before'])} -> {_signed(r['busy_time_after'])}"]


def profile_lines(quality: dict | None) -> list[str]:
    """Plain words on how far the profile can be trusted (nothing for a sound, fresh one)."""
    if not quality:
        return []
    lines = []
    fit = f"{_pct(quality['fit_median'])} median, {_pct(quality['fit_max'])} max"
    interleaved = quality.get("timing") == "interleaved"
    if quality["source"] == "quick grid":
        passes = "one pass" if quality["passes"] == 1 else f"{quality['passes']} passes"
        drift = "" if interleaved else (", and one pass cannot see the host drifting while it "
                                        "ran")
        lines.append(f"warning: quick profile ({quality['points']} points, {passes}): rough. "
                     f"Its fit misses its own points by {fit}{drift}: expect step errors of "
                     f"the fit error plus the noise floor, or more (drop --quick-profile for "
                     f"the full grid)")
    spread = quality.get("round_spread")
    if spread and spread["median"] > 0.05 and interleaved:
        lines.append(f"note: the profile's {spread['passes']} passes, spread over the real "
                     f"run, disagreed by {_pct(spread['median'])} per point (median): the "
                     f"host's speed moved during the run; each point's median over the passes "
                     f"follows it")
    elif spread and spread["median"] > 0.05:
        lines.append(f"warning: the profile's {spread['passes']} passes disagreed by "
                     f"{_pct(spread['median'])} per point (median), whole grid drifted "
                     f"{spread['drift']:+.1%}: the host changed speed while profiling, "
                     f"and may again before the run (--profile-timing interleaved follows it)")
    between = quality.get("between_steps")
    if interleaved and between is not None and between < 0.5:
        lines.append(f"note: the run was short: {between:.0%} of the profile's measurements "
                     f"fell between its steps, the rest right after it")
    age = quality.get("age_s")
    if quality["source"] == "file" and age is not None and age > STALE_PROFILE_S:
        lines.append(f"warning: the profile is {age / 60:.0f} min old; a shared host's speed "
                     f"moves by several % over minutes: drop --profile to measure it "
                     f"between the run's steps, for a number that reproduces")
    return lines


#: A profile file older than this (seconds) is flagged: the host may have changed speed.
STALE_PROFILE_S = 300.0


def verdict_lines(verdicts: dict, offline: bool = True) -> list[str]:
    """One line per judged error: the error, the floor, how many floors, the verdict; with
    timed arrivals (not ``offline``) the throughput's says it follows the arrivals."""
    names = {"step_median": "step duration (median)", "throughput": "output throughput"}
    lines = []
    for key, v in verdicts.items():
        times = "" if v["times_floor"] is None else f" = {v['times_floor']:.1f}x the floor"
        extra = ""
        if v["verdict"] == WITHIN and v["error"] is not None and v["error"] <= v["target"]:
            extra = f", and within the {_pct(v['target'])} target (the best this host can tell)"
        if v["floor_above_target"]:
            extra += " (the floor itself is above the target)"
        if key == "throughput" and not offline:
            extra += (" (timed arrivals: the throughput follows their rate unless the "
                      "deployment is saturated; --offline judges the model's)")
        lines.append(f"{names.get(key, key)}: error {_fine(v['error'])} against a noise floor "
                     f"of {_fine(v['noise_floor'])}{times}, target {_pct(v['target'])}: "
                     f"{v['verdict'].upper()}{extra}")
    return lines


def breakdown_lines(report: dict) -> list[str]:
    """Per part: mean ms per step, share of the step, and how much it moved between the real
    run and its replay (median per step, and in total)."""
    steps = report["steps"]
    if "parts" not in steps:
        return []
    lines = ["where the time goes (mean per step; run vs replay: median per-step |diff|, total):"]
    for part, row in part_table(steps).items():
        lines.append(f"  {part:<10}{row['mean_s'] * 1e3:8.3f} ms {row['share']:6.1%}   "
                     f"moved {_pct(row.get('step_median_abs_rel_diff'))}, "
                     f"{_signed(row.get('total_signed_rel_diff'))}")
    return lines


def _signed(value) -> str:
    return "n/a" if value is None else f"{value:+.1%}"


def _timing(quality: dict | None) -> str:
    """``, measured between the real steps`` for an interleaved profile, else nothing."""
    return ", measured between the real steps" if (quality or {}).get(
        "timing") == "interleaved" else ""


def headline(report: dict) -> str:
    """``validate tiny-llama on cpu (...), 30 requests, profile: ...``: what was compared."""
    s = report["settings"]
    return (f"validate {s['model']} on {s['device']} ({report['device_name']}), "
            f"{report['num_requests']} requests, profile: {report['profile_source']}"
            f"{_timing(report.get('profile_quality'))}")


def render_table(report: dict) -> str:
    """The error table as plain text."""
    lines = [headline(report), f"{'quantity':<36}{'real':>12}{'sim':>12}  error"]
    lines += [f"{q:<36}{r:>12}{m:>12}  {e}" for q, r, m, e in error_rows(report)]
    return "\n".join(lines + decision_lines(report) + note_lines(report))


def step_figure(report: dict) -> Figure:
    steps = report["steps"]
    x = list(range(len(steps["measured_s"])))
    fig = Figure()
    fig.add_trace(scatter(x=x, y=steps["measured_s"], name="measured (real backend)",
                          mode="lines"))
    fig.add_trace(scatter(x=x, y=steps["predicted_s"], name="predicted (cost model)",
                          mode="lines"))
    fig.update_xaxes(title=dict(text="engine step"))
    fig.update_yaxes(title=dict(text="step duration (s)"))
    return style_figure(fig, "Step durations, aligned by step", legend="bottom")


def scatter_figure(report: dict) -> Figure:
    steps = report["steps"]
    fig = Figure(scatter(x=steps["measured_s"], y=steps["predicted_s"], mode="markers",
                               text=[f"{k}, {b} requests, {t} tokens, {kv} KV tokens"
                                     for k, b, t, kv in zip(
                                         steps["kind"], steps["batch_size"],
                                         steps["scheduled_tokens"], steps["kv_tokens"])],
                               name="steps"))
    top = max(steps["measured_s"] + steps["predicted_s"] + [0.0])
    fig.add_trace(scatter(x=[0, top], y=[0, top], mode="lines", name="exact",
                          line=dict(dash="dot")))
    fig.update_xaxes(title=dict(text="measured (s)"))
    fig.update_yaxes(title=dict(text="predicted (s)"))
    return style_figure(fig, "Predicted vs measured step duration", hovermode="closest")


def _table_html(report: dict) -> str:
    body = "".join(f'<tr><td class="label">{esc(q)}</td><td>{esc(r)}</td><td>{esc(m)}</td>'
                   f"<td>{esc(e)}</td></tr>" for q, r, m, e in error_rows(report))
    return (f'<table class="ranked"><thead><tr><th class="label">quantity</th><th>real</th>'
            f"<th>sim</th><th>error</th></tr></thead><tbody>{body}</tbody></table>"
            + "".join(f"<p>{esc(line)}</p>"
                      for line in decision_lines(report) + note_lines(report)))


def write_html(path: str | os.PathLike, report: dict) -> Path:
    """A self-contained HTML page of the report."""
    m = report["metrics"]["throughput_output_tokens_per_s"]
    sd = report["step_duration"]["all"]
    header = f'<h1>kvsim validation</h1><p class="subtitle">{esc(headline(report))}</p>' + cards([
        card("median step error", fmt_pct(sd["median_abs_rel_error"]), f"{sd['steps']} steps"),
        card("throughput error", fmt_pct(m["rel_error"]), f"real {m['real']:.1f} tok/s"),
        card("decisions", "identical" if report["decisions"]["identical"] else "different",
             "" if report["decisions"]["identical"] else "step sequences differ; see below"),
        *[card(f"{k.replace('_', ' ')} verdict", v["verdict"],
               f"noise floor {_pct(v['noise_floor'])}")
          for k, v in report.get("verdicts", {}).items()],
    ])
    body = (panel("Errors (sim vs real)", _table_html(report))
            + panel("Steps", figure_div(step_figure(report), "steps")
                    + figure_div(scatter_figure(report), "scatter"))
            + panel("Settings", settings_block({"backend": report["settings"],
                                                "engine": report["config"]}, open_=True)))
    return render_page(path, title="kvsim validation", header=header, body=body)


def write_outputs(out_dir: str | os.PathLike, report: dict, html: bool = True) -> dict:
    """Write ``validation.json`` (and ``validation.html``) as the output directory's one
    result (:class:`~kvsim.reports.outdir.OutputDir`); returns their paths."""
    out = Path(out_dir)
    with OutputDir(out):
        paths = {"json": str(write_json_atomic(out / VALIDATION_FILE, report))}
        if html:
            paths["html"] = str(write_html(out / VALIDATION_REPORT, report))
    return paths
