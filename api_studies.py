"""``kvsim.compare``, ``kvsim.plan`` and ``kvsim.hitrate``: the studies of many runs, from Python.

Like :func:`kvsim.run`: every input is checked before any work (a one-line
:class:`~kvsim.errors.ConfigError`, a ``ValueError``), nothing is written unless a ``write`` or
``report`` method is called, and the numbers equal the command line's (``kvsim compare``,
``kvsim plan``, ``kvsim hitrate``). See ``docs/api.md``.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from kvsim.api import (PYTHON_LABEL, TRACE_KEYWORDS, Result, Trace, checked_count,
                       checked_flag, checked_path, checked_rate, checked_slo, config_trace,
                       load_trace, plain, plain_keywords, run_config, run_frames,
                       split_keywords, trace_options, trace_source, warn_rejected)
from kvsim.cache.hitrate import DEFAULT_LOOKAHEAD_S
from kvsim.cache.policies import POLICY_NAMES
from kvsim.errors import ConfigError
from kvsim.output_file import refuse_overwriting
from kvsim.sim.config import CPU_OFFLOAD_GB_REFUSAL, located
from kvsim.sim.perf._catalog import close_matches


def _trace_file(trace: Any, reading: dict, where: str) -> tuple[str | None, Any]:
    """(the trace argument as a file name or sample, its :class:`TraceOptions`). A
    :class:`Trace` loaded from a file stands for that file and its reading options."""
    if isinstance(trace, Trace):
        if trace.path is None or reading:
            raise ConfigError("needs a trace file (a path, sample:NAME or a Trace from "
                              "kvsim.load_trace, without further trace options)",
                              location=where, field="trace")
        if not trace.is_as_read:
            raise ConfigError(f"the Trace was changed after kvsim.load_trace read it, and "
                              f"each run reads {trace.label} again: write the requests to "
                              "a trace file, or give them to kvsim.run one configuration "
                              "at a time", location=where, field="trace")
        return str(trace.path), trace.options
    if trace is not None and not isinstance(trace, (str, os.PathLike)):
        raise ConfigError("needs a trace file: a path, sample:NAME or a Trace from "
                          "kvsim.load_trace", location=where, field="trace")
    return (None if trace is None else os.fspath(trace)), trace_options(reading, call=where)


# --- compare ------------------------------------------------------------------------------------

@dataclass
class Comparison:
    """A grid of runs: ``runs`` (a :class:`Result` per configuration, in grid order, first
    dimension slowest), ``labels`` (``eviction=lru block_size=16``), ``table`` (one row per
    run: the ``kvsim compare`` table's numbers)."""

    labels: list[str]
    runs: list[Result]
    spec: Any
    points: list

    @property
    def table(self) -> pd.DataFrame:
        """One row per run, indexed by label: the ``kvsim compare`` table's numbers, and
        ``identical_to``, the first earlier run with identical results ("" if none)."""
        from kvsim.reports.grid_table import identical_to, table_metrics
        same = identical_to(self.labels, [r.summary for r in self.runs])
        rows = [{"label": label, **table_metrics(r.summary), "identical_to": other or ""}
                for label, r, other in zip(self.labels, self.runs, same)]
        return pd.DataFrame(rows).set_index("label")

    def write(self, out_dir: str | os.PathLike, *, html: bool = True) -> dict:
        """Write what ``kvsim compare --out`` writes (a run directory per configuration,
        ``compare.json``, ``report.html``); returns the ``compare.json`` dict."""
        checked_flag(html, "html", "Comparison.write")
        checked_path(out_dir, "out_dir", "Comparison.write")
        from kvsim.grid import compare_result, run_dirs, run_pages
        from kvsim.reports.frames import COMPARE_FILE, COMPARE_FILES
        from kvsim.reports.html import render_compare_report
        from kvsim.reports.io import write_json_atomic
        from kvsim.reports.run_outputs import write_run_outputs
        from kvsim.reports.outdir import OutputDir
        out = Path(out_dir)
        traces = {point.job.trace_path for point in self.points}
        with OutputDir(out, subdirs=run_dirs(self.points), option="out_dir", reads=traces,
                       writes=COMPARE_FILES):
            for point, r in zip(self.points, self.runs):
                write_run_outputs(out / point.job.out_dir.name, r.summary, r.requests,
                                  r.timeline, html=html, plotlyjs="parent")
            result = compare_result(self.spec, self.points, [r.summary for r in self.runs])
            if html:
                render_compare_report(self._frames(), out / "report.html", self.spec.slo,
                                      plotlyjs="sibling", pages=run_pages(self.points))
            write_json_atomic(out / COMPARE_FILE, result)
        return result

    def report(self, path: str | os.PathLike) -> Path:
        """Write the comparison's HTML report (every run overlaid) to ``path``."""
        from kvsim.reports.html import render_compare_report
        checked_path(path, "path", "Comparison.report")
        refuse_overwriting(Path(path), {p.job.trace_path for p in self.points}, "path")
        return render_compare_report(self._frames(), path, self.spec.slo)

    def _frames(self) -> list[tuple]:
        return [(label, r.summary, r.requests, r.timeline)
                for label, r in zip(self.labels, self.runs)]

    def __repr__(self) -> str:
        return f"<kvsim.Comparison of {len(self.runs)} runs: {', '.join(self.labels)}>"


def _simulate_point(point) -> tuple:
    """One grid point's frames (module level: runs in a worker process)."""
    from kvsim.sim.serving.runner import simulate
    from kvsim.workloads import load_trace as read
    from kvsim.workloads.sharing import scan_trace_sharing
    left_out = Counter()
    requests = partial(read, point.job.trace_path, point.job.trace_options, left_out)
    return run_frames(simulate(requests(), point.job.config, sharing=scan_trace_sharing(requests),
                               trace_options=point.job.trace_options, left_out=left_out))


def compare(trace: Any = None, *, config: Any = None, workers: int = 1,
            slo: dict | None = None, **settings: Any) -> Comparison:
    """Run every combination of the settings given as lists (``eviction=["lru", "lfu"],
    block_size=[16, 32]``); a single value is shared by all runs. ``trace``, ``config``,
    ``slo`` and the trace keywords as in :func:`kvsim.run`; ``workers`` processes."""
    from kvsim.grid import CompareSpec, grid_points
    from kvsim.sim.plan.sweep import SweepOptions, run_tasks
    reading, settings = split_keywords(plain_keywords(settings))
    slo = checked_slo(slo, "kvsim.compare")
    workers = checked_count(workers, "workers", "kvsim.compare")
    path, options = _trace_file(trace if trace is not None else config_trace(
        config, "kvsim.compare"), reading, "kvsim.compare")
    dims = {k: list(v) if isinstance(v, (list, tuple)) else [v] for k, v in settings.items()}
    if any(not v for v in dims.values()):
        raise ConfigError("needs at least one value", location="kvsim.compare",
                          field=next(k for k, v in dims.items() if not v))
    base = run_config(PYTHON_LABEL, {}, config, "kvsim.compare").to_dict()
    base.pop("trace")
    spec = CompareSpec(path, dims, base, options, Path("."), slo)
    points = grid_points(spec, "kvsim.compare")    # every configuration checked before any run
    frames = run_tasks(_simulate_point, points, SweepOptions(workers=workers))
    runs = []
    for point, (summary, requests, steps, timeline) in zip(points, frames):
        if slo:
            summary["slo"] = dict(slo)
        if summary["num_rejected"]:
            warn_rejected(summary, f"kvsim.compare ({point.label})")
        runs.append(Result(summary, requests, steps, timeline, point.job.config))
    return Comparison([p.label for p in points], runs, spec, points)


# --- plan ---------------------------------------------------------------------------------------

#: ``kvsim.plan``'s candidate settings and their defaults (lists are candidates to try).
PLAN_DEFAULTS = dict(
    model="llama-3.1-8b", gpu="a100-80gb", tp=1, block_size=16, max_num_seqs=256,
    enable_prefix_caching=True, eviction=None, dtype=None, weight_dtype=None,
    kv_offloading_size=None, router=None, max_num_batched_tokens=8192,
    gpu_memory_utilization=0.9, max_model_len=None, long_prompt=None, profile=None, seed=0)
PLAN_SLO_KEYS = ("ttft_p99_s", "tpot_p99_s", "ttft_p50_s", "e2e_p99_s")
_LISTS = ("gpu", "tp", "block_size", "max_num_seqs", "eviction", "dtype", "weight_dtype",
          "kv_offloading_size")


@dataclass
class Plan:
    """The ranked plan: ``result`` (the ``plan.json`` dict), ``table`` (``plan.csv``, best
    first), ``recommended`` (the cheapest candidate meeting every SLO, or ``None``)."""

    result: dict

    @property
    def table(self) -> pd.DataFrame:
        """``plan.csv``: one row per candidate, best first."""
        from kvsim.reports.plan import plan_frame
        return plan_frame(self.result)

    @property
    def recommended(self) -> dict | None:
        """The cheapest candidate meeting every SLO (its ``plan.json`` entry), or None."""
        return self.result["recommended"]

    def write(self, out_dir: str | os.PathLike, *, html: bool = True) -> dict[str, Path]:
        """Write ``plan.json``, ``plan.csv`` and ``report.html`` as ``kvsim plan --out``."""
        checked_flag(html, "html", "Plan.write")
        checked_path(out_dir, "out_dir", "Plan.write")
        from kvsim.reports.frames import PLAN_FILES
        from kvsim.reports.outdir import OutputDir
        from kvsim.reports.plan import write_plan_outputs
        with OutputDir(out_dir, option="out_dir", reads=[self.result.get("trace")],
                       writes=PLAN_FILES):
            return write_plan_outputs(out_dir, self.result, html=html)

    def report(self, path: str | os.PathLike) -> Path:
        """Write the plan's HTML report to ``path``; returns the path."""
        from kvsim.reports.plan import render_plan_report
        checked_path(path, "path", "Plan.report")
        refuse_overwriting(Path(path), [self.result.get("trace")], "path")
        return render_plan_report(self.result, path)

    def __repr__(self) -> str:
        best = self.recommended
        return f"<kvsim.Plan: {best['label'] if best else 'no candidate meets the SLOs'}>"


def _plan_values(slo: dict, candidates: dict, extra: dict) -> dict:
    if "cpu_offload_gb" in candidates:
        raise ConfigError(CPU_OFFLOAD_GB_REFUSAL, location="kvsim.plan", field="cpu_offload_gb")
    unknown = sorted(set(candidates) - set(PLAN_DEFAULTS))
    if unknown:
        hint = close_matches(unknown[0], {k: k for k in PLAN_DEFAULTS})
        raise ConfigError(f"not a plan setting{hint}; known: {', '.join(PLAN_DEFAULTS)}",
                          location="kvsim.plan", field=unknown[0])
    bad = sorted(set(slo) - set(PLAN_SLO_KEYS))
    if bad or not slo:
        raise ConfigError(f"SLO targets are some of {', '.join(PLAN_SLO_KEYS)}" if bad else
                          f"give at least one SLO target ({', '.join(PLAN_SLO_KEYS)})",
                          location="kvsim.plan", field=bad[0] if bad else "slo")
    values = {**PLAN_DEFAULTS, **candidates, **extra}
    for name in _LISTS:
        if values[name] is not None and not isinstance(values[name], (list, tuple, str)):
            values[name] = [values[name]]
    values.update({f"slo_{k[:-2]}": v for k, v in slo.items()})
    return values


def plan(trace: Any = None, *, slo: dict | None = None, target_rate: float | None = None,
         price_table: str | None = None, max_replicas: int = 32, rate_iterations: int = 8,
         burst: bool = False, workers: int = 1, **candidates: Any) -> Plan:
    """The cheapest deployment meeting ``slo`` (``{"ttft_p99_s": 2, "tpot_p99_s": 0.1}``) for
    ``trace`` at its own rate (``rate_scale=`` scales it) or at ``target_rate`` requests/s,
    as a sustained rate (``burst=True``: the trace is the whole load, however short).
    Candidate settings take a value or a list (``gpu=["a100-80gb", "h100-80gb"], tp=[1, 2]``);
    see :data:`PLAN_DEFAULTS`."""
    from kvsim.sim.plan import spec as plan_spec
    from kvsim.sim.plan import planner
    from kvsim.sim.plan.sweep import SweepOptions
    reading, candidates = split_keywords(plain_keywords(candidates))
    workers = checked_count(workers, "workers", "kvsim.plan")
    max_replicas = checked_count(max_replicas, "max_replicas", "kvsim.plan")
    rate_iterations = checked_count(rate_iterations, "rate_iterations", "kvsim.plan", 0)
    target_rate = checked_rate(target_rate, "target_rate", "kvsim.plan")
    path, options = _trace_file(trace, reading, "kvsim.plan")
    from kvsim.workloads.sources import resolve_trace
    file, label = resolve_trace(path)
    checked_flag(burst, "burst", "kvsim.plan")
    if price_table is not None:
        price_table = checked_path(price_table, "price_table", "kvsim.plan")
    extra = dict(target_rate=target_rate, price_table=price_table, max_replicas=max_replicas,
                 rate_iterations=rate_iterations, burst=burst,
                 rate_scale=reading.get("rate_scale"))
    values = _plan_values(slo or {}, candidates, extra)
    try:
        spec = plan_spec.spec_from_options(file, label, options, values)
    except ConfigError as e:
        raise located(e, "kvsim.plan") from None
    return Plan(planner.plan(spec, SweepOptions(workers=workers)))


# --- hitrate ------------------------------------------------------------------------------------

@dataclass
class HitRates:
    """Cache-only replay: ``table`` (policy, capacity_blocks, capacity_tokens, hit_tokens,
    hit_rate, belady_share), ``result`` (the ``hitrate.json`` dict)."""

    result: dict

    @property
    def table(self) -> pd.DataFrame:
        """One row per policy and capacity (``hitrate.json``'s rows)."""
        return pd.DataFrame(self.result["rows"])

    def write(self, out_dir: str | os.PathLike, *, html: bool = True) -> dict[str, Path]:
        """Write ``hitrate.json`` and ``hitrate.html`` as ``kvsim hitrate --out``."""
        checked_flag(html, "html", "HitRates.write")
        checked_path(out_dir, "out_dir", "HitRates.write")
        from kvsim.reports.html import write_hitrate_outputs
        return write_hitrate_outputs(self.result, Path(out_dir), html, option="out_dir")

    def report(self, path: str | os.PathLike) -> Path:
        """Write the hit-rate curves' HTML report to ``path``; returns the path."""
        from kvsim.reports.html import render_hitrate_report
        checked_path(path, "path", "HitRates.report")
        return render_hitrate_report(self.table, path, config={
            k: v for k, v in self.result.items() if k != "rows"})

    def __repr__(self) -> str:
        rows = self.result["rows"]
        policies = dict.fromkeys(r["policy"] for r in rows)
        return (f"<kvsim.HitRates {self.result.get('trace')}: {len(policies)} policies "
                f"({', '.join(policies)}) x {len(rows) // max(1, len(policies))} capacities>")


def _csv(values: Sequence | int | str | None) -> str | None:
    """A value or a list of values as the command line's comma-separated text (each then
    checked there); a number that is no int, or no list, passes as itself to be refused."""
    if values is None or isinstance(values, str):
        return values
    if isinstance(values, int) or not isinstance(values, (list, tuple, range)):
        return str(values)
    return ",".join(str(v) for v in values)


def _check_hitrate_args(block_size, lookahead_s, reading: dict) -> None:
    """:func:`hitrate`'s arguments besides the trace, capacities and policies, checked."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(f"must be a positive integer, got {block_size!r}",
                          location="kvsim.hitrate", field="block_size")
    if isinstance(lookahead_s, bool) or not isinstance(lookahead_s, (int, float)) \
            or not 0 <= lookahead_s < math.inf:
        raise ConfigError(f"must be a number of seconds >= 0, got {lookahead_s!r}",
                          location="kvsim.hitrate", field="lookahead_s")
    unknown = sorted(set(reading) - set(TRACE_KEYWORDS))
    if unknown:
        raise ConfigError(f"not a hitrate setting or trace option; trace options: "
                          f"{', '.join(TRACE_KEYWORDS)}", location="kvsim.hitrate",
                          field=unknown[0])


def hitrate(trace: Any = None, *, capacity: Sequence[int] | int | None = None,
            capacity_tokens: Sequence[int] | int | None = None, block_size: int = 16,
            eviction: Sequence[str] | str | None = None, lookahead_s: float = DEFAULT_LOOKAHEAD_S,
            **reading: Any) -> HitRates:
    """Prefix hit rate of each eviction policy (default: every one, as ``kvsim hitrate``) at
    each cache capacity (blocks, or ``capacity_tokens``), replaying the cache only (no
    timing); ``lookahead_s``: the lookahead policy's window. ``trace`` as in
    :func:`kvsim.run`, or a list of requests."""
    from kvsim.cache import hitrate as hr
    capacity, capacity_tokens, block_size, lookahead_s = (
        plain(capacity), plain(capacity_tokens), plain(block_size), plain(lookahead_s))
    _check_hitrate_args(block_size, lookahead_s, reading)
    try:
        caps = hr.parse_capacities(_csv(capacity), _csv(capacity_tokens), block_size,
                                   ("capacity", "capacity_tokens"))
        policies = hr.parse_policies(",".join(POLICY_NAMES) if eviction is None
                                     else _csv(eviction))
    except ConfigError as e:
        raise located(e, "kvsim.hitrate") from None
    if trace is None or isinstance(trace, (str, os.PathLike)):
        requests = load_trace(trace, **reading)
        label = requests.label
    else:       # (requests given in Python: checked as kvsim.run checks them)
        label, requests = trace_source(trace, reading, "kvsim.hitrate")
    result = hr.hitrate_curves(iter(requests), caps, policies, block_size, float(lookahead_s))
    return HitRates({**result, "trace": label,
                     "trace_rows_left_out": getattr(requests, "rows_left_out", {})})
