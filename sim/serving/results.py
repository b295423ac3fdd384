"""Turn a :class:`~kvsim.sim.serving.runner.RunResult` into the output contract: ``summary.json``'s
dict and the ``requests`` and ``timeline`` frames (see ``docs/frames.md``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvsim.sim.perf.model_summary import kv_extra, model_info
from kvsim.sim.perf.models import resolve_model
from kvsim.reports.frames import REQUEST_COLUMNS, TIMELINE_COLUMNS, add_phase_columns

from kvsim.sim.serving.recorder import FINISH_REASONS, STEP_COLUMNS
from kvsim.sim.serving.recorder import REQUEST_COLUMNS as LOG_COLUMNS
from kvsim.sim.serving.runner import RunResult

MAX_TIMELINE_ROWS = 2000
FRAGMENT_COLUMNS = ("frag_token_states", "frag_reservation", "frag_internal", "frag_external",
                    "frag_free")


def requests_frame(result: RunResult) -> pd.DataFrame:
    """One row per request, in arrival order, with its latencies."""
    df = pd.DataFrame({k: np.frombuffer(v, dtype=np.float64 if LOG_COLUMNS[k] == "d"
                                         else np.int64) for k, v in result.requests.columns.items()})
    df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
    df["e2e_s"] = df["finish_s"] - df["arrival_s"]
    generated = df["generated_tokens"]
    df["tpot_s"] = ((df["finish_s"] - df["first_token_s"]) / (generated.clip(lower=2) - 1)
                    ).where(generated > 1)
    df["finish_reason"] = np.asarray(FINISH_REASONS, dtype=object)[df["finish_reason"]]
    return add_phase_columns(df)[list(REQUEST_COLUMNS)]


def steps_frame(result: RunResult) -> pd.DataFrame:
    return pd.DataFrame({k: np.frombuffer(result.steps.columns[k], dtype=np.float64)
                         for k in STEP_COLUMNS})


def _percentiles(values: pd.Series) -> dict:
    v = values.dropna().to_numpy()
    if not len(v):
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"mean": float(v.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def _fragmentation(steps: pd.DataFrame, pool_slots: int) -> dict:
    """Time-averaged shares of the GPU pool (per replica pool, averaged over replicas).
    ``fragmentation_under_load`` is the same over the steps after which a request waited."""
    w = steps["duration"].to_numpy()
    if not len(w) or w.sum() == 0:
        return {"token_states": 0.0, "reservation": 0.0, "internal": 0.0, "external": 0.0,
                "free": 1.0}
    shares = {name: float(np.average(steps[col], weights=w) / pool_slots) for name, col in (
        ("token_states", "token_slots"), ("reservation", "reserved_slots"),
        ("internal", "internal_slots"), ("external", "external_slots"))}
    shares["free"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def build_summary(result: RunResult, requests: pd.DataFrame, steps: pd.DataFrame) -> dict:
    """The ``summary.json`` dict (keys are a stable contract: see ``../shared/DESIGN.md``)."""
    cfg, dep = result.config, result.deployment
    done = requests[requests["completed"] == 1]
    duration = result.duration_s
    out_tokens = int(done["generated_tokens"].sum())
    in_tokens = int(done["prompt_tokens"].sum())
    kvs = [r.kv for r in result.replicas]
    queries = sum(kv.prefix_stats.num_queries_tokens for kv in kvs)
    hits = sum(kv.prefix_stats.num_hit_tokens for kv in kvs)
    pool = dep.num_gpu_blocks
    w = steps["duration"].to_numpy()
    usage = steps["kv_used_blocks"].to_numpy() / pool
    idle = float(np.average(steps["kv_cached_idle_blocks"], weights=w)) if w.sum() else 0.0
    return {
        "num_requests": int(len(requests)),
        "num_completed": int(len(done)),
        "num_rejected": int(requests["rejected"].sum()),
        "num_truncated": int(requests["truncated"].sum()),
        "num_stopped_by_length": int((done["finish_reason"] == "length").sum()),
        "num_steps": int(len(steps)),
        "duration_s": duration,
        "wall_time_s": result.wall_time_s,
        "throughput_output_tokens_per_s": out_tokens / duration if duration else 0.0,
        "request_throughput_per_s": len(done) / duration if duration else 0.0,
        # vLLM's bench serve counts prompt tokens of completed requests, cached or not
        "throughput_input_tokens_per_s": in_tokens / duration if duration else 0.0,
        "throughput_total_tokens_per_s": (in_tokens + out_tokens) / duration if duration
        else 0.0,
        "ttft_s": _percentiles(done["ttft_s"]),
        "tpot_s": _percentiles(done["tpot_s"]),
        "e2e_s": _percentiles(done["e2e_s"]),
        "prefix_cache": {"queries_tokens": queries, "hit_tokens": hits,
                         "hit_rate": hits / queries if queries else 0.0,
                         "host_hit_tokens": sum(kv.prefix_stats.num_host_hit_tokens
                                                for kv in kvs)},
        "preemptions": int(steps["preemptions"].sum()),
        "swapped_out_blocks": int(steps["swap_out_blocks"].sum()),
        "swapped_in_blocks": int(steps["swap_in_blocks"].sum()),
        "kv": {"num_gpu_blocks": pool, "num_cpu_blocks": dep.num_cpu_blocks,
               "block_size": cfg.block_size,
               "mean_usage": float(np.average(usage, weights=w)) if w.sum() else 0.0,
               "peak_usage": float(usage.max()) if len(usage) else 0.0,
               "mean_batch_size": float(steps["batch_size"].mean()) if len(steps) else 0.0,
               # cached blocks no request holds: the room an eviction policy has to choose in
               "mean_cached_idle_blocks": idle,
               "mean_cached_idle_fraction": idle / pool if pool else 0.0,
               "pool": dep.pool_explanation, "max_model_len": dep.max_model_len,
               **kv_extra(cfg, dep)},
        "model": model_info(cfg),
        "fragmentation": _fragmentation(steps, pool * cfg.block_size),
        "compaction": _compaction(result),
        "tiering": _tiering(result, steps),
        "fragmentation_under_load": _fragmentation(steps[steps["num_waiting"] > 0],
                                                   pool * cfg.block_size),
        "config": {**cfg.to_dict(), "max_model_len": dep.max_model_len},
    }


def _tiering(result: RunResult, steps: pd.DataFrame) -> dict:
    """Host-tier traffic summed over replicas (all zero without a tier): blocks and bytes each
    way (a block's bytes over all tensor-parallel shards), the seconds the executor charged
    for copies, and host usage (share of the host blocks holding data, time-averaged / peak)."""
    cfg, host = result.config, result.deployment.num_cpu_blocks
    per_block = resolve_model(cfg.model).kv_bytes_per_token(cfg.dtype) * cfg.block_size
    n = {c: int(steps[c].sum()) for c in ("swap_out_blocks", "swap_in_blocks",
                                          "offload_blocks", "promote_blocks")}
    w = steps["duration"].to_numpy()
    used = steps["host_used_blocks"].to_numpy() / host if host else np.zeros(len(steps))
    stores = [kv.host for kv in (r.kv for r in result.replicas) if hasattr(kv, "host")]
    return {
        "num_cpu_blocks": host, "offload_write": cfg.offload_write,
        "preemption_mode": cfg.preemption_mode,
        "offloaded_blocks": n["offload_blocks"], "promoted_blocks": n["promote_blocks"],
        "dropped_blocks": sum(h.num_dropped_blocks for h in stores),
        "bytes_to_host": (n["offload_blocks"] + n["swap_out_blocks"]) * per_block,
        "bytes_to_device": (n["promote_blocks"] + n["swap_in_blocks"]) * per_block,
        "transfer_time_s": float(steps["transfer_s"].sum()),
        "mean_host_usage": float(np.average(used, weights=w)) if w.sum() else 0.0,
        "peak_host_usage": float(used.max()) if len(used) else 0.0,
    }


def _compaction(result: RunResult) -> dict:
    """Compactions of the contiguous layout (all zero for paged), summed over replicas;
    ``external_before``/``external_after``: mean external fragmentation (share of the pool,
    for the request that triggered it) just before and after a compaction."""
    stats = [kv.compaction for kv in (r.kv for r in result.replicas)
             if hasattr(kv, "compaction")]
    n = sum(s.num_compactions for s in stats)
    moved = sum(s.moved_slots for s in stats)
    cfg = result.config
    per_token = resolve_model(cfg.model).kv_bytes_per_token(cfg.dtype) if moved else 0
    return {"num_compactions": n, "moved_tokens": moved,
            "moved_blocks": sum(s.moved_blocks for s in stats),
            "compaction_bytes_moved": moved * per_token,
            "external_before": sum(s.external_before_sum for s in stats) / n if n else 0.0,
            "external_after": sum(s.external_after_sum for s in stats) / n if n else 0.0}


STATE_COLUMNS = ("num_running", "num_waiting", "kv_used_blocks", "kv_cached_idle_blocks",
                 "token_slots", "internal_slots", "reserved_slots", "external_slots",
                 "host_used_blocks")
COUNT_COLUMNS = ("output_tokens", "preemptions", "prefix_queries_tokens", "prefix_hit_tokens",
                 "swap_out_blocks", "swap_in_blocks", "offload_blocks", "promote_blocks",
                 "compact_blocks", "transfer_s")


def timeline_frame(steps: pd.DataFrame, duration_s: float, pool_blocks: int,
                   block_size: int, num_replicas: int = 1) -> pd.DataFrame:
    """Steps on a uniform simulated-time grid of at most :data:`MAX_TIMELINE_ROWS` rows.

    States (running, KV blocks, slots) are exact time averages over each interval, the state a
    step leaves holding until that replica's next step starts, so idle gaps keep their cached
    blocks (summed over replicas); counts (tokens, preemptions, transfers) fall in the interval
    where their step ends. Shares are of all replicas' pools.
    """
    n_bins = max(1, min(MAX_TIMELINE_ROWS, len(steps)))
    width = duration_s / n_bins if duration_s > 0 else 1.0
    edges = np.arange(n_bins + 1) * width
    grid = pd.DataFrame({c: _time_average(steps, c, edges) for c in STATE_COLUMNS})
    ends = steps["t_start"] + steps["duration"]
    bins = np.clip((ends / width).astype(int), 0, n_bins - 1)
    counts = steps[list(COUNT_COLUMNS)].groupby(bins).sum()
    grid = grid.join(counts).fillna(0.0)
    grid["num_steps"] = np.bincount(bins, minlength=n_bins)[:n_bins]
    grid["batch_size"] = (steps["batch_size"].groupby(bins).mean()
                          .reindex(grid.index).fillna(0.0))
    return _finish_timeline(grid, width, pool_blocks * num_replicas, block_size)


def _time_average(steps: pd.DataFrame, column: str, edges: np.ndarray) -> np.ndarray:
    """Mean of a step-wise constant quantity over each interval, summed over replicas."""
    total = np.zeros(len(edges) - 1)
    for _, s in steps.groupby("replica"):
        t, d, v = (s[c].to_numpy() for c in ("t_start", "duration", column))
        if len(t):     # a step's state holds until the next step (idle gaps included)
            d = np.append(np.diff(t), max(d[-1], edges[-1] - t[-1]))
        area = np.concatenate([[0.0], np.cumsum(v * d)])
        k = np.clip(np.searchsorted(t, edges, side="right") - 1, 0, None)
        inside = np.clip(edges - t[k], 0.0, d[k]) if len(t) else np.zeros_like(edges)
        integral = area[k] + v[k] * inside if len(t) else np.zeros_like(edges)
        total += np.diff(integral) / np.diff(edges)
    return total


def _finish_timeline(grid: pd.DataFrame, width: float, pool_blocks: int,
                     block_size: int) -> pd.DataFrame:
    slots = pool_blocks * block_size
    grid.insert(0, "time_s", grid.index.to_numpy() * width)
    grid.insert(1, "interval_s", width)
    grid["throughput_tokens_per_s"] = grid["output_tokens"] / width
    grid["kv_free_blocks"] = pool_blocks - grid["kv_used_blocks"] - grid["kv_cached_idle_blocks"]
    grid["kv_usage"] = grid["kv_used_blocks"] / pool_blocks
    grid["frag_token_states"] = grid["token_slots"] / slots
    grid["frag_reservation"] = grid["reserved_slots"] / slots
    grid["frag_internal"] = grid["internal_slots"] / slots
    grid["frag_external"] = grid["external_slots"] / slots
    grid["frag_free"] = (1.0 - grid[list(FRAGMENT_COLUMNS[:-1])].sum(axis=1)).clip(lower=0)
    q = grid["prefix_queries_tokens"]
    grid["prefix_hit_rate"] = (grid["prefix_hit_tokens"] / q.where(q > 0)).fillna(0.0)
    drop = ["token_slots", "internal_slots", "reserved_slots", "external_slots"]
    return grid.drop(columns=drop).reset_index(drop=True)[list(TIMELINE_COLUMNS)]


def run_frames(result: RunResult) -> tuple[dict, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``(summary, requests, steps, timeline)`` of a finished simulation."""
    requests = requests_frame(result)
    steps = steps_frame(result)
    summary = build_summary(result, requests, steps)
    timeline = timeline_frame(steps, result.duration_s, result.deployment.num_gpu_blocks,
                              result.config.block_size, result.config.replicas)
    return summary, requests, steps, timeline
