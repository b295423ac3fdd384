"""Capacity planner: the cheapest deployment of a trace that meets latency targets.

For every candidate configuration of a :class:`~kvsim.sim.plan.spec.PlanSpec` (GPU x TP x block
size x ...), :func:`evaluate_task` (one task per candidate, run by :mod:`kvsim.sim.plan.sweep`):

1. sizes the KV pool; a model that does not fit is *infeasible*, with the reason (as are
   prompts longer than the pool's ``max_model_len``, which the simulator would reject);
2. computes each request's latency floor in an empty system (:mod:`kvsim.sim.plan.bounds`);
   when a floor percentile already misses a target, no replica count can help: infeasible;
3. finds the **fewest replicas** meeting every SLO at the planned load, by exponential search
   then bisection over the replica count (:func:`~kvsim.sim.plan.search.fewest_passing`), up
   to ``max_replicas``. The search assumes that more replicas never raise a percentile. The
   model only roughly obeys that (with few requests a p99 hinges on which replica the longest
   prompts land on; TPOT also on which decodes share a step with a long prefill), so what is
   guaranteed is local: the chosen count meets every SLO and one replica fewer does not;
4. finds the **largest sustainable request rate of one replica** (:data:`SUSTAINABLE`) by
   geometric bisection over the rate scale, ``rate_iterations`` times after bracketing.

With ``spec.prune`` (the default) every simulation stops as soon as it certainly misses a
target (:mod:`kvsim.sim.plan.stop`; a stopped point keeps its verdict and reason, not its
latencies), step 4 runs first, and the load over the sustainable rate found there is the
replica search's guess from above (:func:`replica_guess`), which replaces the first power of two
beyond it. Verdicts are those of full runs and the guarantee of step 3 is unchanged; only the
replica counts the search visits differ. ``prune=False`` runs the searches as above, in full.

:func:`plan` ranks the candidates: feasible first, then by cost per hour, GPUs, and headroom.
Every number comes from deterministic simulations, so the result is the same on every backend.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import replace

import numpy as np

from kvsim.errors import ConfigError
from kvsim.workloads import load_trace

from kvsim.sim.serving import results
from kvsim.sim.config import RunConfig
from kvsim.sim.plan.bounds import floor_percentiles, fmt_latency, impossible_reason, latency_floors
from kvsim.sim.plan.bounds import suggested_block_size
from kvsim.sim.plan.load import TOO_SHORT
from kvsim.sim.plan.search import fewest_passing, largest_passing
from kvsim.sim.plan.spec import SWEEP_DIMS, PlanSpec, gpu_hour_price, refusal, reported_keys
from kvsim.sim.plan.stop import SloStop
from kvsim.workloads.truncate import truncate

from kvsim.sim.serving.runner import resolve_deployment, simulate
from kvsim.sim.plan.sweep import SweepOptions, run_tasks

SUSTAINABLE = ("A request rate is sustainable for one replica when the trace, replayed on one "
               "replica at that rate (the trace's mean rate x rate scale), completes every "
               "request and meets every SLO target. The maximum is found by geometric "
               "bisection over the rate scale; the reported rate passed, a rate higher by "
               "the stated ratio failed. Rates at which the trace's arrivals are "
               f"{TOO_SHORT} are not tried (nor planned for, unless --burst): over so short a "
               "span a burst passes that no replica could sustain.")
HEADROOM = "Per SLO target: 1 - reached / target (0.25: the percentile is 25% below the target)."
COST = ("replicas x TP x price per GPU-hour, host-tier memory included (editable: "
        "--price-table).")


def plan(spec: PlanSpec, options: SweepOptions = SweepOptions(), progress=None) -> dict:
    """Evaluate every candidate of ``spec`` on ``options``' backend; the ranked plan as a
    JSON-ready dict (``candidates`` best first, ``recommended``, ``block_size``, ...)."""
    tasks = [(spec, i) for i in range(len(spec.candidates))]
    rows = rank(run_tasks(evaluate_task, tasks, options, progress))
    feasible = [r for r in rows if r["feasible"]]
    return {
        "trace": spec.trace_label, "model": spec.base.model, "slo": spec.slo,
        "load": {"rate_scale": spec.trace_options.rate_scale, "num_requests": spec.num_requests,
                 "trace_rate_per_s": spec.native_rate_per_s,
                 "request_rate_per_s": spec.request_rate_per_s,
                 "kind": "burst" if spec.burst else "sustained",
                 "trace_rows_left_out": spec.trace_rows_left_out},
        "search": {"max_replicas": spec.max_replicas, "rate_iterations": spec.rate_iterations,
                   "router": spec.base.router, "swept": _swept(spec)},
        "definitions": {"sustainable": SUSTAINABLE, "headroom": HEADROOM, "cost": COST},
        "candidates": rows,
        "recommended": feasible[0] if feasible else None,
        "block_size": block_size_advice(spec, rows),
    }


def _swept(spec: PlanSpec) -> dict:
    return {d: list(dict.fromkeys(getattr(c, d) for c in spec.candidates)) for d in SWEEP_DIMS}


def rank(rows: list[dict]) -> list[dict]:
    """Rows best first, numbered ``rank`` 1..n: feasible, cheapest, fewest GPUs, most headroom
    (unknown prices last); infeasible rows keep their candidate order."""
    def key(row):
        if not row["feasible"]:
            return (1, 0.0, 0, 0.0, row["index"])
        cost = row["cost_per_hour_usd"]
        return (0, math.inf if cost is None else cost, row["gpus"], -row["min_headroom"],
                row["index"])
    ranked = sorted(rows, key=key)
    return [{**row, "rank": i} for i, row in enumerate(ranked, start=1)]


def evaluate_task(task: tuple[PlanSpec, int]) -> dict:
    """The result row of candidate ``task[1]`` of ``task[0]`` (picklable; runs in workers)."""
    spec, index = task
    config = spec.candidates[index]
    row = _row_head(spec, index, config)
    refused = refusal(config)
    if refused is not None:
        return _infeasible(row, f"{refused.field} {refused.message}")
    try:
        deployment = resolve_deployment(config)
    except ConfigError as e:
        return _infeasible(row, e.message)
    requests = list(load_trace(spec.trace_path, spec.trace_options))
    too_long = sum(r.prompt_tokens >= deployment.max_model_len for r in requests)
    if too_long and config.long_prompt == "reject":
        return _infeasible(row, f"{too_long} of {len(requests)} prompts are not shorter than "
                           f"max_model_len {deployment.max_model_len:,} (the KV pool or the "
                           "model limit); they would be rejected (--max-model-len, "
                           "--long-prompt truncate)")
    row["num_truncated"] = sum(truncate(r, deployment.max_model_len) for r in requests) \
        if config.long_prompt == "truncate" else 0
    floors = latency_floors(requests, config, deployment.max_model_len)
    row["latency_floor"] = floor_percentiles(floors, spec.targets)
    reason = impossible_reason(floors, spec.targets)
    if reason:
        return _infeasible(row, reason)
    ties = sum(a.arrival_s == b.arrival_s for a, b in zip(requests, requests[1:]))
    return _search(spec, config, row, ties)


def _row_head(spec: PlanSpec, index: int, config: RunConfig) -> dict:
    return {"index": index, "label": candidate_label(config, spec.varying),
            "settings": {d: getattr(config, d) for d in SWEEP_DIMS},
            "price_per_gpu_hour_usd": gpu_hour_price(spec.prices, config), "feasible": False,
            "reason": None, "replicas": None, "gpus": None, "cost_per_hour_usd": None,
            "latency": None, "headroom": None, "min_headroom": None, "hit_rate": None,
            "latency_floor": None, "max_rate": None, "evaluations": [], "num_simulations": 0,
            "num_stopped_early": 0, "num_steps": 0,
            "run_config": None, "kvsim_run": None, "num_truncated": 0}


def _infeasible(row: dict, reason: str) -> dict:
    return {**row, "feasible": False, "reason": reason}


def candidate_label(config: RunConfig, varying: tuple[str, ...] = ()) -> str:
    """``a100-80gb TP2`` plus the other swept settings that vary (``bs 32``, ``seqs 128``,
    ``prefix off``, the eviction policy)."""
    parts = [f"{config.gpu} TP{config.tp}"]
    if "block_size" in varying:
        parts.append(f"bs {config.block_size}")
    if "max_num_seqs" in varying:
        parts.append(f"seqs {config.max_num_seqs}")
    if "enable_prefix_caching" in varying:
        parts.append("prefix " + ("on" if config.enable_prefix_caching else "off"))
    if "eviction" in varying:
        parts.append(config.eviction)
    if "dtype" in varying:
        parts.append(config.dtype)
    if "weight_dtype" in varying:
        parts.append(f"weights {config.weight_dtype or config.dtype}")
    if "kv_offloading_size" in varying:
        parts.append(f"CPU KV {config.kv_offloading_size or 0:g} GiB")
    return " · ".join(parts)


class _Points:
    """Simulated (replicas, rate scale) points of one candidate, each simulated once (and
    stopped at a certain miss when the spec prunes)."""

    def __init__(self, spec: PlanSpec, config: RunConfig):
        self.spec, self.config, self.memo = spec, config, {}

    def meets(self, replicas: int, rate_scale: float) -> bool:
        key = (replicas, rate_scale)
        if key not in self.memo:
            self.memo[key] = measure_point(self.spec, replace(self.config, replicas=replicas),
                                           rate_scale, early_stop=self.spec.prune)
        return self.memo[key]["meets"]

    @property
    def num_stopped(self) -> int:
        return sum(p["stopped"] is not None for p in self.memo.values())

    @property
    def num_steps(self) -> int:
        return sum(p["num_steps"] for p in self.memo.values())

    def at_scale(self, rate_scale: float) -> list[dict]:
        """The points at ``rate_scale``, fewest replicas first."""
        return [p for (n, s), p in sorted(self.memo.items()) if s == rate_scale]


def measure_point(spec: PlanSpec, config: RunConfig, rate_scale: float,
                  early_stop: bool = False) -> dict:
    """Simulate the trace at ``rate_scale`` on ``config``: latencies reached, hit rate, and
    whether every request completed and every SLO target is met.

    ``early_stop``: end the simulation once it certainly misses a target
    (:class:`~kvsim.sim.plan.stop.SloStop`); such a point has ``meets`` False, ``stopped``
    saying why, and no latencies or hit rate (``None``), as its run was cut short."""
    opts = replace(spec.trace_options, rate_scale=rate_scale)
    stop = SloStop(spec.targets, spec.num_requests) if early_stop else None
    result = simulate(load_trace(spec.trace_path, opts), config, stop=stop)
    df = results.requests_frame(result)
    done = df[df["completed"] == 1]
    point = {"replicas": config.replicas, "rate_scale": rate_scale, "meets": False,
             "latency": {k: None for k, _, _ in reported_keys(spec.slo)}, "hit_rate": None,
             "num_completed": int(len(done)), "num_requests": int(len(df)),
             "num_steps": len(result.steps), "stopped": None}
    if stop is not None and stop.stopped:
        return {**point, "stopped": stop.reason}
    latency = {k: _percentile(done[m], p) for k, m, p in reported_keys(spec.slo)}
    meets = len(done) == len(df) and all(
        latency[k] is not None and latency[k] <= t for k, _, _, t in spec.targets)
    return {**point, "meets": meets, "latency": latency, "hit_rate": _hit_rate(result)}


def _percentile(values, pct: float) -> float | None:
    v = values.dropna().to_numpy()
    return float(np.percentile(v, pct)) if len(v) else None


def _hit_rate(result) -> float:
    stats = [r.kv.prefix_stats for r in result.replicas]
    queries = sum(s.num_queries_tokens for s in stats)
    return sum(s.num_hit_tokens for s in stats) / queries if queries else 0.0


def _search(spec: PlanSpec, config: RunConfig, row: dict, ties: int) -> dict:
    """Steps 3 and 4 of the module doc, filling ``row``; ``ties`` counts requests arriving
    at the same time as the one before (no rate scale separates them). Pruning, the rate
    search comes first and its sustainable rate gives the replica search its first guess."""
    points, load = _Points(spec, config), spec.trace_options.rate_scale

    def max_rate():     # (the load passed the limit's check, rounding included)
        return largest_passing(lambda s: points.meets(1, s), load, spec.rate_iterations,
                               limit=max(load, spec.max_judged_scale))
    if spec.prune:
        boundary = max_rate()
        fewest = fewest_passing(lambda n: points.meets(n, load), spec.max_replicas,
                                replica_guess(load, boundary))
    else:
        fewest = fewest_passing(lambda n: points.meets(n, load), spec.max_replicas)
        boundary = max_rate()
    row["evaluations"] = points.at_scale(load)
    row["max_rate"] = _max_rate(spec, boundary, ties)
    row.update(num_simulations=len(points.memo), num_stopped_early=points.num_stopped,
               num_steps=points.num_steps)
    if fewest is None:
        tried = sorted(n for n, scale in points.memo if scale == load)
        return _infeasible(row, _not_met(spec, points.memo[(spec.max_replicas, load)], tried))
    return _feasible(spec, config, row, points.memo[(fewest, load)])


def replica_guess(load: float, boundary) -> int | None:
    """An estimate from above of the fewest replicas at rate scale ``load``: the load over
    one replica's sustainable rate scale (``boundary.passing``), rounded up (replicas behind a
    load-aware router absorb one another's bursts, so fewer usually do); ``None`` when the
    rate search found no boundary."""
    if boundary.passing is None or boundary.failing is None:
        return None
    return max(1, math.ceil(load / boundary.passing))


def _not_met(spec: PlanSpec, point: dict, tried: list[int]) -> str:
    """Why the largest replica count missed; ``tried``: the counts simulated (the search
    skips some, taking more replicas never to raise a latency, which few requests need not
    obey)."""
    others = [n for n in tried if n != point["replicas"]]
    skipped = point["replicas"] - 1 - len(others)
    n = point["replicas"]
    head = (f"SLO not met with {n} replica{'' if n == 1 else 's'} (--max-replicas"
            + (f"; also tried {', '.join(map(str, others))}" if others else "")
            + (f"; {skipped} count{'s' if skipped > 1 else ''} between not simulated"
               if skipped > 0 else "") + "): ")
    if point["stopped"] is not None:
        return head + point["stopped"]
    missed = [f"{k.removesuffix('_s').replace('_', ' ').upper()} "
              f"{fmt_latency(point['latency'][k])} > {fmt_latency(t)}"
              for k, _, _, t in spec.targets
              if point["latency"][k] is None or point["latency"][k] > t]
    return head + (", ".join(missed) or "not every request completed")


def _feasible(spec: PlanSpec, config: RunConfig, row: dict, point: dict) -> dict:
    n = point["replicas"]
    price = row["price_per_gpu_hour_usd"]
    headroom = {k: 1.0 - point["latency"][k] / t for k, _, _, t in spec.targets}
    chosen = replace(config, replicas=n)
    return {**row, "feasible": True, "replicas": n, "gpus": n * config.tp,
            "cost_per_hour_usd": None if price is None else n * config.tp * price,
            "latency": point["latency"], "headroom": headroom,
            "min_headroom": min(headroom.values()), "hit_rate": point["hit_rate"],
            "run_config": chosen.to_dict(), "kvsim_run": run_command(spec, chosen)}


#: A rate search's bracket wider than this ratio is reported as a range (``rate_iterations``
#: 0 leaves the bracket's factor of two; the default 8 narrows it to 0.3%).
COARSE = 1.1


def _max_rate(spec: PlanSpec, boundary, ties: int) -> dict:
    """The sustainable-rate result, with a ``note`` when the search found no boundary or
    left a bracket wider than :data:`COARSE`."""
    native = spec.native_rate_per_s

    def rate(scale):
        return None if scale is None or native is None else scale * native
    note = None
    if boundary.passing is None:
        note = (f"one replica misses the SLOs even at rate scale {boundary.failing:.3g}"
                + (f"; {ties} of {spec.num_requests} requests arrive together with the one "
                   "before, which no rate scale separates" if ties else ""))
    elif boundary.failing is None:
        at = rate(boundary.passing)
        note = (f"one replica meets the SLOs up to rate scale {boundary.passing:.3g}"
                + (f" ({at:,.2f} req/s)" if at is not None else "")
                + (", the most tried: its limit lies beyond"
                   if boundary.passing < spec.max_judged_scale else
                   f": its limit lies beyond, where the trace's arrivals are {TOO_SHORT} "
                   "(a longer trace can tell)"))
    elif boundary.failing > COARSE * boundary.passing:
        low, high = rate(boundary.passing), rate(boundary.failing)
        note = (f"one replica's limit lies between rate scales {boundary.passing:.3g} and "
                f"{boundary.failing:.3g}" + (f" ({low:,.2f} and {high:,.2f} req/s)"
                                             if low is not None else "")
                + ": more --rate-iterations narrow it")
    return {"rate_scale": boundary.passing, "request_rate_per_s": rate(boundary.passing),
            "failing_rate_scale": boundary.failing,
            "failing_request_rate_per_s": rate(boundary.failing), "note": note}


def run_command(spec: PlanSpec, config: RunConfig) -> str:
    """The ``kvsim run`` command line that replays ``config`` at the planned load."""
    o, c = spec.trace_options, config
    args = ["kvsim", "run", spec.trace_label, "--model", c.model, "--gpu", c.gpu,
            "--tp", c.tp, "--replicas", c.replicas, "--router", c.router,
            "--block-size", c.block_size, "--max-num-seqs", c.max_num_seqs,
            "--max-num-batched-tokens", c.max_num_batched_tokens,
            "--gpu-memory-utilization", c.gpu_memory_utilization, "--seed", c.seed,
            "--enable-prefix-caching" if c.enable_prefix_caching
            else "--no-enable-prefix-caching", "--rate-scale", repr(o.rate_scale)]
    for flag, value in (("--eviction", c.eviction), ("--dtype", c.dtype),
                        ("--weight-dtype", c.weight_dtype),
                        ("--kv-offloading-size", c.kv_offloading_size or None),
                        ("--format", o.fmt), ("--limit", o.limit), ("--start", o.start_s),
                        ("--end", o.end_s), ("--profile", c.profile),
                        ("--max-model-len", c.max_model_len),
                        ("--long-prompt", None if c.long_prompt == "reject" else c.long_prompt),
                        ("--trace-model", o.model_filter)):
        if value is not None:
            args += [flag, value]
    return shlex.join(str(a) for a in args + (["--sort"] if o.sort else []))


def block_size_advice(spec: PlanSpec, rows: list[dict]) -> list[dict]:
    """Per GPU swept: the design article's L2 rule (the tokens whose K and V of one layer
    fill the L2 cache, at the tp of the best-ranked feasible candidate on that GPU, else the
    smallest tp swept on it) beside that candidate's block size (``None``: none)."""
    out = []
    for gpu in dict.fromkeys(c.gpu for c in spec.candidates):
        best = next((r for r in rows if r["feasible"] and r["settings"]["gpu"] == gpu), None)
        tp = best["settings"]["tp"] if best else min(c.tp for c in spec.candidates
                                                     if c.gpu == gpu)
        out.append({**suggested_block_size(spec.base.model, gpu, spec.base.dtype, tp),
                    "best_block_size": best["settings"]["block_size"] if best else None,
                    "swept_block_sizes": _swept(spec)["block_size"]})
    return out

