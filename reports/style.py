"""Shared look of every report figure, and number formatting for people."""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

from kvsim.reports.frames import SUMMARY_PERCENTILES
from kvsim.reports.plot import Figure, template
from kvsim.workloads.request import left_out_text, rows_text

FONT = "Inter, system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
#: One colour per run in comparison views (colour-blind friendly, Okabe-Ito-like).
SERIES = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
          "#000000", "#7F7F7F", "#8C564B"]
KV_COLORS = {"used": "#2563eb", "cached_idle": "#f59e0b", "free": "#d1d5db", "host": "#7c3aed"}
FRAG_COLORS = {"token_states": "#2563eb", "reservation": "#60a5fa", "internal": "#f97316",
               "external": "#dc2626", "free": "#d1d5db"}
FRAG_LABELS = {"token_states": "Token states", "reservation": "Reservation",
               "internal": "Internal frag.", "external": "External frag.", "free": "Free"}
FRAG_KEYS = tuple(FRAG_LABELS)


def series_color(i: int) -> str:
    """Colour of the ``i``-th run in a comparison."""
    return SERIES[i % len(SERIES)]


LEGENDS = {
    "right": dict(orientation="v", yanchor="top", y=1, xanchor="left", x=1.01),
    "bottom": dict(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0),
}


def style_figure(fig: Figure, title: str | None = None, height: int = 380,
                 hovermode: str = "x unified", legend: str = "right") -> Figure:
    """Apply the report look (plotly's white template, readable font, legend beside or below
    the plot so it never covers subplot titles) in place."""
    fig.layout["template"] = template("plotly_white")    # (shared and read only: not copied)
    fig.update_layout(
        height=height, hovermode=hovermode,
        font=dict(family=FONT, size=13, color="#1f2937"),
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=16)) if title else None,
        margin=dict(l=60, r=24, t=70 if title else 36, b=50),
        legend=dict(LEGENDS[legend], font=dict(size=12)),
        paper_bgcolor="white", plot_bgcolor="white",
    )
    fig.update_xaxes(showline=True, linecolor="#d1d5db", gridcolor="#f1f5f9", zeroline=False)
    fig.update_yaxes(showline=True, linecolor="#d1d5db", gridcolor="#f1f5f9", zeroline=False)
    return fig


def empty_figure(title: str, message: str, height: int = 240) -> Figure:
    """A figure with no traces and ``message`` in the middle (for runs without data)."""
    fig = Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper",
                       yref="paper", font=dict(size=15, color="#6b7280"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return style_figure(fig, title, height=height, hovermode="closest")


def is_number(value: Any) -> bool:
    """True for a finite int/float (numpy included), False for None, NaN, strings."""
    try:
        return value is not None and not isinstance(value, bool) and math.isfinite(value)
    except TypeError:
        return False


def fmt_seconds(value: Any) -> str:
    """``0.0123`` → ``12.3 ms``; ``4.5`` → ``4.50 s``; ``None``/NaN → ``—``."""
    if not is_number(value):
        return "—"
    v = float(value)
    if abs(v) < 1e-3 and v != 0:
        return f"{v * 1e6:.0f} µs"
    if abs(v) < 1:
        return f"{v * 1e3:.1f} ms"
    if abs(v) < 120:
        return f"{v:.2f} s"
    if abs(v) < 7200:
        return f"{v / 60:.1f} min"
    return f"{v / 3600:.2f} h"


def preemption_text(summary: dict) -> str:
    """How requests were preempted: ``swapped out 3 / in 3 blocks`` with swap preemption (or
    blocks swapped), else ``by recompute`` (vLLM v1's only way)."""
    out, back = get(summary, "swapped_out_blocks"), get(summary, "swapped_in_blocks")
    if get(summary, "config", "preemption_mode") == "swap" or out or back:
        return f"swapped out {fmt_num(out)} / in {fmt_num(back)} blocks"
    return "by recompute"


def fmt_count(n: Any, noun: str) -> str:
    """``1 replica``, ``2 replicas``."""
    return f"{fmt_num(n)} {noun}" + ("" if n == 1 else "s")


#: :func:`fmt_seconds`' units: (name, seconds, decimals, the largest value shown in it).
_TIME_UNITS = (("µs", 1e-6, 0, 1e-3), ("ms", 1e-3, 1, 1.0), ("s", 1.0, 2, 120.0),
               ("min", 60.0, 1, 7200.0), ("h", 3600.0, 2, math.inf))


def fmt_seconds_alike(values: Sequence[Any]) -> list[str]:
    """Times shown together (a row's p50 / p90 / p99) in one unit, the one :func:`fmt_seconds`
    gives the largest, with its decimals; a value below 1 in it keeps three significant
    digits (``0.619 s / 1.71 s``, not ``618.6 ms / 1.71 s``), one below 0.1 its own unit
    (``22.7 ms / 7.1 min``, not ``0.000378 min``)."""
    finite = [abs(float(v)) for v in values if is_number(v)]
    if not finite or max(finite) == 0:
        return [fmt_seconds(v) for v in values]
    name, scale, decimals, _ = next(u for u in _TIME_UNITS if max(finite) < u[3])
    out = []
    for v in values:
        if not is_number(v):
            out.append("—")
            continue
        x = float(v) / scale
        if 0 < abs(x) < 0.1:
            out.append(fmt_seconds(v))
            continue
        text = f"{x:.{max(decimals, 2 - math.floor(math.log10(abs(x))))}f}" if x else ""
        if not text or abs(float(text)) >= 1:       # (0.9996 s shows as 1.00 s)
            text = f"{x:.{decimals}f}"
        out.append(f"{text} {name}")
    return out


def fmt_pct(value: Any, digits: int = 1) -> str:
    """``0.1234`` → ``12.3%``."""
    return f"{float(value) * 100:.{digits}f}%" if is_number(value) else "—"


def fmt_num(value: Any, digits: int = 1) -> str:
    """Thousands separators, ``digits`` decimals for non-integers; ``—`` when missing."""
    if not is_number(value):
        return "—"
    v = float(value)
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:,.{digits}f}"


def fmt_bytes(value: Any) -> str:
    """``512 B``, ``1.5 KiB`` ... ``2.0 TiB``; ``-`` for a missing value."""
    if not is_number(value):
        return "-"
    n = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def get(d: Any, *keys: str, default: Any = None) -> Any:
    """Nested ``dict`` lookup that tolerates missing levels: ``get(s, 'ttft_s', 'p99')``."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def tier_text(summary: dict) -> str:
    """Host hits (of first admissions: a resumed request's loads are copies to the GPU too),
    bytes each way, copy time and the blocks the host had no room for, of a run with a host
    tier."""
    t = get(summary, "tiering", default={}) or {}
    dropped = t.get("dropped_blocks") or 0
    return (f"host hits {fmt_num(get(summary, 'prefix_cache', 'host_hit_tokens'))} tokens "
            f"on first admission · to host {fmt_bytes(t.get('bytes_to_host'))} · "
            f"to GPU {fmt_bytes(t.get('bytes_to_device'))} · "
            f"copies {fmt_seconds(t.get('transfer_time_s'))}"
            + (f" · {fmt_num(dropped)} block stores refused (no room; each try counts)"
               if dropped else ""))


def no_lookup_text(summary: dict) -> str:
    """Why a run made no prefix lookup: caching off, a contiguous layout (which looks nothing
    up), or no request admitted."""
    if get(summary, "config", "enable_prefix_caching") is False:
        return "prefix caching off"
    if get(summary, "config", "layout") == "contiguous":
        return "a contiguous layout looks nothing up"
    if summary.get("num_requests") and summary.get("num_rejected") == summary.get("num_requests"):
        return "every request was rejected"
    return "no request was admitted"


def rejected_text(summary: dict) -> str:
    """Why requests were rejected and what to do, or ``""`` when none were."""
    n = summary.get("num_rejected") or 0
    if not n:
        return ""
    limit = get(summary, "kv", "max_model_len")
    limit_text = f" {fmt_num(limit)}" if limit else ""
    advice = long_prompt_advice(max_model_len_limit(summary),
                                get(summary, "config", "num_gpu_blocks") is not None)
    return (f"{fmt_num(n)} of {fmt_num(summary.get('num_requests'))} requests: prompt of "
            f"max_model_len{limit_text} tokens or more ({advice})")


def max_model_len_limit(summary: dict) -> str:
    """What set the run's max_model_len (``kv.max_model_len_limit``: given, model or kv_pool);
    for a summary written before kvsim said so, judged from the pool's tokens."""
    said = get(summary, "kv", "max_model_len_limit")
    if said:
        return said
    limit, context = get(summary, "kv", "max_model_len"), get(summary, "model", "max_model_len")
    pool = (get(summary, "kv", "num_gpu_blocks") or 0) * (get(summary, "kv", "block_size") or 0)
    if is_number(limit) and pool and limit >= pool:
        return "kv_pool"
    return "model" if is_number(limit) and limit == context else "given"


def long_prompt_advice(limit: str, blocks_given: bool) -> str:
    """What to do about prompts of ``max_model_len`` tokens or more, by what set it
    (``limit``: ``given``, ``model``, ``kv_pool``, ``model+kv_pool``; ``blocks_given``:
    ``--num-gpu-blocks``)."""
    if limit == "model+kv_pool":
        return ("that is both the model's own context and the longest request the KV pool "
                "holds: pass --long-prompt truncate, or choose a model with a longer context "
                "and give it more KV memory")
    if limit == "model":
        return ("that is the model's own context: pass --long-prompt truncate, choose a "
                "model with a longer one, or raise --max-model-len past it, which vLLM allows "
                "with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    if limit != "kv_pool":
        return "raise --max-model-len, or pass --long-prompt truncate"
    more = "raise --num-gpu-blocks" if blocks_given else (
        "give the KV cache more memory: a larger --gpu, more --tp or a higher "
        "--gpu-memory-utilization")
    return f"the KV pool holds no longer request: {more}, or pass --long-prompt truncate"


def stopped_text(summary: dict) -> str:
    """How many completed requests max_model_len ended before their output budget."""
    n = summary.get("num_stopped_by_length") or 0
    return (f"{fmt_num(n)} requests ended at max_model_len before their requested output "
            "(finish_reason length in requests.csv)") if n else ""


def left_out_summary_text(summary: dict) -> str:
    """The trace's rows that held no request to run, by reason, or ``""`` when none did."""
    left_out = summary.get("trace_rows_left_out") or {}
    total = sum(left_out.values())
    return (f"{rows_text(total, 'trace row')} without a request to run: "
            f"{left_out_text(left_out)}") if total else ""


def truncated_text(summary: dict) -> str:
    """How many requests were cut to fit ``max_model_len`` (``--long-prompt truncate``)."""
    n = summary.get("num_truncated") or 0
    return f"{fmt_num(n)} requests cut to fit max_model_len (as Vidur does)" if n else ""


_SLO_KEY = re.compile(r"^(ttft|tpot|e2e)_p(\d+(?:\.\d+)?)_s$")


def parse_slo(slo: dict | None) -> list[tuple[str, float, float]]:
    """``{'ttft_p99_s': 0.5}`` → ``[('ttft_s', 99.0, 0.5)]``; unknown keys are ignored."""
    out = []
    for key, target in (slo or {}).items():
        m = _SLO_KEY.match(str(key))
        if m and is_number(target):
            out.append((f"{m.group(1)}_s", float(m.group(2)), float(target)))
    return out


def slo_met(summary: dict, metric: str, pct: float, target: float) -> bool:
    """Whether a run meets ``pNN <= target`` on ``metric`` (``ttft_s``) over all its requests,
    those that never completed (rejected, unfinished) counting as misses: the completed ones
    must then meet it at the higher percentile ``NN x all / completed``, judged by the
    summary's percentile at or above that one (so a missed target is never called met)."""
    n, done = summary.get("num_requests"), summary.get("num_completed")
    if not (is_number(n) and is_number(done)):     # (counts not recorded: all completed)
        n = done = 1
    if not done:
        return False
    needed = pct * n / done if n > done else pct
    held = [p for p in SUMMARY_PERCENTILES if p >= needed]
    at = f"p{pct:g}" if n <= done else (f"p{held[0]}" if held else None)
    value = get(summary, metric, at) if at else None
    return is_number(value) and float(value) <= target
