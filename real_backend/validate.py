"""``kvsim validate``: the same trace through the real backend and through the simulator.

Two runs of ``kvsim.sim.serving.runner.simulate`` with one :class:`RunConfig`:

- *real*: a :class:`TorchExecutor` performs every step and the clock advances by measured time.
  It is wrapped in :class:`PredictingExecutor`, which keeps a snapshot of every plan, so every
  step gets a measured and a predicted duration (aligned by construction);
- *sim*: the :class:`CostModel` alone (the ordinary simulated run, skip-ahead included).

The report holds the median absolute relative error of the step duration (per step, also per
step kind), the relative error of throughput and of TTFT/TPOT/E2E p50/p90 (sim vs real), and
whether the cache decisions were identical: step count, per-step scheduled tokens, prefix hit
tokens, preemptions, block transfers, per-request cached tokens. Decisions can only differ when
arrivals interleave differently with steps of different lengths (``offline=True`` sets every
arrival to 0, which rules that out).

Without a profile file it profiles the backend itself: by default between the real run's
steps (:mod:`.interleaved_profile`), so the profile sees the host at the run's speed, or
before the run (``profile_timing="before"``: three passes over the grid); the full grid
unless ``profile_grid="quick"`` asks for the rough one. The cost model's predictions are made
afterwards, from snapshots of the very steps that ran.

Unless told not to, it also measures its noise floor (the real run's own steps replayed once
more, :mod:`.noise_floor`) and judges the step and throughput errors against it; and it says
how far its profile can be trusted (``profile_quality``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from kvsim.errors import ConfigError
from kvsim.sim.serving import results
from kvsim.sim.config import RunConfig, located
from kvsim.sim.perf.cost_model import CostModel
from kvsim.sim.serving.executor import Executor
from kvsim.sim.serving.runner import RunResult, simulate

from kvsim.real_backend import noise_floor as nf
from kvsim.real_backend.breakdown import PARTS, StepBreakdown, mean_record
from kvsim.real_backend.interleaved_profile import InterleavedProfile
from kvsim.real_backend.torch_executor import TorchExecutor, clock_fn, interlude
from kvsim.real_backend.profiling import Limits, quiet
from kvsim.real_backend.validate_profile import (INTERLEAVED, check_timing,
                                                 load_or_make_profile, profile_mismatch,
                                                 profile_quality, profile_source)
from kvsim.real_backend.session import (BackendSettings, build_runner, device_name, keep_warm,
                                        prepare_device, warm_up)

METRICS = (("throughput_output_tokens_per_s", None), ("ttft_s", "p50"), ("ttft_s", "p90"),
           ("tpot_s", "p50"), ("tpot_s", "p90"), ("e2e_s", "p50"), ("e2e_s", "p90"))
DECISION_COLUMNS = ("batch_size", "scheduled_tokens", "preemptions", "prefix_hit_tokens",
                    "swap_out_blocks", "swap_in_blocks", "offload_blocks", "promote_blocks",
                    "compact_blocks")


@dataclass(frozen=True)
class ValidateJob:
    """A validation: backend settings, engine settings (``RunConfig`` fields), the profile."""

    settings: BackendSettings = BackendSettings()
    engine: dict = field(default_factory=dict)   # RunConfig overrides (num_gpu_blocks, ...)
    profile: str | None = None                   # fitted profile JSON; None: profile here
    repeats: int = 1                             # forward passes timed per step (median)
    offline: bool = False                        # every request arrives at t = 0
    trace_label: str = "trace"
    noise_floor: bool = True                     # replay the real steps once more, compare
    profile_grid: str = "full"                   # no profile given: "full" or "quick" grid
    profile_rounds: int | None = None            # passes over that grid (None: the grid's)
    breakdown: bool = False                      # time attention, MLP, LM head, host per step
    warmup_s: float = 0.0                        # extra decode steps before the real run
    profile_timing: str = INTERLEAVED            # no profile given: measured between the
    #                                              real steps, or BEFORE the run
    profile_share: float = 1.0                   # interleaved: profiling time per run second


def _nothing() -> None:
    """The default ``between`` of :class:`PredictingExecutor`."""


class PredictingExecutor(Executor):
    """Runs each step on the real backend (its duration is what the loop sees) and keeps a
    snapshot of its plan, so :meth:`predict` can ask the cost model about the very same steps
    afterwards. ``between`` runs after each step, untimed (an interleaved profile's slice).
    No decode runs: no skipping ahead."""

    supports_decode_runs = False

    def __init__(self, real: TorchExecutor, breakdown: StepBreakdown | None = None,
                 between: Callable[[], None] = _nothing) -> None:
        self.real, self.breakdown, self.between = real, breakdown, between
        self.measured: list[float] = []
        self.kinds: list[str] = []
        self.kv_tokens: list[int] = []   # KV the step attends over, sum of (computed + new)
        self.plans: list = []            # snapshots, for the predictions and the replay
        self.parts: list[dict] = []      # per step, with a breakdown: mean forward pass parts
        self.real_wall_s = 0.0           # wall time of the run, profiling between steps left out

    def step_duration(self, plan) -> float:
        self.kinds.append(step_kind(plan))
        self.kv_tokens.append(int(CostModel.step_sums(plan)[2]))
        self.plans.append(nf.snapshot(plan))
        self.measured.append(_with_parts(self.real, plan, self.breakdown, self.parts))
        self.between()
        return self.measured[-1]

    def predict(self, model: CostModel) -> list[float]:
        """The cost model's duration of every step run so far."""
        return [model.step_duration(plan) for plan in self.plans]

    def transfer_time(self, plan) -> float:
        return self.real.transfer_time(plan)


def _with_parts(executor, plan, breakdown: StepBreakdown | None, parts: list) -> float:
    """``executor.step_duration(plan)``, and (with a breakdown) the step's mean forward pass
    parts appended to ``parts``."""
    if breakdown is None:
        return executor.step_duration(plan)
    first = len(breakdown.records)
    seconds = executor.step_duration(plan)
    parts.append(mean_record(breakdown.records[first:]))
    return seconds


def step_kind(plan) -> str:
    """``decode`` (every request one new token), ``prefill`` (none has one) or ``mixed``."""
    ones = sum(1 for s in plan.scheduled if s.num_new_tokens == 1)
    if not plan.scheduled:
        return "transfer"
    return "decode" if ones == len(plan.scheduled) else "prefill" if not ones else "mixed"


def run_config(job: ValidateJob, sim_model: str, profile_path: str | None) -> RunConfig:
    """The engine settings both runs share (the backend's block size and dtype)."""
    s = job.settings
    values = {"num_gpu_blocks": 512, "max_num_seqs": 16, "max_num_batched_tokens": 512,
              **job.engine, "trace": job.trace_label, "model": sim_model,
              "block_size": s.block_size, "dtype": s.dtype, "profile": profile_path,
              "seed": s.seed}
    config = RunConfig.from_dict(values, source="validate")
    config.validate()
    return config


def _offline(requests: list) -> list:
    return [dataclasses.replace(r, arrival_s=0.0) for r in requests]


def validate(requests: Iterable, job: ValidateJob,
             progress: Callable[[str], None] = quiet) -> dict:
    """Run both sides and return the validation report (see :func:`compare`); ``progress``
    receives a line as each part (profile, real run, noise floor) ends."""
    check_timing(job.profile_timing, job.profile_share)
    model = prepare_device(job.settings)
    reqs = _offline(list(requests)) if job.offline else list(requests)
    if not reqs:
        raise ConfigError("the trace has no requests", field="trace")
    config = run_config(job, model.sim_model, None)
    if job.profile:     # checked now, naming the file (it failed after the real run)
        try:
            CostModel(model.sim_model, config.gpu, 1, config.block_size, profile=job.profile,
                      dtype=config.dtype)       # (its model's shape against this one's too)
        except ConfigError as e:
            raise located(e, str(job.profile)) from None
    tee, real, profile, replayed = _real_side(job, model, config, reqs, progress)
    cost = CostModel(model.sim_model, config.gpu, 1, config.block_size, profile=profile,
                     dtype=config.dtype)
    predicted = tee.predict(cost)
    sim = simulate(reqs, config, executor=cost, keep_steps=True)
    report = compare(real, sim, predicted, tee.kinds, tee.kv_tokens)
    if replayed is not None:
        report["noise_floor"], steps = replayed
        report["steps"].update(steps)
    if tee.breakdown is not None:
        report["steps"]["parts"] = {k: [p[k] for p in tee.parts] for k in PARTS + ("total",)}
        tee.breakdown.detach()
    report["verdicts"] = nf.verdicts(report)
    report["speed_refit"] = nf.speed_refit(tee.measured, predicted)
    report.update(_provenance(job, config, profile), real_wall_s=tee.real_wall_s)
    return report


def _real_side(job: ValidateJob, model, config: RunConfig, reqs: list,
               progress: Callable[[str], None]) -> tuple:
    """The real run, its replay (the noise floor; None without one) and the profile: made
    first, read from the job's file, or measured between the steps of both runs."""
    longest = max(r.prompt_tokens + r.output_tokens for r in reqs)
    limits = Limits(config.max_num_seqs, config.max_num_batched_tokens,
                    min(longest, model.spec.max_model_len))
    interleaved = job.profile is None and job.profile_timing == INTERLEAVED
    profile = {} if interleaved else load_or_make_profile(job, limits, progress)
    runner, breakdown = _ready_runner(job, model, config, profile)
    profiler = (InterleavedProfile(runner, job.settings, model, limits, job.profile_share,
                                   quick=job.profile_grid == "quick",
                                   min_passes=job.profile_rounds or 1)
                if interleaved else None)
    tee = PredictingExecutor(_executor(runner, reqs, job), breakdown,
                             profiler.between_steps if profiler else _nothing)
    if profiler is not None:
        profiler.start()
    start = time.perf_counter()
    real = simulate(reqs, config, executor=tee, keep_steps=True)
    tee.real_wall_s = time.perf_counter() - start - (profiler.spent_s if profiler else 0.0)
    progress(f"validate: real run, {len(tee.measured)} steps in {tee.real_wall_s:.1f}s")
    replayed = None
    if job.noise_floor:
        replayed = _replay_floor(runner, reqs, job, tee, real, breakdown)
        progress("validate: noise floor (the real steps replayed) done")
    if profiler is not None:
        profile = profiler.profile(progress)
    return tee, real, profile, replayed


def _ready_runner(job: ValidateJob, model, config: RunConfig, profile: dict):
    """The real backend's runner, warmed up as the profile was measured (its LM head layouts,
    a fresh tuning may choose others), and its step breakdown when ``job`` asks for one."""
    runner = build_runner(job.settings, model, config.num_gpu_blocks,
                          num_host_blocks=config.num_cpu_blocks or 0)
    warm_up(runner, config.max_num_seqs, profile.get("cpu_head_layouts"))
    if job.warmup_s > 0:
        keep_warm(runner, job.warmup_s, config.max_num_seqs // 2)
    if not job.breakdown:
        return runner, None
    return runner, StepBreakdown(clock_fn(job.settings.clock)).attach(runner)


def _provenance(job: ValidateJob, config: RunConfig, profile: dict) -> dict:
    """What the report says of how it was made: settings, device, profile and its quality."""
    quality = profile_quality(profile, profile_source(job))
    return dict(settings=job.settings.to_dict(), device_name=device_name(job.settings.device),
                config=config.to_dict(), repeats=job.repeats, offline=job.offline,
                profile_source=job.profile or quality["source"], profile_quality=quality,
                profile_fit_error=profile.get("fit_error"),
                profile_mismatch=profile_mismatch(profile, job.settings))


def _executor(runner, reqs: list, job: ValidateJob) -> TorchExecutor:
    return TorchExecutor(runner, reqs, clock=job.settings.clock, repeats=job.repeats)


def _replay_floor(runner, reqs: list, job: ValidateJob, tee: PredictingExecutor,
                  real: RunResult, breakdown: StepBreakdown | None) -> tuple[dict, dict]:
    """Replay the real run's steps (:func:`.noise_floor.replay`, ``tee.between`` and the
    engine-like host work before each) and compare the two measurements: the noise floor, and
    the replay's step times (and, with a breakdown, parts) for ``report["steps"]``."""
    again = _executor(runner, reqs, job)
    parts: list[dict] = []

    def between() -> None:
        tee.between()
        interlude()
    second = nf.replay(_PartsExecutor(again, breakdown, parts), tee.plans, between)
    out = nf.floor(tee.measured, second, real.duration_s)
    out["same_outputs"] = again.outputs == tee.real.outputs
    steps: dict = {"replayed_s": second}
    if breakdown is not None:
        steps["replayed_parts"] = {k: [p[k] for p in parts] for k in PARTS + ("total",)}
    return out, steps


class _PartsExecutor:
    """An executor that also collects each step's breakdown parts (see :func:`_with_parts`)."""

    def __init__(self, executor, breakdown: StepBreakdown | None, parts: list) -> None:
        self.executor, self.breakdown, self.parts = executor, breakdown, parts

    def step_duration(self, plan) -> float:
        return _with_parts(self.executor, plan, self.breakdown, self.parts)


def _rel(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return abs(sim - real) / abs(real)


def step_errors(measured: np.ndarray, predicted: np.ndarray, kinds: list[str]) -> dict:
    """Median (and p90) absolute relative error of step duration, overall and per kind."""
    err = np.abs(predicted - measured) / measured
    kind = np.asarray(kinds)
    out = {"all": _err_stats(err)}
    for k in ("prefill", "decode", "mixed", "transfer"):
        if (kind == k).any():
            out[k] = _err_stats(err[kind == k])
    out["total_time_rel_error"] = _rel(float(predicted.sum()), float(measured.sum()))
    out["total_time_signed_error"] = float(predicted.sum() / measured.sum() - 1)
    return out


def _err_stats(err: np.ndarray) -> dict:
    return {"steps": int(len(err)), "median_abs_rel_error": float(np.median(err)),
            "p90_abs_rel_error": float(np.percentile(err, 90))}


def _frames(run: RunResult) -> tuple:
    """``(steps, requests)`` frames of a run."""
    return results.steps_frame(run), results.requests_frame(run)


def decisions(real_steps, sim_steps, real_requests, sim_requests) -> dict:
    """Whether two runs (their step and request frames) made the same cache and scheduling
    decisions."""
    same_len = len(real_steps) == len(sim_steps)
    per_step = same_len and all(
        np.array_equal(real_steps[c].to_numpy(), sim_steps[c].to_numpy())
        for c in DECISION_COLUMNS)
    totals = {c: (int(real_steps[c].sum()), int(sim_steps[c].sum())) for c in DECISION_COLUMNS}
    cached = [f["cached_tokens"].to_numpy() for f in (real_requests, sim_requests)]
    return {"num_steps": (len(real_steps), len(sim_steps)), "totals": totals,
            "per_step_identical": bool(per_step),
            "cached_tokens_identical": bool(np.array_equal(*cached)),
            "identical": bool(per_step and np.array_equal(*cached))}


def compare(real: RunResult, sim: RunResult, predicted: list[float], kinds: list[str],
            kv_tokens: list[int]) -> dict:
    """The validation report of a real run (with per-step predictions, kinds and KV tokens)
    and a simulated run."""
    (real_steps, real_requests), (sim_steps, sim_requests) = _frames(real), _frames(sim)
    measured = real_steps["duration"].to_numpy()
    summaries = {"real": results.build_summary(real, real_requests),
                 "sim": results.build_summary(sim, sim_requests)}
    metrics = {}
    for key, pct in METRICS:
        r, s = (summaries[n][key] if pct is None else summaries[n][key][pct]
                for n in ("real", "sim"))
        metrics[key if pct is None else f"{key}.{pct}"] = {"real": r, "sim": s,
                                                          "rel_error": _rel(s, r)}
    return {
        "step_duration": step_errors(measured, np.asarray(predicted), kinds),
        "mean_step_s": {"real": float(measured.mean()),
                        "sim": float(sim_steps["duration"].mean())},
        "metrics": metrics,
        "decisions": decisions(real_steps, sim_steps, real_requests, sim_requests),
        "num_requests": summaries["real"]["num_requests"],
        "num_completed": {n: summaries[n]["num_completed"] for n in summaries},
        "duration_s": {n: summaries[n]["duration_s"] for n in summaries},
        "steps": {"measured_s": measured.tolist(), "predicted_s": list(predicted),
                  "scheduled_tokens": real_steps["scheduled_tokens"].astype(int).tolist(),
                  "batch_size": real_steps["batch_size"].astype(int).tolist(), "kind": kinds,
                  "kv_tokens": list(kv_tokens)},
    }



def validate_job(trace_path, trace_options, job: ValidateJob, out_dir=None,
                 html: bool = True, progress: Callable[[str], None] = quiet) -> dict:
    """``kvsim validate``: read the trace, validate, write ``validation.json``/``.html`` into
    ``out_dir`` when given; returns the report (with ``outputs``, the written paths)."""
    from kvsim.workloads.sources import resolve_trace
    from kvsim.workloads import load_trace

    from kvsim.real_backend.validate_report import write_outputs
    path, label = resolve_trace(str(trace_path))   # a file, or sample:NAME
    report = validate(load_trace(path, trace_options), job, progress)
    report["trace"] = label
    if out_dir is not None:
        report["outputs"] = write_outputs(out_dir, report, html=html)
    return report
