"""A run's result in the shape of ``vllm bench serve --save-result --save-detailed``.

Same field names and units as vLLM's benchmark result file, so that the tools people already use
on real runs (diff, pandas, vLLM's own comparison scripts) read a kvsim run too: durations and
per-request ``ttfts`` / ``itls`` / ``start_times`` in seconds, the ``mean_/median_/std_/pNN_``
statistics of TTFT, TPOT, ITL and E2EL in milliseconds, throughputs per second.

What differs, because kvsim is a simulator: ``backend`` is ``"kvsim"``; there are no
``generated_texts``; ``errors`` says why a request did not complete (vLLM rejects a prompt of
``max_model_len`` tokens or more). kvsim does not time individual tokens, so each completed
request's ``itls`` are its ``generated_tokens - 1`` output gaps, each equal to the request's
mean gap (its TPOT). The ITL mean is then exact (total decode time over all gaps), but the ITL
median and tail are smoother than a real run's, whose gaps spike when a prefill joins the
batch. ``kvsim`` holds kvsim's own notes and the run's settings.
"""

from __future__ import annotations

import datetime as _dt
import os
from typing import TYPE_CHECKING

import numpy as np

from kvsim.reports.columns import Columns, as_frame
from kvsim.reports.io import write_json_atomic

if TYPE_CHECKING:
    import pandas as pd

BENCH_FILE = "bench.json"
#: vLLM's latency metrics, as its result file names them, and kvsim's requests.csv column.
METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": None, "e2el": "e2e_s"}
PERCENTILES = (50, 90, 99)
ITL_NOTE = ("derived: kvsim does not time single tokens; each of a request's output gaps is "
            "its mean gap (TPOT), so the ITL mean is exact and its median/p99 are smoother "
            "than a real run's")


def metric_stats(name: str, seconds: np.ndarray) -> dict:
    """``mean_NAME_ms``, ``median_NAME_ms``, ``std_NAME_ms`` and ``pNN_NAME_ms`` of a sample in
    seconds, as vLLM computes them (population std; 0 for an empty sample)."""
    ms = np.asarray(seconds, dtype=float) * 1000.0
    if not len(ms):
        ms = np.zeros(1)
    out = {f"mean_{name}_ms": float(ms.mean()), f"median_{name}_ms": float(np.median(ms)),
           f"std_{name}_ms": float(ms.std())}
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = float(np.percentile(ms, p))
    return out


def itl_lists(done: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(number of output gaps, mean gap in s) per completed request (see the module note)."""
    gaps = (done["generated_tokens"].to_numpy(dtype=np.int64) - 1).clip(min=0)
    mean_gap = done["tpot_s"].fillna(0.0).to_numpy(dtype=float)
    return gaps, mean_gap


def request_errors(requests: pd.DataFrame) -> list[str]:
    """vLLM's ``errors`` list: empty for a completed request, else why it did not complete."""
    def reason(row) -> str:
        if row.completed:
            return ""
        if row.rejected:
            return "rejected: the prompt does not fit max_model_len"
        return "unfinished when the simulation ended"
    return [reason(r) for r in requests[["completed", "rejected"]].itertuples()]


def bench_result(summary: dict, requests: pd.DataFrame | Columns, *, detailed: bool = True,
                 date: str | None = None) -> dict:
    """The benchmark-shaped dict of a run (``summary.json``'s dict and its requests frame);
    ``detailed`` adds the per-request lists (vLLM's ``--save-detailed``)."""
    requests = as_frame(requests)
    config = summary.get("config", {})
    done = requests[requests["completed"] == 1]
    duration = float(summary.get("duration_s") or 0.0)
    total_in = int(done["prompt_tokens"].sum())
    total_out = int(done["generated_tokens"].sum())
    gaps, mean_gap = itl_lists(done)
    result = {
        "date": date or _dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "kvsim", "label": None, "model_id": config.get("model"),
        "tokenizer_id": None, "num_prompts": int(len(requests)),
        "request_rate": _arrival_rate(requests), "burstiness": None, "max_concurrency": None,
        "duration": duration, "completed": int(len(done)),
        "failed": int(len(requests) - len(done)),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": _per_s(len(done), duration), "request_goodput": None,
        "output_throughput": _per_s(total_out, duration),
        "total_token_throughput": _per_s(total_in + total_out, duration),
        **peak_rates(done, gaps, mean_gap), "endpoint_type": None,
    }
    for name, column in METRICS.items():
        sample = np.repeat(mean_gap, gaps) if column is None else done[column].dropna()
        result.update(metric_stats(name, sample))
    if detailed:
        result.update(_per_request(requests, gaps, mean_gap))
    result["kvsim"] = {"itls": ITL_NOTE, "stopped_by_length": _length_note(summary),
                       "trace": config.get("trace"), "config": config}
    return result


def _length_note(summary: dict) -> str | None:
    """Why ``completed`` may exceed a real run's: requests whose prompt and output pass
    ``max_model_len`` (None when there are none)."""
    n = summary.get("num_stopped_by_length") or 0
    if not n:
        return None
    return (f"{n} completed request{'s' * (n != 1)} asked for more tokens than max_model_len "
            "holds (prompt + output): stopped by length here, as in vLLM's engine, but vLLM's "
            "server refuses such a request (HTTP 400), so a real vllm bench serve counts it "
            "failed")


def peak_rates(done: pd.DataFrame, gaps: np.ndarray, mean_gap: np.ndarray,
               chunk_tokens: int = 1 << 22) -> dict:
    """vLLM's ``max_output_tokens_per_s`` and ``max_concurrent_requests``: over one-second
    buckets from the first completed request's start, the most output tokens timed in one
    (each request's first token, then one per gap: see the module note) and the most requests
    under way in one (from the second it starts to the second it ends, both counted)."""
    if not len(done):
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    start = done["arrival_s"].to_numpy(dtype=float)
    first = start + done["ttft_s"].to_numpy(dtype=float)
    end = start + done["e2e_s"].to_numpy(dtype=float)
    origin = start.min()
    n = int(np.ceil(end.max() - origin)) + 1
    tokens, counts = np.zeros(n), gaps + 1
    ends = np.cumsum(counts)        # (in chunks of about chunk_tokens tokens: bounded memory)
    cuts = np.searchsorted(ends, np.arange(1, ends[-1] // chunk_tokens + 1) * chunk_tokens)
    bounds = np.unique(np.concatenate([[0], cuts, [len(done)]]))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        k = counts[lo:hi]
        step = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)   # (0.. per request)
        times = np.repeat(first[lo:hi], k) + step * np.repeat(mean_gap[lo:hi], k)
        buckets = (times - origin).astype(np.int64)
        tokens += np.bincount(buckets[(buckets >= 0) & (buckets < n)], minlength=n)
    active = np.zeros(n + 1, dtype=np.int64)
    np.add.at(active, (start - origin).astype(np.int64), 1)
    np.add.at(active, (end - origin).astype(np.int64) + 1, -1)
    return {"max_output_tokens_per_s": float(tokens.max()),
            "max_concurrent_requests": int(np.cumsum(active)[:n].max())}


def _per_request(requests: pd.DataFrame, gaps: np.ndarray, mean_gap: np.ndarray) -> dict:
    completed = requests["completed"].to_numpy() == 1
    itls: list[list[float]] = [[] for _ in range(len(requests))]
    for i, n, gap in zip(np.flatnonzero(completed), gaps, mean_gap):
        itls[i] = [float(gap)] * int(n)
    ttfts = requests["ttft_s"].where(requests["completed"] == 1, 0.0).fillna(0.0)
    return {
        "input_lens": requests["prompt_tokens"].astype(int).tolist(),
        "output_lens": requests["generated_tokens"].where(completed, 0).astype(int).tolist(),
        "ttfts": ttfts.astype(float).tolist(), "itls": itls,
        "start_times": requests["arrival_s"].astype(float).tolist(),
        "errors": request_errors(requests),
    }


def _per_s(count: float, duration: float) -> float:
    return float(count) / duration if duration else 0.0


def _arrival_rate(requests: pd.DataFrame) -> float | str:
    """The trace's mean request rate (its gaps over the arrival span: ``kvsim trace-stats``
    and the planner divide the requests, 1/n higher); ``"inf"`` when every request arrives
    at once (vLLM's word for an unthrottled client)."""
    arrivals = requests["arrival_s"].to_numpy(dtype=float)
    span = float(arrivals.max() - arrivals.min()) if len(arrivals) else 0.0
    return (len(arrivals) - 1) / span if span > 0 else "inf"


def write_bench_json(path: str | os.PathLike, summary: dict, requests: pd.DataFrame | Columns,
                     detailed: bool = True):
    """Write :func:`bench_result` to ``path`` atomically; returns the path."""
    return write_json_atomic(path, bench_result(summary, requests, detailed=detailed))
