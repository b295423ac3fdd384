"""Turn a :class:`~kvsim.sim.serving.runner.RunResult` into the output contract: ``summary.json``'s
dict and the ``requests`` and ``timeline`` frames (see ``docs/frames.md``), as
:class:`~kvsim.reports.columns.Columns` (what ``kvsim run`` writes and draws) or as pandas
DataFrames (the Python API's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvsim.sim.perf.model_summary import kv_extra, model_info
from kvsim.sim.perf.models import resolve_model
from kvsim.reports.columns import Columns
from kvsim.reports.frames import REQUEST_COLUMNS, SUMMARY_PERCENTILES, phase_columns
from kvsim.reports.frames import TIMELINE_COLUMNS

from kvsim.sim.serving.recorder import FINISH_REASONS
from kvsim.sim.serving.recorder import REQUEST_COLUMNS as LOG_COLUMNS
from kvsim.sim.serving.runner import RunResult
from kvsim.sim.serving.step_totals import StepTotals, Timeline

if TYPE_CHECKING:
    import pandas as pd

FRAGMENT_COLUMNS = ("frag_token_states", "frag_reservation", "frag_internal", "frag_external",
                    "frag_free")


def request_columns(result: RunResult) -> Columns:
    """One row per request, in arrival order, with its latencies. The logged columns are
    views of the log, not copies (the log no longer grows once the run is over)."""
    cols = {k: np.frombuffer(v, dtype=np.float64 if LOG_COLUMNS[k] == "d" else np.int64)
            for k, v in result.requests.columns.items()}
    arrival, first, finish = cols["arrival_s"], cols["first_token_s"], cols["finish_s"]
    generated = cols["generated_tokens"]
    with np.errstate(invalid="ignore"):
        tpot = np.where(generated > 1, (finish - first) / (np.maximum(generated, 2) - 1), np.nan)
    cols.update(ttft_s=first - arrival, e2e_s=finish - arrival, tpot_s=tpot,
                finish_reason=np.asarray(FINISH_REASONS, dtype=object)[cols["finish_reason"]])
    cols.update(phase_columns(cols))
    return Columns({k: cols[k] for k in REQUEST_COLUMNS})


def requests_frame(result: RunResult) -> pd.DataFrame:
    """:func:`request_columns` as a DataFrame."""
    return request_columns(result).to_pandas()


def steps_frame(result: RunResult) -> pd.DataFrame:
    """One row per engine step (per replica): only for a run simulated with ``keep_steps``."""
    return Columns(result.steps.columns).to_pandas()


def _percentiles(values: np.ndarray) -> dict:
    v = values[~np.isnan(values)]
    names = [f"p{p}" for p in SUMMARY_PERCENTILES]
    if not len(v):
        return dict.fromkeys(["mean", *names])
    found = np.percentile(v, list(SUMMARY_PERCENTILES))
    return {"mean": float(v.mean()), **{n: float(x) for n, x in zip(names, found)}}


def _fragmentation(mean, pool_slots: int) -> dict:
    """Time-averaged shares of the GPU pool (per replica pool, averaged over replicas), from
    ``mean(column)`` (:func:`_held_means`'s, or over the steps after which a request waited:
    ``fragmentation_under_load``; None without time)."""
    if mean is None:
        return {"token_states": 0.0, "reservation": 0.0, "internal": 0.0, "external": 0.0,
                "free": 1.0}
    shares = {name: mean(col) / pool_slots for name, col in (
        ("token_states", "token_slots"), ("reservation", "reserved_slots"),
        ("internal", "internal_slots"), ("external", "external_slots"))}
    shares["free"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def _held_means(result: RunResult):
    """``mean(column)``: a state column of the steps averaged over the run's whole time, per
    replica (idle gaps hold the last step's state: as the timeline integrates it); None
    when no time passed."""
    timeline, n = result.steps.timeline, len(result.replicas)
    if not result.steps.totals.num_steps or not timeline.duration_s:
        return None
    return lambda name: timeline.held_mean(name) / n


def _step_means(steps: StepTotals):
    """``mean(column)`` over the steps, weighted by their durations; None without time."""
    return steps.time_average if steps.num_steps and steps.sum("duration") else None


def _latencies(requests: Columns) -> dict:
    """Counts and latency percentiles of the completed requests (column by column, so no
    filtered copy of the whole frame is made)."""
    done = requests["completed"] == 1
    stopped = (requests["finish_reason"] == "length") & done
    return {
        "num_completed": int(done.sum()),
        "num_stopped_by_length": int(stopped.sum()),
        "generated": int(requests["generated_tokens"][done].sum()),
        "prompt": int(requests["prompt_tokens"][done].sum()),
        **{k: _percentiles(requests[k][done]) for k in ("ttft_s", "tpot_s", "e2e_s")},
    }


def build_summary(result: RunResult, requests: Columns) -> dict:
    """The ``summary.json`` dict (keys are a stable contract: see ``../shared/DESIGN.md``)."""
    cfg, dep = result.config, result.deployment
    steps = result.steps.totals
    done = _latencies(requests)
    completed, duration = done["num_completed"], result.duration_s
    out_tokens, in_tokens = done["generated"], done["prompt"]
    kvs = [r.kv for r in result.replicas]
    queries = sum(kv.prefix_stats.num_queries_tokens for kv in kvs)
    hits = sum(kv.prefix_stats.num_hit_tokens for kv in kvs)
    pool = dep.num_gpu_blocks
    held = _held_means(result)
    mean = held or (lambda name: 0.0)
    idle = mean("kv_cached_idle_blocks")
    return {
        "num_requests": int(len(requests)),
        "trace_rows_left_out": result.trace_rows_left_out,
        "num_completed": completed,
        "num_rejected": int(requests["rejected"].sum()),
        "num_truncated": int(requests["truncated"].sum()),
        "num_stopped_by_length": done["num_stopped_by_length"],
        "num_steps": steps.num_steps,
        "duration_s": duration,
        "wall_time_s": result.wall_time_s,
        "throughput_output_tokens_per_s": out_tokens / duration if duration else 0.0,
        "request_throughput_per_s": completed / duration if duration else 0.0,
        # vLLM's bench serve counts prompt tokens of completed requests, cached or not
        "throughput_input_tokens_per_s": in_tokens / duration if duration else 0.0,
        "throughput_total_tokens_per_s": (in_tokens + out_tokens) / duration if duration
        else 0.0,
        "ttft_s": done["ttft_s"],
        "tpot_s": done["tpot_s"],
        "e2e_s": done["e2e_s"],
        "prefix_cache": {"queries_tokens": queries, "hit_tokens": hits,
                         "hit_rate": hits / queries if queries else 0.0,
                         "host_hit_tokens": sum(kv.prefix_stats.num_host_hit_tokens
                                                for kv in kvs)},
        "preemptions": int(steps.sum("preemptions")),
        "swapped_out_blocks": int(steps.sum("swap_out_blocks")),
        "swapped_in_blocks": int(steps.sum("swap_in_blocks")),
        "kv": {"num_gpu_blocks": pool, "num_cpu_blocks": dep.num_cpu_blocks,
               "block_size": cfg.block_size,
               "mean_usage": mean("kv_used_blocks") / pool,
               "peak_usage": steps.max("kv_used_blocks") / pool,
               "mean_batch_size": steps.mean("batch_size"),
               # cached blocks no request holds: the room an eviction policy has to choose in
               "mean_cached_idle_blocks": idle,
               "mean_cached_idle_fraction": idle / pool if pool else 0.0,
               "pool": dep.pool_explanation, "max_model_len": dep.max_model_len,
               "max_model_len_limit": dep.max_model_len_limit, **kv_extra(cfg, dep)},
        "model": model_info(cfg),
        "fragmentation": _fragmentation(held, pool * cfg.block_size),
        "compaction": _compaction(result),
        "tiering": _tiering(result, steps, mean),
        "fragmentation_under_load": _fragmentation(_step_means(steps.under_load),
                                                   pool * cfg.block_size),
        "config": {**cfg.to_dict(), "max_model_len": dep.max_model_len,
                   **({} if result.trace_options is None
                      else {"trace_options": result.trace_options})},
    }


def _tiering(result: RunResult, steps: StepTotals, mean) -> dict:
    """Host-tier traffic summed over replicas (all zero without a tier): blocks and bytes each
    way (a block's bytes over all tensor-parallel shards), the seconds the executor charged
    for copies, and host usage (share of the host blocks holding data, time-averaged / peak)."""
    cfg, host = result.config, result.deployment.num_cpu_blocks
    per_block = resolve_model(cfg.model).kv_bytes_per_token(cfg.dtype) * cfg.block_size
    n = {c: int(steps.sum(c)) for c in ("swap_out_blocks", "swap_in_blocks",
                                        "offload_blocks", "promote_blocks")}
    stores = [kv.host for kv in (r.kv for r in result.replicas) if hasattr(kv, "host")]
    return {
        "num_cpu_blocks": host, "offload_write": cfg.offload_write,
        "preemption_mode": cfg.preemption_mode,
        "offloaded_blocks": n["offload_blocks"], "promoted_blocks": n["promote_blocks"],
        "dropped_blocks": sum(h.num_dropped_blocks for h in stores),
        "bytes_to_host": (n["offload_blocks"] + n["swap_out_blocks"]) * per_block,
        "bytes_to_device": (n["promote_blocks"] + n["swap_in_blocks"]) * per_block,
        "transfer_time_s": steps.sum("transfer_s"),
        "mean_host_usage": mean("host_used_blocks") / host if host else 0.0,
        "peak_host_usage": steps.max("host_used_blocks") / host if host else 0.0,
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


def timeline_columns(timeline: Timeline, pool_blocks: int, block_size: int,
                     num_replicas: int = 1) -> Columns:
    """The closed :class:`~kvsim.sim.serving.step_totals.Timeline` as ``timeline.csv``'s frame: at
    most ``MAX_TIMELINE_ROWS`` rows of a power-of-two width (the smallest that covers the run,
    and no more rows than steps); states are time averages over each row's interval (blocks
    summed over replicas), counts are the steps ending in it. Shares are of all replicas'
    pools."""
    grid = timeline.rows()
    pool_blocks *= num_replicas
    slots = pool_blocks * block_size
    grid["throughput_tokens_per_s"] = grid["output_tokens"] / grid["interval_s"]
    grid["kv_free_blocks"] = pool_blocks - grid["kv_used_blocks"] - grid["kv_cached_idle_blocks"]
    grid["kv_usage"] = grid["kv_used_blocks"] / pool_blocks
    grid.update(_fragment_shares(grid, slots))
    q = grid["prefix_queries_tokens"]
    with np.errstate(divide="ignore", invalid="ignore"):
        grid["prefix_hit_rate"] = np.where(q > 0, grid["prefix_hit_tokens"] / q, 0.0)
    return Columns({name: grid[name] for name in TIMELINE_COLUMNS})


def _fragment_shares(grid: dict, slots: int) -> dict:
    """The ``frag_*`` columns: each kind of slot as a share of the pools, and the rest free
    (never below 0; the shares added one after the other, missing ones as 0)."""
    shares = {share: grid[column] / slots for share, column in zip(
        FRAGMENT_COLUMNS, ("token_slots", "reserved_slots", "internal_slots", "external_slots"))}
    taken = [np.nan_to_num(shares[share], nan=0.0) for share in FRAGMENT_COLUMNS[:-1]]
    shares["frag_free"] = np.maximum(1.0 - (((taken[0] + taken[1]) + taken[2]) + taken[3]), 0)
    return shares


def timeline_frame(timeline: Timeline, pool_blocks: int, block_size: int,
                   num_replicas: int = 1) -> pd.DataFrame:
    """:func:`timeline_columns` as a DataFrame."""
    return timeline_columns(timeline, pool_blocks, block_size, num_replicas).to_pandas()


def run_columns(result: RunResult) -> tuple[dict, Columns, Columns]:
    """``(summary, requests, timeline)`` of a finished simulation, as written and drawn."""
    requests = request_columns(result)
    summary = build_summary(result, requests)
    timeline = timeline_columns(result.steps.timeline, result.deployment.num_gpu_blocks,
                                result.config.block_size, result.config.replicas)
    return summary, requests, timeline


def run_frames(result: RunResult) -> tuple[dict, pd.DataFrame, pd.DataFrame | None,
                                           pd.DataFrame]:
    """``(summary, requests, steps, timeline)`` of a finished simulation as DataFrames;
    ``steps`` is ``None`` unless it was simulated with ``keep_steps``."""
    summary, requests, timeline = run_columns(result)
    steps = steps_frame(result) if result.steps.keep_steps else None
    return summary, requests.to_pandas(), steps, timeline.to_pandas()
