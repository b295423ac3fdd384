"""Interactive HTML reports (plotly) that open offline.

- :func:`render_run_report`: one run (``report.html`` of ``kvsim run`` / ``kvsim report``);
- :func:`render_compare_report`: several runs overlaid (``kvsim compare``);
- :func:`render_hitrate_report`: miss-ratio curves per policy (``kvsim hitrate``).

Each writes the page atomically and returns its path. Timelines are downsampled to
``max_points`` rows first so that large runs stay light.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from kvsim.reports import figures as figs
from kvsim.reports import phases
from kvsim.reports.columns import Columns, as_columns
from kvsim.reports.downsampling import DEFAULT_MAX_POINTS, downsample
from kvsim.reports.frames import HITRATE_FILE, HITRATE_REPORT
from kvsim.reports.io import write_json_atomic
from kvsim.reports.outdir import OutputDir
from kvsim.reports.page import cards, card, esc, figure_div, panel, render_page, settings_block
from kvsim.reports.style import (fmt_num, fmt_pct, fmt_seconds, fmt_seconds_alike, get,
                                 left_out_summary_text, no_lookup_text, parse_slo,
                                 preemption_text,
                                 rejected_text, slo_met, stopped_text, tier_text, truncated_text)
from kvsim.workloads.request import trace_name

if TYPE_CHECKING:
    import pandas as pd

#: div ids of the figures in a run report, in page order.
RUN_FIGURE_IDS = ("fig-latency-cdf", "fig-time-split", "fig-throughput-queue", "fig-kv-pool",
                  "fig-frag-time", "fig-frag-bar", "fig-prefix-hit-rate", "fig-events")
#: div ids of the figures in a compare report, in page order.
COMPARE_FIGURE_IDS = ("fig-tradeoff", "fig-latency-cdf", "fig-throughput-queue", "fig-kv-usage",
                      "fig-frag-bar", "fig-prefix-hit-rate", "fig-events")
#: div ids of the figures in a hit-rate report.
HITRATE_FIGURE_IDS = ("fig-miss-ratio",)


def _slo_status(summary: dict, metric: str, slo: dict | None) -> str | None:
    """'good'/'bad' for a latency card when an SLO target exists for ``metric``."""
    for m, pct, target in parse_slo(slo):
        if m == metric:
            return "good" if slo_met(summary, metric, pct, target) else "bad"
    return None


def summary_cards(summary: dict, slo: dict | None = None) -> str:
    """The grid of headline numbers for one run."""
    def lat(metric: str, name: str) -> str:
        return card(f"{name} p50 / p99",
                    " / ".join(fmt_seconds_alike([get(summary, metric, "p50"),
                                                  get(summary, metric, "p99")])),
                    f"mean {fmt_seconds(get(summary, metric, 'mean'))}",
                    _slo_status(summary, metric, slo))
    hits, queries = get(summary, "prefix_cache", "hit_tokens"), get(summary, "prefix_cache",
                                                                     "queries_tokens")
    return cards([
        card("Output throughput", f"{fmt_num(get(summary, 'throughput_output_tokens_per_s'))} "
             "tok/s", f"{fmt_num(get(summary, 'request_throughput_per_s'), 2)} req/s"
             + _input_total(summary)),
        card("Completed", f"{fmt_num(get(summary, 'num_completed'))} / "
             f"{fmt_num(get(summary, 'num_requests'))}",
             f"in {fmt_seconds(get(summary, 'duration_s'))} simulated, "
             f"{fmt_num(get(summary, 'num_steps'))} steps"),
        lat("ttft_s", "TTFT"), lat("tpot_s", "TPOT"), lat("e2e_s", "E2E"),
        card("Prefix hit rate", fmt_pct(get(summary, "prefix_cache", "hit_rate")),
             f"{fmt_num(hits)} of {fmt_num(queries)} tokens") if queries != 0 else
        card("Prefix hit rate", "—", f"no prefix lookups ({no_lookup_text(summary)})"),
        card("Preemptions", fmt_num(get(summary, "preemptions")), preemption_text(summary)),
        card("Peak KV usage", fmt_pct(get(summary, "kv", "peak_usage")),
             f"mean {fmt_pct(get(summary, 'kv', 'mean_usage'))} of "
             f"{fmt_num(get(summary, 'kv', 'num_gpu_blocks'))} blocks"),
        card("Cached idle KV", fmt_pct(get(summary, "kv", "mean_cached_idle_fraction")),
             "mean share of the pool cached but held by no request (counted as free): what "
             "an eviction policy chooses among"),
        *_tier_cards(summary),
    ])


def _input_total(summary: dict) -> str:
    """`` · input 1,234 · total 5,678 tok/s`` where the summary has them (newer runs)."""
    inp = get(summary, "throughput_input_tokens_per_s")
    tot = get(summary, "throughput_total_tokens_per_s")
    if inp is None or tot is None:
        return ""
    return f" · input {fmt_num(inp)} · total {fmt_num(tot)} tok/s"


def _tier_cards(summary: dict) -> list[str]:
    """The host tier's card, when the run had one."""
    blocks = get(summary, "tiering", "num_cpu_blocks")
    if not blocks:
        return []
    return [card("Host tier", f"{fmt_pct(get(summary, 'tiering', 'peak_host_usage'))} peak",
                 f"of {fmt_num(blocks)} blocks · {tier_text(summary)}")]


def _subtitle(summary: dict, config: dict) -> str:
    """``Trace X · model Y · GPU × TP × replicas · block size · eviction``, present parts only."""
    parts = []
    if config.get("trace") is not None:
        parts.append(("Trace", Path(trace_name(config["trace"])).name))
    if config.get("model") is not None:     # (the name it resolved to)
        parts.append(("model", get(summary, "model", "name") or config["model"]))
    if config.get("gpu") is not None:
        tp, replicas = config.get("tp"), config.get("replicas")
        hw = str(config["gpu"]) + (f" × TP{tp}" if tp not in (None, 1) else "")
        parts.append(("", hw + (f" × {replicas} replicas" if replicas not in (None, 1) else "")))
    block = config.get("block_size", get(summary, "kv", "block_size"))
    if block is not None:
        parts.append(("block size", block))
    caching = config.get("enable_prefix_caching", True) and config.get("layout") != "contiguous"
    for key in ("eviction",) * caching + ("layout",):    # (no eviction without caching)
        if config.get(key) is not None:
            parts.append((key, config[key]))
    return " · ".join(f"{esc(k)} <b>{esc(v)}</b>".strip() for k, v in parts)


def run_header(summary: dict, slo: dict | None) -> str:
    """Title, the trace/model/GPU line, summary cards and every setting."""
    config = get(summary, "config", default={}) or {}
    targets = parse_slo(slo)
    slo_note = ""
    if targets:
        slo_note = ('<p class="note">SLO targets: ' + ", ".join(
            f"{esc(m.replace('_s', '').upper())} p{p:g} ≤ {esc(fmt_seconds(t))}"
            for m, p, t in targets) + "</p>")
    warnings = "".join(f'<p class="note"><b>{esc(name.capitalize())}:</b> {esc(text)}</p>'
                       for name, text in (("left out", left_out_summary_text(summary)),
                                          ("rejected", rejected_text(summary)),
                                          ("truncated", truncated_text(summary)),
                                          ("cut by length", stopped_text(summary))) if text)
    return (f"<h1>kvsim run report</h1><p class=\"subtitle\">{_subtitle(summary, config)}</p>"
            f"{warnings}{summary_cards(summary, slo)}{slo_note}"
            f"{settings_block(config, open_=True)}")


def _interval_note(timeline: Columns) -> str:
    """How long an interval of the per-interval counts is (timeline.csv's ``interval_s``)."""
    if "interval_s" not in timeline or not len(timeline):
        return ""
    return (f"Counts per interval of {fmt_seconds(float(timeline['interval_s'][0]))} "
            "of simulated time (the last may be shorter).")


def _downsample_note(before: int, after: int) -> str:
    if before == after:
        return ""
    return (f'<p class="note">Timeline shown at {after:,} points (downsampled from '
            f"{before:,} intervals).</p>")


def render_run_report(summary: dict, requests: pd.DataFrame | Columns,
                      timeline: pd.DataFrame | Columns,
                      path: str | os.PathLike, slo: dict | None = None, *,
                      plotlyjs: str = "inline", max_points: int = DEFAULT_MAX_POINTS) -> Path:
    """Write the interactive report of one run to ``path``; returns the path.

    ``slo`` (e.g. ``{"ttft_p99_s": 0.5}``) defaults to ``summary["slo"]``; ``plotlyjs`` is
    ``"inline"`` (self-contained page) or ``"sibling"`` (``plotly.min.js`` beside the page).
    """
    slo = summary.get("slo") if slo is None else slo
    requests, timeline = as_columns(requests), as_columns(timeline)
    tl = downsample(timeline, max_points)
    runs_tl = [("run", tl)]
    body = [
        panel("Latency", figure_div(figs.latency_cdf_figure([("run", requests)], slo),
                                    RUN_FIGURE_IDS[0]),
              "Cumulative distribution over completed requests"
              + ("; dashed lines mark SLO targets." if parse_slo(slo) else ".")),
        panel("Where time goes", figure_div(phases.time_split_figure(requests),
                                            RUN_FIGURE_IDS[1]),
              phases.time_split_note(requests)),
        panel("Throughput and queue", figure_div(figs.throughput_queue_figure(runs_tl),
                                                 RUN_FIGURE_IDS[2])),
        panel("KV cache pool", figure_div(figs.kv_pool_figure(
            tl, get(summary, "kv", "num_gpu_blocks"), get(summary, "config", "replicas") or 1),
            RUN_FIGURE_IDS[3]),
              "Blocks used by running requests, cached but idle (reusable prefixes), and empty "
              "(free and holding nothing); with replicas, all replicas' pools together."),
        panel("Fragmentation", '<div class="grid-3-1">'
              + figure_div(figs.fragmentation_time_figure(tl), RUN_FIGURE_IDS[4])
              + figure_div(figs.fragmentation_bar_figure(
                  [("this run", get(summary, "fragmentation", default={}))]), RUN_FIGURE_IDS[5])
              + "</div>",
              "Shares of the GPU KV pool: slots holding tokens, reserved for tokens still to "
              "come, lost inside blocks (internal), unusable free space (external), free."),
        panel("Prefix cache", figure_div(figs.hit_rate_figure(runs_tl), RUN_FIGURE_IDS[6])),
        panel("Preemptions and transfers", figure_div(figs.events_figure(tl), RUN_FIGURE_IDS[7]),
              _interval_note(tl)),
        _downsample_note(len(timeline), len(tl)),
    ]
    title = " · ".join(["kvsim", Path(str(get(summary, "config", "trace", default="run"))).name,
                        *(str(v) for v in (get(summary, "model", "name"),
                                           get(summary, "config", "gpu")) if v)])
    return render_page(path, title=title, header=run_header(summary, slo), body="".join(body),
                       plotlyjs=plotlyjs)


def render_compare_report(runs: Sequence[tuple[str, dict, pd.DataFrame | Columns,
                                               pd.DataFrame | Columns]],
                          path: str | os.PathLike, slo: dict | None = None, *,
                          plotlyjs: str = "inline", max_points: int = DEFAULT_MAX_POINTS,
                          pages: dict[str, str] | None = None) -> Path:
    """Write a report overlaying several runs, given as ``(label, summary, requests,
    timeline)``; returns the path. Runs are ranked (SLO met first, then throughput); ``slo``
    defaults to the first run's ``summary["slo"]`` and applies to every run; ``pages``: each
    run's own report, relative to this one (the ranking links them)."""
    from kvsim.reports import across_runs as cmp
    runs = [(str(label), s, as_columns(r), downsample(as_columns(t), max_points))
            for label, s, r, t in runs]
    slo = cmp.common_slo(runs, slo)
    tls = [(label, t) for label, _, _, t in runs]
    facts = cmp.describe_runs(runs)
    header = (f"<h1>kvsim comparison</h1><p class=\"subtitle\"><b>{facts['count']}</b> "
              f"configurations · trace <b>{esc(', '.join(facts['traces']))}</b> · model "
              f"<b>{esc(', '.join(facts['models']))}</b> · GPU "
              f"<b>{esc(', '.join(facts['gpus']))}</b></p>")
    body = [
        panel("Ranking", cmp.ranked_table(runs, slo, pages),
              "Best first: runs meeting their SLO targets, then by output throughput. "
              "Setting columns show what differs between runs."),
        panel("Throughput vs tail latency", figure_div(cmp.tradeoff_scatter(runs, slo),
                                                       COMPARE_FIGURE_IDS[0])),
        panel("Latency", figure_div(figs.latency_cdf_figure(
            [(label, r) for label, _, r, _ in runs], slo), COMPARE_FIGURE_IDS[1])),
        panel("Throughput and queue", figure_div(figs.throughput_queue_figure(tls),
                                                 COMPARE_FIGURE_IDS[2])),
        panel("KV usage", figure_div(cmp.kv_usage_overlay(tls), COMPARE_FIGURE_IDS[3])),
        panel("Fragmentation", figure_div(figs.fragmentation_bar_figure(
            [(label, get(s, "fragmentation", default={})) for label, s, _, _ in runs]),
            COMPARE_FIGURE_IDS[4])),
        panel("Prefix cache", figure_div(figs.hit_rate_figure(tls), COMPARE_FIGURE_IDS[5])),
        panel("Preemptions and transfers", figure_div(cmp.events_overlay(tls),
                                                      COMPARE_FIGURE_IDS[6])),
        panel("Settings", "".join(settings_block(get(s, "config", default={}), f"{label}")
                                  for label, s, _, _ in runs)),
    ]
    title = " · ".join(["kvsim comparison", *facts["traces"]])
    return render_page(path, title=title, header=header, body="".join(body),
                       plotlyjs=plotlyjs)


def render_hitrate_report(curves: pd.DataFrame, path: str | os.PathLike, *,
                          title: str = "kvsim hit-rate curves", config: dict | None = None,
                          plotlyjs: str = "inline") -> Path:
    """Write miss-ratio curves (``curves``: columns policy, capacity_blocks, hit_rate)."""
    from kvsim.reports import across_runs as cmp
    # (in the order asked for)
    policies = list(dict.fromkeys(curves["policy"].astype(str))) if "policy" in curves else []
    config = config or {}
    what = [f"trace <b>{esc(trace_name(config['trace']))}</b>"] if config.get("trace") else []
    what += [text.format(fmt_num(config[k])) for k, text in (
        ("num_requests", "<b>{}</b> requests"), ("block_size", "<b>{}</b>-token blocks"))
        if k in config]
    header = (f"<h1>{esc(title)}</h1><p class=\"subtitle\">"
              + " · ".join([*what, f"<b>{len(policies)}</b> policies · "
                                   f"<b>{esc(', '.join(policies)) or 'none'}</b>"])
              + "</p>" + (settings_block(config) if config else ""))
    if config.get("trace"):
        title = f"{title} · {trace_name(config['trace'])}"
    body = [
        panel("Miss-ratio curves", figure_div(cmp.miss_ratio_figure(curves),
                                              HITRATE_FIGURE_IDS[0]),
              "Fraction of looked-up prompt tokens not found in the cache, by cache capacity "
              "(lower is better)."),
        panel("Hit rate by capacity", cmp.hitrate_table(curves)),
    ]
    return render_page(path, title=title, header=header, body="".join(body), plotlyjs=plotlyjs)


def write_hitrate_outputs(result: dict, out: Path, html: bool = True,
                          option: str = "--out") -> dict[str, Path]:
    """``hitrate.json`` (and ``hitrate.html``) of a hit-rate replay's ``result`` into the
    output directory ``out`` (given as ``option``), as ``kvsim hitrate --out`` writes them;
    ``{name: path}``."""
    import pandas as pd
    written = {}
    files = (HITRATE_FILE, HITRATE_REPORT) if html else (HITRATE_FILE,)
    with OutputDir(out, option=option, reads=[result.get("trace")], writes=files):
        if html:
            written["report"] = render_hitrate_report(
                pd.DataFrame(result["rows"]), out / HITRATE_REPORT,
                config={k: v for k, v in result.items() if k != "rows"})
        written["json"] = write_json_atomic(out / HITRATE_FILE, result)
    return written
