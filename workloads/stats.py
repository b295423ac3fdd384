"""Statistics of a trace: size, rate, lengths, burstiness and the ideal prefix hit ratio.

Definitions (these are what ``kvsim trace-stats`` prints):

- ``time_span_s``: last arrival minus first arrival; ``mean_rate_per_s``: requests / span.
- ``input_tokens`` / ``output_tokens``: mean, p50, p90, p99 (linear interpolation) and max.
- ``burstiness_cv``: coefficient of variation (std / mean, population std) of the gaps between
  consecutive arrivals; 1 for a Poisson process, above 1 for bursty traffic, 0 for a constant
  rate.
- ``ideal_prefix_hit_ratio``: the block-level hit ratio of an infinite prefix cache at
  ``block_size``: every full ``block_size`` block of every prompt is looked up once in arrival
  order, and is a hit when a block with the same prefix id was looked up before (by an earlier
  request). Equals ``(full_blocks - distinct_blocks) / full_blocks``. Partial last blocks are
  never cached and are not counted. ``ideal_prefix_hit_tokens_ratio`` is the same hits in tokens
  over all prompt tokens (partial blocks included), comparable to a run's ``prefix_cache.hit_rate``
  (a ceiling for it, but for one block a request at most: vLLM recomputes a prompt's last token,
  so a prompt of whole blocks can hit all but its last). A continued request's prompt also hits
  the blocks its parent generated (but the last token's, never computed), when the parent is in
  the trace (or its ``--start``/``--end`` window).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Iterable

import numpy as np

from kvsim.workloads.lines import numbered_lines, where
from kvsim.workloads.loader import detect_format, load_trace
from kvsim.workloads.options import TraceOptions
from kvsim.workloads.request import Request, left_out_text, rows_text, trace_name

PERCENTILES = (50, 90, 99)
_MERGE_EVERY = 16_000_000


class _DistinctCounter:
    """Counts distinct int64 ids in a stream, merging sorted chunks to bound memory."""

    def __init__(self):
        self.seen = np.empty(0, dtype=np.int64)
        self.pending: list[np.ndarray] = []
        self.pending_size = 0
        self.total = 0
        self.unique = 0
        self.generated = 0

    def add(self, ids: np.ndarray, counted: bool = True) -> None:
        """Add ids; ``counted=False``: ids unique to a request's generated tokens, seen (a
        later prompt resending them hits) but no looked-up block themselves."""
        self.pending.append(ids)
        self.pending_size += len(ids)
        if counted:
            self.total += len(ids)
        else:
            self.generated += len(ids)
        if self.pending_size >= _MERGE_EVERY:
            self._merge()

    def add_unique(self, count: int) -> None:
        """Count ``count`` ids known to occur nowhere else."""
        self.total += count
        self.unique += count

    def distinct(self) -> int:
        """Distinct looked-up ids (generated-only ids, each distinct, left out)."""
        self._merge()
        return len(self.seen) + self.unique - self.generated

    def _merge(self) -> None:
        if self.pending:
            self.seen = sorted_unique(np.concatenate([self.seen, *self.pending]))
            self.pending, self.pending_size = [], 0


def sorted_unique(ids: np.ndarray) -> np.ndarray:
    """``numpy.unique`` by sorting (numpy 2's hash-based unique is ~20x slower on 64-bit ids)."""
    ids = np.sort(ids, kind="stable")
    keep = np.empty(len(ids), dtype=bool)
    keep[:1] = True
    np.not_equal(ids[1:], ids[:-1], out=keep[1:])
    return ids[keep]


def trace_stats(requests: Iterable[Request], block_size: int = 16) -> dict:
    """Statistics of ``requests`` (any iterable, consumed once) as a JSON-ready dict."""
    arrivals, prompts, outputs = [], [], []
    blocks = _DistinctCounter()
    parents: set[int] = set()
    kept: set[int] = set()      # (the requests seen: a parent outside the window never ran)
    for request in requests:
        arrivals.append(request.arrival_s)
        prompts.append(request.prompt_tokens)
        outputs.append(request.output_tokens)
        _add_generated(blocks, request.continues, block_size, parents, kept)
        kept.add(id(request))
        if _counted_unique(request):
            blocks.add_unique(request.prompt_tokens // block_size)
        else:
            blocks.add(request.block_hashes(block_size))
    return {
        "num_requests": len(arrivals),
        **_timing(np.asarray(arrivals, dtype=np.float64)),
        "input_tokens": length_summary(prompts),
        "output_tokens": length_summary(outputs),
        **_prefix(blocks, block_size, sum(prompts)),
    }


def _add_generated(blocks: _DistinctCounter, parent: Request | None, block_size: int,
                   done: set[int], kept: set[int]) -> None:
    """The generated blocks of a continued request (random sampling: unique to it), once, so
    the prompt resending them hits; recorded outputs are left out (they may repeat), and so is
    a parent the trace's window left out (it never ran, nothing of it is cached). The last
    generated token's KV is never computed: the blocks end before it."""
    if (parent is None or id(parent) in done or id(parent) not in kept
            or parent.output_token_ids is not None):
        return
    done.add(id(parent))
    whole = parent.block_hashes(block_size, parent.total_tokens - 1)
    start = 0 if _counted_unique(parent) else parent.prompt_tokens // block_size
    blocks.add(whole[start:], counted=False)   # (prompt ids counted as unique: now seen)


def _counted_unique(request: Request) -> bool:
    """Whether ``request``'s prompt blocks are counted without their ids (nothing shares them
    unless a later request continues it)."""
    return not request.names_content


def trace_file_stats(path: str | os.PathLike, opts: TraceOptions | None = None,
                     block_size: int = 16) -> dict:
    """:func:`trace_stats` of the trace at ``path``, plus its ``trace`` path and ``format``."""
    opts = (opts or TraceOptions()).checked()
    left_out = Counter()
    stats = trace_stats(load_trace(path, opts, left_out), block_size)
    return {"trace": str(path), "format": _format_of(path, opts), **stats,
            "trace_rows_left_out": dict(left_out)}


def length_summary(values) -> dict:
    """``{mean, p50, p90, p99, max}`` of token counts."""
    arr = np.asarray(values, dtype=np.float64)
    summary = {"mean": float(arr.mean())}
    for p, value in zip(PERCENTILES, np.percentile(arr, PERCENTILES)):
        summary[f"p{p}"] = float(value)
    summary["max"] = int(arr.max())
    return summary


def burstiness(arrivals: np.ndarray) -> float | None:
    """CV of the inter-arrival gaps, or None with fewer than two gaps or no elapsed time."""
    gaps = np.diff(arrivals)
    if len(gaps) < 2 or gaps.mean() <= 0:
        return None
    return float(gaps.std() / gaps.mean())


def _timing(arrivals: np.ndarray) -> dict:
    span = float(arrivals[-1] - arrivals[0]) if len(arrivals) else 0.0
    return {"time_span_s": span,
            "mean_rate_per_s": len(arrivals) / span if span > 0 else None,
            "burstiness_cv": burstiness(arrivals)}


def _prefix(blocks: _DistinctCounter, block_size: int, prompt_tokens: int) -> dict:
    distinct = blocks.distinct()
    hits = blocks.total - distinct
    return {"block_size": block_size, "full_blocks": blocks.total,
            "distinct_blocks": distinct,
            "ideal_prefix_hit_ratio": hits / blocks.total if blocks.total else 0.0,
            "ideal_prefix_hit_tokens_ratio":
                hits * block_size / prompt_tokens if prompt_tokens else 0.0}


def _format_of(path, opts: TraceOptions) -> str:
    if opts.format_name:
        return opts.format_name
    line_no, text = next(numbered_lines(path))
    return detect_format(text, where(path, line_no))


def render_stats(stats: dict) -> str:
    """``stats`` as a few aligned lines for people."""
    rate = stats["mean_rate_per_s"]
    cv = stats["burstiness_cv"]
    left_out = stats.get("trace_rows_left_out")
    lines = [
        f"trace         {trace_name(stats['trace'])} ({stats['format']})" if "trace" in stats
        else None,
        f"requests      {stats['num_requests']:,}",
        f"left out      {rows_text(sum(left_out.values()))} without a request to run: "
        f"{left_out_text(left_out)}" if left_out else None,
        f"time span     {stats['time_span_s']:,.1f} s",
        f"mean rate     {'-' if rate is None else f'{rate:.3f}'} req/s",
        f"burstiness    {'-' if cv is None else f'{cv:.2f}'} (CV of inter-arrival gaps)",
        _length_line("input", stats["input_tokens"]),
        _length_line("output", stats["output_tokens"]),
        f"prefix hits   {stats['ideal_prefix_hit_ratio']:.1%} of {stats['full_blocks']:,} full "
        f"blocks of {stats['block_size']} tokens ({stats['distinct_blocks']:,} distinct); "
        f"{stats['ideal_prefix_hit_tokens_ratio']:.1%} of prompt tokens (infinite cache)",
    ]
    return "\n".join(line for line in lines if line)


def _length_line(name: str, s: dict) -> str:
    return (f"{name + ' tokens':<14}mean {s['mean']:,.1f}  p50 {s['p50']:,.0f}  "
            f"p90 {s['p90']:,.0f}  p99 {s['p99']:,.0f}  max {s['max']:,}")
