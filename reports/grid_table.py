"""The terminal table of ``kvsim compare``: one line per configuration, from the summaries.

Columns: configuration, output throughput, TTFT p50/p99, TPOT p50/p99, prefix hit rate,
preemptions, mean batch size, fragmentation (token states / internal / external shares of the
GPU KV pool) and bytes moved (see :func:`bytes_moved`).
"""

from __future__ import annotations

from typing import Any, Sequence

from kvsim.reports.style import fmt_bytes, fmt_num, fmt_pct, fmt_seconds_alike, get, is_number

#: Name stems of the transfer kinds whose byte counters :func:`bytes_moved` adds up.
TRANSFER_STEMS = ("swap", "offload", "promot", "compact", "to_host", "to_device")


def bytes_moved(summary: dict) -> int:
    """Bytes copied by swaps, offloads, promotions and compactions, from the summary's keys.

    Adds every number (outside ``config``, at any depth) whose key contains ``bytes`` and one
    of :data:`TRANSFER_STEMS`, but not ``per`` (so ``swap_out_bytes``, ``offload_bytes`` or
    ``compaction_bytes_moved`` or ``tiering.bytes_to_host`` count; ``bytes_per_block`` does
    not). 0 when there are none.
    """
    def walk(node: Any) -> float:
        total = 0.0
        for key, value in node.items():
            name = str(key).lower()
            if isinstance(value, dict) and name != "config":
                total += walk(value)
            elif (is_number(value) and not isinstance(value, bool) and "bytes" in name
                  and "per" not in name and any(s in name for s in TRANSFER_STEMS)):
                total += float(value)
        return total
    return int(walk(summary))


def table_metrics(summary: dict) -> dict:
    """The numbers of one table line (``None`` where the summary has no value)."""
    frag = get(summary, "fragmentation", default={}) or {}
    return {
        "throughput_output_tokens_per_s": get(summary, "throughput_output_tokens_per_s"),
        "ttft_p50_s": get(summary, "ttft_s", "p50"), "ttft_p99_s": get(summary, "ttft_s", "p99"),
        "tpot_p50_s": get(summary, "tpot_s", "p50"), "tpot_p99_s": get(summary, "tpot_s", "p99"),
        "prefix_hit_rate": get(summary, "prefix_cache", "hit_rate"),
        "preemptions": get(summary, "preemptions"),
        "mean_batch_size": get(summary, "kv", "mean_batch_size"),
        "frag_token_states": frag.get("token_states"), "frag_internal": frag.get("internal"),
        "frag_external": frag.get("external"),
        "bytes_moved": bytes_moved(summary),
        "num_rejected": get(summary, "num_rejected"),
    }




#: Summary keys left out when deciding that two runs gave identical results.
NOT_RESULTS = ("wall_time_s", "config")


def result_fingerprint(summary: dict) -> str:
    """The summary's results (everything but :data:`NOT_RESULTS`) as canonical text."""
    import json
    return json.dumps({k: v for k, v in summary.items() if k not in NOT_RESULTS},
                      sort_keys=True, default=str)


def identical_to(labels: Sequence[str], summaries: Sequence[dict]) -> list[str | None]:
    """Per run, the label of the first earlier run whose results are identical (``None``
    for the first of its kind): settings that made no difference are flagged, not ranked."""
    first: dict[str, str] = {}
    out = []
    for label, summary in zip(labels, summaries):
        key = result_fingerprint(summary)
        out.append(first.get(key))
        first.setdefault(key, str(label))
    return out


def _latency_cells(metrics: list[dict], name: str) -> list[str]:
    """Each run's ``p50 / p99`` of latency ``name`` (``ttft``, ``tpot``), every run in the
    unit the largest value of the column needs, so that rows compare at a glance."""
    texts = fmt_seconds_alike([m[f"{name}_{p}_s"] for m in metrics for p in ("p50", "p99")])
    return [f"{p50} / {p99}" for p50, p99 in zip(texts[::2], texts[1::2])]


def _cells(m: dict, ttft: str, tpot: str) -> list[str]:
    frag = "/".join(fmt_pct(m[k], 0) if is_number(m[k]) else "—" for k in
                    ("frag_token_states", "frag_internal", "frag_external"))
    return [fmt_num(m["throughput_output_tokens_per_s"]), ttft, tpot,
            fmt_pct(m["prefix_hit_rate"]), fmt_num(m["preemptions"]),
            fmt_num(m["mean_batch_size"], 1), frag, fmt_bytes(m["bytes_moved"]),
            fmt_num(m["num_rejected"])]


HEADERS = ("configuration", "out tok/s", "TTFT p50 / p99", "TPOT p50 / p99", "hit rate",
           "preempt", "batch", "frag tok/int/ext", "moved", "rejected")

#: What the table's short headers stand for (printed under it).
LEGEND = ("preempt: preemptions · batch: mean requests per step · frag tok/int/ext: shares "
          "of the GPU KV slots holding tokens / in blocks' unused tails / free but unusable, "
          "time-averaged · moved: bytes copied between GPU and host, or compacted · rejected: "
          "requests refused at arrival (a prompt of max_model_len tokens or more, as vLLM)")


def render_compare_table(labels: Sequence[str], summaries: Sequence[dict],
                         width: int | None = None) -> str:
    """One header line and one line per run, in the given order, columns padded to fit;
    wider than ``width`` (a terminal's columns), the columns come in blocks that fit, each
    led by the configuration (as pandas prints a wide frame)."""
    headers = list(HEADERS)
    metrics = [table_metrics(s) for s in summaries]
    rows = [[str(label), *_cells(m, ttft, tpot)] for label, m, ttft, tpot in zip(
        labels, metrics, _latency_cells(metrics, "ttft"), _latency_cells(metrics, "tpot"))]
    same = identical_to(labels, summaries)
    if any(same):
        headers.append("identical to")
        rows = [[*row, other or ""] for row, other in zip(rows, same)]
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    blocks = _column_blocks(widths, width)
    return "\n\n".join(_block(headers, rows, widths, columns) for columns in blocks)


def _column_blocks(widths: list[int], width: int | None) -> list[list[int]]:
    """The columns after the first, in blocks that fit ``width`` beside it (all in one when
    ``width`` is None or the whole table fits; a column too wide for any block stands alone)."""
    blocks, current, used = [], [], widths[0]
    for i, w in enumerate(widths[1:], start=1):
        if width is not None and current and used + 2 + w > width:
            blocks.append(current)
            current, used = [], widths[0]
        current.append(i)
        used += 2 + w
    return blocks + [current]


def _block(headers: list[str], rows: list[list[str]], widths: list[int],
           columns: list[int]) -> str:
    """The table's first column and ``columns``: header, rule, one line per run."""
    left = {0, len(HEADERS)}           # labels: the configuration and "identical to"
    shown = [0, *columns]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cells[i].ljust(widths[i]) if i in left else cells[i].rjust(widths[i])
                         for i in shown).rstrip()
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])
