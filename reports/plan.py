"""The capacity planner's outputs: terminal table, progress bar, ``plan.csv``, ``plan.json`` and
a self-contained ``report.html`` (its figures: :mod:`kvsim.reports.plan_figures`).

Everything here reads the plan dict that :func:`kvsim.sim.plan.planner.plan` returns (plain JSON
types); nothing here simulates.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import pandas as pd
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from kvsim.reports.frames import PLAN_CSV, PLAN_FILE, REPORT_FILE
from kvsim.reports.io import write_csv_atomic, write_json_atomic
from kvsim.reports.page import card, cards, esc, figure_div, panel, render_page
from kvsim.reports.plan_figures import (PLAN_FIGURE_IDS, max_rate_figure, max_rate_text,
                                       metric_name, pareto_figure)
from kvsim.reports.style import fmt_count, fmt_num, fmt_pct, fmt_seconds
from kvsim.workloads.request import left_out_text, rows_text
from kvsim.reports.terminal import CountBar, print_table


def latency_keys(result: dict) -> list[str]:
    """The latency columns to show: TTFT/TPOT p99 and every SLO key, in a stable order."""
    keys = ["ttft_p50_s", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s"]
    wanted = set(result["slo"]) | {"ttft_p99_s", "tpot_p99_s"}
    return [k for k in keys if k in wanted] + sorted(set(result["slo"]) - set(keys))


def _money(value: Any) -> str:
    return "—" if value is None else f"${value:,.2f}"


def table_rows(result: dict) -> list[dict[str, str]]:
    """One dict of display strings per candidate, best first (the ranked table's cells)."""
    out = []
    for row in result["candidates"]:
        cells = {"#": str(row["rank"]), "Configuration": row["label"],
                 "Replicas": fmt_num(row["replicas"]), "GPUs": fmt_num(row["gpus"]),
                 "$/hour": _money(row["cost_per_hour_usd"])}
        for key in latency_keys(result):
            cells[metric_name(key)] = fmt_seconds((row["latency"] or {}).get(key))
        cells["Headroom"] = fmt_pct(row["min_headroom"])
        cells["Hit rate"] = fmt_pct(row["hit_rate"])
        cells["Max req/s (1 replica)"] = max_rate_text(row)
        cells["Status"] = "meets SLOs" if row["feasible"] else row["reason"]
        out.append(cells)
    return out


_SHORT = {"Configuration": "Candidate", "Replicas": "Rep-\nlicas", "$/hour": "$/h",
          "Headroom": "Head-\nroom", "Hit rate": "Hit\nrate",
          "Max req/s (1 replica)": "Max req/s\n1 replica"}


_LABEL_WIDTH = 11      # the candidates' column wraps down to this ("a100-80gb" / "TP1")


def plan_table(result: dict, label_width: int | None = None) -> Table:
    """The ranked candidates as a rich table; an infeasible row (dashes) has its reason in a
    note keyed by its rank (see :func:`reason_lines`). ``label_width``: the candidates'
    column at most this wide."""
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", title="kvsim plan",
                  title_justify="left", title_style="bold", pad_edge=False,
                  collapse_padding=True)
    rows = table_rows(result)
    for name in list(rows[0])[:-1] if rows else ():
        cell = name != "Configuration"      # (a number's column, not the candidates')
        table.add_column(_SHORT.get(name, name.replace(" ", "\n")),
                         no_wrap=cell, min_width=None if cell else _LABEL_WIDTH,
                         max_width=None if cell else label_width,
                         justify="right" if cell else "left")
    for i, (cells, row) in enumerate(zip(rows, result["candidates"])):
        cells.pop("Status")
        table.add_row(*cells.values(), style="bold" if i == 0 and row["feasible"] else None)
    return table


def ranked_lines(result: dict) -> list[str]:
    """The ranked table as one line per candidate (``1. a100-80gb TP1: Replicas 1, ...``)."""
    lines = []
    for cells in table_rows(result):
        rank, label = cells.pop("#"), cells.pop("Configuration")
        cells.pop("Status")
        lines.append(f"{rank}. {label}: " + ", ".join(f"{k} {v}" for k, v in cells.items()))
    return lines


def rate_notes(result: dict) -> list[str]:
    """``label: note`` where the sustainable-rate search found no boundary."""
    notes = {}
    for r in result["candidates"]:
        note = (r["max_rate"] or {}).get("note")
        if note:
            notes.setdefault(note, []).append(r["label"])
    return [f"{', '.join(labels)}: {note}" for note, labels in notes.items()]


def reason_lines(result: dict) -> list[str]:
    """``[rank] label: reason`` for every infeasible candidate."""
    return [f"[{r['rank']}] {r['label']}: {r['reason']}" for r in result["candidates"]
            if not r["feasible"]]


def recommendation_text(result: dict) -> str:
    """One paragraph: the recommended deployment, or why there is none."""
    best = result["recommended"]
    if best is None:
        return "No candidate meets every SLO; see the reasons above."
    return (f"Recommended: {best['label']} x {fmt_count(best['replicas'], 'replica')} = "
            f"{fmt_count(best['gpus'], 'GPU')}, {_money(best['cost_per_hour_usd'])}/hour, headroom "
            f"{fmt_pct(best['min_headroom'])}.\n  reproduce: {best['kvsim_run']}")


def block_size_lines(result: dict) -> list[str]:
    """Per GPU: the best block size of the sweep (or that only one was swept, and how to
    sweep more), then the L2 rule of thumb's bound and whether it binds any size swept."""
    return [f"block size on {b['gpu']}: {_best_block_size(b)}; the L2 rule of thumb (not "
            f"simulated: the tokens whose K and V of one layer fill the L2 cache at tp "
            f"{b['tp']}, {b['l2_cache_bytes']:,} B / {b['kv_bytes_per_token_per_layer']:,} B) "
            f"allows up to {b['power_of_two']:,} tokens" + (
                ", so it does not bind" if b['power_of_two'] >= max(b['swept_block_sizes'])
                else f", below the largest size swept ({max(b['swept_block_sizes']):,})")
            for b in result["block_size"]]


def _best_block_size(advice: dict) -> str:
    swept, best = advice["swept_block_sizes"], advice["best_block_size"]
    if len(swept) == 1:
        return (f"{swept[0]} tokens, the only size tried (--block-size 16,32 compares "
                "sizes)")
    chosen = f"best {best} tokens" if best is not None else "none meets the SLOs"
    return f"{chosen} (swept {', '.join(map(str, swept))})"


def load_text(result: dict) -> str:
    """``60 requests at rate scale 8 (15.9 req/s)``, ``... as one burst`` (``--burst``)."""
    load = result["load"]
    rate = load["request_rate_per_s"]
    left_out = load.get("trace_rows_left_out") or {}
    total = sum(left_out.values())
    return (f"{load['num_requests']:,} requests at rate scale {load['rate_scale']:.4g}"
            + ("" if rate is None else f" ({rate:,.2f} req/s)")
            + (" as one burst" if load.get("kind") == "burst" else "")
            + (f" ({rows_text(total, 'trace row')} left out: "
               f"{left_out_text(left_out)})" if total else ""))


def slo_text(result: dict) -> str:
    return ", ".join(f"{metric_name(k)} ≤ {fmt_seconds(v)}" for k, v in result["slo"].items())


def print_plan(result: dict, console: Optional[Console] = None) -> None:
    """Print the ranked table, the recommendation and the block-size comparison."""
    console = console or Console()
    text = dict(highlight=False, soft_wrap=True)    # (unwrapped: the reproduce line pastes)
    console.print(f"trace {result['trace']} · model {result['model']} · {load_text(result)} · "
                  f"SLO {slo_text(result)}", **text)
    narrowest = plan_table(result, label_width=_LABEL_WIDTH)   # (its width, unconstrained)
    if Measurement.get(console, console.options.update_width(10_000), narrowest).maximum \
            <= console.width:
        print_table(plan_table(result), console)
    else:       # (too narrow: the table cuts its cells, the candidates' names first)
        console.print("kvsim plan", style="bold", highlight=False)
        for line in ranked_lines(result):
            console.print(line, highlight=False)
    for line in reason_lines(result) + rate_notes(result):
        console.print(line, **text)
    console.print(recommendation_text(result), **text)
    for line in block_size_lines(result):
        console.print(line, **text)


class PlanProgress:
    """``with PlanProgress(enabled) as p: p.update(done, total, row)``: one line per finished
    candidate on stderr (its verdict), under a bar of candidates done when stderr is a
    terminal; nothing when not ``enabled``."""

    def __init__(self, enabled: bool, console: Optional[Console] = None):
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self._bar = CountBar("planning", "candidates", self.console)

    def __enter__(self) -> "PlanProgress":
        if self.enabled:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)

    def update(self, done: int, total: int, row: dict | None = None) -> None:
        if not self.enabled:
            return
        if row is not None:      # (whole lines in a log: wrapped on a terminal only)
            self.console.print(f"kvsim: plan: [{done}/{total}] {candidate_line(row)}",
                               highlight=False, markup=False,
                               soft_wrap=not self.console.is_terminal)
        self._bar.update(done, total)       # (redrawn with its line)


def candidate_line(row: dict) -> str:
    """``a100-80gb TP1: 3 replicas, $9.12/h`` or ``h100-80gb TP2: infeasible (reason)``."""
    if row.get("feasible"):
        return (f"{row['label']}: meets the SLOs with {fmt_count(row['replicas'], 'replica')}, "
                f"{_money(row.get('cost_per_hour_usd'))}/h")
    return f"{row['label']}: no ({row.get('reason') or 'misses an SLO'})"


def plan_frame(result: dict) -> pd.DataFrame:
    """``plan.csv``: one row of raw numbers per candidate, best first."""
    records = []
    for row in result["candidates"]:
        rec = {"rank": row["rank"], "label": row["label"], **row["settings"],
               "feasible": row["feasible"], "replicas": row["replicas"], "gpus": row["gpus"],
               "price_per_gpu_hour_usd": row["price_per_gpu_hour_usd"],
               "cost_per_hour_usd": row["cost_per_hour_usd"]}
        rec.update({k: (row["latency"] or {}).get(k) for k in latency_keys(result)})
        rate = row["max_rate"] or {}
        rec.update(min_headroom=row["min_headroom"], hit_rate=row["hit_rate"],
                   max_request_rate_per_s=rate.get("request_rate_per_s"),
                   failing_request_rate_per_s=rate.get("failing_request_rate_per_s"),
                   max_request_rate_note=rate.get("note"), reason=row["reason"])
        records.append(rec)
    frame = pd.DataFrame(records)
    for column in ("rank", "replicas", "gpus"):     # (counts stay counts where some are blank)
        if column in frame:
            frame[column] = frame[column].astype("Int64")
    return frame


def write_plan_outputs(out_dir: str | os.PathLike, result: dict,
                       html: bool = True) -> dict[str, Path]:
    """Write ``plan.csv``, ``report.html`` (when ``html``) and ``plan.json`` last, each
    atomically, into ``out_dir``; returns ``{name: path}``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / PLAN_FILE).unlink(missing_ok=True)
    written = {"csv": write_csv_atomic(out / PLAN_CSV, plan_frame(result))}
    if html:
        written["report"] = render_plan_report(result, out / REPORT_FILE)
    written["plan"] = write_json_atomic(out / PLAN_FILE, result)
    return written


# --- figures and the HTML page -------------------------------------------------------------

_WRAP = ' style="white-space:normal;min-width:22em"'


def _table_html(result: dict) -> str:
    rows = table_rows(result)
    if not rows:
        return '<p class="note">No candidates.</p>'
    head = "".join(f'<th class="label">{esc(k)}</th>' if k in ("Configuration", "Status")
                   else f"<th>{esc(k)}</th>" for k in rows[0])
    body = []
    for i, (cells, row) in enumerate(zip(rows, result["candidates"])):
        tds = "".join(
            f'<td class="{"label" if k in ("Configuration", "Status") else ""}'
            f'{" bad" if k == "Status" and not row["feasible"] else ""}"'
            f'{_WRAP if k == "Status" else ""}>{esc(v)}</td>' for k, v in cells.items())
        cls = ' class="best"' if i == 0 and row["feasible"] else ""
        body.append(f"<tr{cls}>{tds}</tr>")
    return (f'<div class="table-scroll"><table class="ranked" id="plan-table"><thead><tr>'
            f'{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>')


def _header(result: dict) -> str:
    best = result["recommended"]
    items = [card("Recommended", best["label"] if best else "none",
                  f"x {_replicas(best['replicas'])}" if best else "no candidate meets the SLOs",
                  "good" if best else "bad")]
    if best:
        items += [card("GPUs", fmt_num(best["gpus"]), _replicas(best["replicas"])),
                  card("Cost", f"{_money(best['cost_per_hour_usd'])}/h", "replicas x TP x price"),
                  card("Headroom", fmt_pct(best["min_headroom"]), "tightest SLO")]
    return (f"<h1>kvsim capacity plan</h1><p class=\"subtitle\">Trace <b>{esc(result['trace'])}"
            f"</b> · model <b>{esc(result['model'])}</b> · {esc(load_text(result))} · SLO "
            f"<b>{esc(slo_text(result))}</b></p>{cards(items)}"
            + (f'<p class="note">Reproduce: <code>{esc(best["kvsim_run"])}</code></p>'
               if best else ""))


def render_plan_report(result: dict, path: str | os.PathLike, *,
                       plotlyjs: str = "inline") -> Path:
    """Write the plan's interactive report (ranked table, Pareto front, sustainable rates,
    block sizes, definitions) to ``path``; returns the path."""
    defs = result["definitions"]
    body = [
        panel("Ranking", _table_html(result), "Cheapest deployment meeting every SLO first."),
        panel("Cost vs latency", figure_div(pareto_figure(result), PLAN_FIGURE_IDS[0]),
              "Every replica count the search simulated at the planned load."),
        panel("Sustainable rate", figure_div(max_rate_figure(result), PLAN_FIGURE_IDS[1])
              + "".join(f'<p class="note">{esc(line)}</p>' for line in rate_notes(result)),
              defs["sustainable"]),
        panel("Block size", "".join(f"<p>{esc(line)}</p>" for line in block_size_lines(result))),
        panel("Definitions", "".join(f"<p><b>{esc(k)}</b>: {esc(v)}</p>"
                                     for k, v in defs.items())),
    ]
    return render_page(path, title="kvsim plan", header=_header(result), body="".join(body),
                       plotlyjs=plotlyjs)


def _replicas(n: int) -> str:
    return f"{n} replica" + ("" if n == 1 else "s")
