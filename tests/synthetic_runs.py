"""Plausible synthetic result frames (docs/frames.md), for tests, demos and screenshots.

They follow the frame contract, not any simulator: a Poisson arrival stream, lognormal
latencies, a KV pool that fills and drains, a fragmentation split that sums to 1.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvsim.reports.frames import REQUEST_COLUMNS, TIMELINE_COLUMNS, add_phase_columns


def synthetic_run(num_requests: int = 300, timeline_rows: int = 500, *, seed: int = 0,
                  num_gpu_blocks: int = 4096, num_cpu_blocks: int = 2048,
                  unfinished: int = 5, label: str = "synthetic",
                  ) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """Return ``(summary, requests, timeline)`` for a made-up run of ``num_requests``."""
    rng = np.random.default_rng(seed)
    requests = _requests(rng, num_requests, unfinished)
    duration = float(np.nanmax(requests["finish_s"])) if requests["completed"].any() else 60.0
    duration = max(duration, float(requests["arrival_s"].max() if len(requests) else 0.0), 1.0)
    timeline = _timeline(rng, timeline_rows, duration, num_gpu_blocks, num_cpu_blocks)
    summary = summary_from_frames(requests, timeline, label=label,
                                  num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks)
    return summary, requests, timeline


def _requests(rng: np.random.Generator, n: int, unfinished: int) -> pd.DataFrame:
    arrival = np.cumsum(rng.exponential(0.2, n))
    prompt = rng.integers(64, 4096, n)
    output = rng.integers(16, 512, n)
    ttft = rng.lognormal(np.log(0.25), 0.6, n)
    tpot = rng.lognormal(np.log(0.03), 0.25, n)
    first_sched = arrival + ttft * rng.uniform(0.3, 0.9, n)
    first_token = arrival + ttft
    finish = first_token + tpot * (output - 1)
    completed = np.ones(n, dtype=int)
    completed[n - min(unfinished, n):] = 0
    done = completed.astype(bool)
    nan = np.full(n, np.nan)
    df = pd.DataFrame({
        "request_id": np.arange(n), "trace_line": np.arange(n) + 1, "arrival_s": arrival,
        "prompt_tokens": prompt, "output_tokens": output, "priority": rng.integers(0, 2, n),
        "replica": rng.integers(0, 2, n), "first_scheduled_s": first_sched,
        "first_token_s": np.where(done, first_token, nan),
        "finish_s": np.where(done, finish, nan), "ttft_s": np.where(done, ttft, nan),
        "tpot_s": np.where(done, tpot, nan), "e2e_s": np.where(done, finish - arrival, nan),
        "cached_tokens": (prompt * rng.uniform(0, 0.6, n)).astype(int) // 16 * 16,
        "num_preemptions": rng.poisson(0.1, n), "completed": completed,
        "generated_tokens": np.where(done, output, 0),
        "finish_reason": np.where(done, "stop", ""), "rejected": 0, "truncated": 0,
    })
    return add_phase_columns(df)[list(REQUEST_COLUMNS)]


def _timeline(rng: np.random.Generator, rows: int, duration: float, gpu: int,
              cpu: int) -> pd.DataFrame:
    interval = duration / max(rows, 1)
    t = np.arange(rows) * interval
    phase = np.sin(np.linspace(0, 3 * np.pi, rows)) * 0.5 + 0.5
    load = np.clip(0.25 + 0.65 * phase + rng.normal(0, 0.03, rows), 0.02, 0.98)
    used = (load * gpu).astype(int)
    idle = ((gpu - used) * rng.uniform(0.2, 0.5, rows)).astype(int)
    steps = rng.integers(5, 40, rows)
    out_tokens = (steps * (8 + 40 * load)).astype(int)
    queries = rng.integers(0, 20000, rows) * (rng.random(rows) > 0.1)
    frag = _fragmentation(rng, load)
    df = pd.DataFrame({
        "time_s": t, "interval_s": interval, "num_steps": steps,
        "num_running": 4 + 60 * load, "num_waiting": np.maximum(0, 40 * (load - 0.6)),
        "batch_size": 4 + 56 * load, "output_tokens": out_tokens,
        "throughput_tokens_per_s": out_tokens / interval,
        "kv_used_blocks": used, "kv_cached_idle_blocks": idle,
        "kv_free_blocks": gpu - used - idle, "kv_usage": used / gpu,
        "host_used_blocks": (np.maximum(0, load - 0.7) * cpu * 2).astype(int),
        **frag, "prefix_queries_tokens": queries,
        "prefix_hit_tokens": (queries * rng.uniform(0.2, 0.7, rows)).astype(int),
        "preemptions": rng.poisson(np.maximum(0, load - 0.8) * 10),
        "swap_out_blocks": rng.poisson(np.maximum(0, load - 0.75) * 200),
        "swap_in_blocks": rng.poisson(np.maximum(0, load - 0.75) * 150),
        "offload_blocks": rng.poisson(20 * load), "promote_blocks": rng.poisson(10 * load),
        "compact_blocks": np.zeros(rows, dtype=int),
        "transfer_s": rng.poisson(20 * load) * 2e-4,
    })
    with np.errstate(invalid="ignore", divide="ignore"):
        df["prefix_hit_rate"] = np.where(queries > 0, df["prefix_hit_tokens"] / queries, np.nan)
    return df[list(TIMELINE_COLUMNS)]


def _fragmentation(rng: np.random.Generator, load: np.ndarray) -> dict[str, np.ndarray]:
    tokens = load * rng.uniform(0.7, 0.8, len(load))
    reservation = load * 0.12
    internal = load - tokens - reservation
    external = np.zeros_like(load)
    free = 1.0 - tokens - reservation - internal - external
    return {"frag_token_states": tokens, "frag_reservation": reservation,
            "frag_internal": internal, "frag_external": external, "frag_free": free}


def _stats(values: pd.Series) -> dict:
    v = values.dropna().to_numpy(dtype=float)
    if len(v) == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {"mean": float(v.mean()), "p50": float(np.percentile(v, 50)),
            "p90": float(np.percentile(v, 90)), "p99": float(np.percentile(v, 99))}


def summary_from_frames(requests: pd.DataFrame, timeline: pd.DataFrame, *, label: str,
                        num_gpu_blocks: int, num_cpu_blocks: int) -> dict:
    """A ``summary.json``-shaped dict derived from the two frames (for synthetic runs)."""
    done = requests[requests["completed"] == 1] if len(requests) else requests
    duration = float((timeline["interval_s"]).sum()) if len(timeline) else 0.0
    out_tokens = float(done["output_tokens"].sum()) if len(done) else 0.0
    queries = int(timeline["prefix_queries_tokens"].sum()) if len(timeline) else 0
    hits = int(timeline["prefix_hit_tokens"].sum()) if len(timeline) else 0
    frag_cols = ["token_states", "reservation", "internal", "external", "free"]
    frag = {c: (float(timeline[f"frag_{c}"].mean()) if len(timeline) else (1.0 if c == "free"
                                                                            else 0.0))
            for c in frag_cols}
    return {
        "num_requests": int(len(requests)), "num_completed": int(len(done)),
        "num_steps": int(timeline["num_steps"].sum()) if len(timeline) else 0,
        "duration_s": duration, "wall_time_s": 1.234,
        "throughput_output_tokens_per_s": out_tokens / duration if duration else 0.0,
        "request_throughput_per_s": len(done) / duration if duration else 0.0,
        "ttft_s": _stats(done["ttft_s"]), "tpot_s": _stats(done["tpot_s"]),
        "e2e_s": _stats(done["e2e_s"]),
        "prefix_cache": {"queries_tokens": queries, "hit_tokens": hits,
                         "hit_rate": hits / queries if queries else 0.0},
        "preemptions": int(timeline["preemptions"].sum()) if len(timeline) else 0,
        "swapped_out_blocks": int(timeline["swap_out_blocks"].sum()) if len(timeline) else 0,
        "swapped_in_blocks": int(timeline["swap_in_blocks"].sum()) if len(timeline) else 0,
        "kv": {"num_gpu_blocks": num_gpu_blocks, "num_cpu_blocks": num_cpu_blocks,
               "block_size": 16,
               "mean_usage": float(timeline["kv_usage"].mean()) if len(timeline) else 0.0,
               "peak_usage": float(timeline["kv_usage"].max()) if len(timeline) else 0.0,
               "mean_batch_size": float(timeline["batch_size"].mean()) if len(timeline) else 0.0},
        "fragmentation": frag,
        "config": {"trace": f"{label}.jsonl", "model": "llama-3-8b", "gpu": "H100-80GB",
                   "tp": 1, "replicas": 2, "block_size": 16, "eviction": "lru",
                   "layout": "paged", "seed": 0, "kv_offloading_size": 16,
                   "scheduler": {"max_num_seqs": 256, "max_num_batched_tokens": 8192,
                                 "chunked_prefill": True, "preemption": "swap"}},
        "slo": {"ttft_p99_s": 1.0, "tpot_p99_s": 0.05, "e2e_p99_s": 20.0},
    }


def empty_run() -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """A run in which nothing arrived and nothing completed: frames with headers only."""
    requests = pd.DataFrame({c: pd.Series(dtype=float) for c in REQUEST_COLUMNS})
    timeline = pd.DataFrame({c: pd.Series(dtype=float) for c in TIMELINE_COLUMNS})
    summary = summary_from_frames(requests, timeline, label="empty",
                                  num_gpu_blocks=1024, num_cpu_blocks=0)
    summary.pop("slo")
    return summary, requests, timeline
