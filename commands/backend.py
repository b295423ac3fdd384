"""The commands that measure real engines: ``kvsim profile`` and ``kvsim validate`` (the torch
backend; torch is imported on use) and ``kvsim validate-real`` (a recorded vLLM run). Wiring
only: the jobs live in :mod:`kvsim.real_backend.profiling`, :mod:`kvsim.real_backend.validate`
and :mod:`kvsim.realrun`."""

from __future__ import annotations

from typing import Literal, Optional

import typer

from kvsim.commands.options import (JSON_OPTION, OFFLOAD_WRITE_OPTION, PREEMPTION_MODE_OPTION,
                                    SEED_OPTION, TRACE_MODEL_OPTION, OptionGroup, emit,
                                    given_path, opt, progress, setting, trace_options,
                                    trace_reading, with_groups)
from kvsim.sim.config import OffloadWrite, PreemptionMode, SchedulingPolicy

DEVICE_OPTION = typer.Option("cpu", "--device", help="cpu or cuda.")
BACKEND_MODEL_OPTION = typer.Option("tiny-llama", "--model", help="tiny-llama (bundled), a "
                                    "Llama-like catalog name, or a path to a config.json.")
BACKEND_BLOCK_OPTION = typer.Option(32, "--block-size", min=1, help="Tokens per KV block.")
BackendDtype = Literal["fp32", "bf16", "fp16"]
Clock = Literal["wall", "cpu"]
ProfileTiming = Literal["before", "interleaved"]
DTYPE_OPTION = typer.Option("fp32", "--dtype", help="Weights and KV cache dtype.")
THREADS_OPTION = typer.Option(1, "--threads", min=1, help="torch CPU threads (keep equal "
                              "between profile and validate).")
CLOCK_OPTION = typer.Option("wall", "--clock", help="wall (perf_counter; CUDA events on a "
                            "GPU) or cpu (process CPU time; CPU only, steadier on a busy host).")


def _backend_settings(model, device, dtype, block_size, threads, seed, clock):
    from kvsim.real_backend.backend_model import require_torch
    require_torch()
    from kvsim.real_backend.session import BackendSettings
    return BackendSettings(model=model, device=device, dtype=dtype, block_size=block_size,
                           threads=threads, seed=seed, clock=clock)


def profile_command(
    device: str = DEVICE_OPTION, model: str = BACKEND_MODEL_OPTION,
    out: str = typer.Option(
        "profile.json", "--out", metavar="FILE", callback=given_path, help="Profile to write."),
    block_size: int = BACKEND_BLOCK_OPTION, dtype: BackendDtype = DTYPE_OPTION,
    threads: int = THREADS_OPTION, clock: Clock = CLOCK_OPTION, seed: int = SEED_OPTION,
    max_num_seqs: int = typer.Option(64, "--max-num-seqs", min=1, help="Largest decode "
                                     "batch profiled."),
    max_num_batched_tokens: int = typer.Option(2048, "--max-num-batched-tokens", min=2,
                                               help="Largest step (tokens) profiled."),
    max_context: int = typer.Option(2048, "--max-context", min=2, help="Longest context "
                                    "profiled."),
    quick: bool = typer.Option(False, "--quick", help="A thinner grid (seconds)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Time the real backend over a grid of steps and fit the cost model to it.

    Writes a profile that `kvsim run --profile` and `kvsim validate --profile` use, and
    prints the fit's error per operation group."""
    settings = _backend_settings(model, device, dtype, block_size, threads, seed, clock)
    from kvsim.real_backend.profiling import Limits, profile_job, render_fit
    limits = Limits(max_num_seqs, max_num_batched_tokens, max_context)
    emit(profile_job(settings, limits, out, quick, progress), as_json,
         lambda p: typer.echo(render_fit(p) + f"\nwrote {p['path']}"))


def _engine_settings(values: dict) -> dict:
    """The engine settings; the host-tier ones only when given (0 CPU blocks: no tier)."""
    tier = {"num_cpu_blocks": values.pop("num_cpu_blocks") or None,
            "offload_write": values.pop("offload_write"),
            "preemption_mode": values.pop("preemption_mode")}
    return {**values, **{k: v for k, v in tier.items() if v is not None}}


#: The engine settings ``kvsim validate`` runs both sides with (host-tier ones only when given).
VALIDATE_ENGINE = OptionGroup({     # (defaults sized for the small CPU model, not run's)
    "num_gpu_blocks": (int, typer.Option(512, "--num-gpu-blocks", min=1, help="KV blocks "
                                         "of both sides (a small pool for the CPU model).")),
    "max_num_seqs": (int, typer.Option(16, "--max-num-seqs", min=1,
                                       help="Most requests in a batch.")),
    "max_num_batched_tokens": (int, typer.Option(512, "--max-num-batched-tokens", min=1,
                                                 help="Token budget per step.")),
    "max_model_len": (Optional[int], opt("Longest sequence.", "--max-model-len")),
    "enable_prefix_caching": (bool, typer.Option(
        True, "--enable-prefix-caching/--no-enable-prefix-caching", help="Prefix caching.",
        show_default="on")),
    "scheduling_policy": (SchedulingPolicy, typer.Option("fcfs", "--scheduling-policy",
                                                         help="Queue order.")),
    "num_cpu_blocks": (Optional[int], setting("num_cpu_blocks", "CPU KV tier in blocks per "
                                              "replica.")),
    "offload_write": (Optional[OffloadWrite], OFFLOAD_WRITE_OPTION),
    "preemption_mode": (Optional[PreemptionMode], PREEMPTION_MODE_OPTION),
}, _engine_settings)


@with_groups
def validate_command(
    trace: str = typer.Argument(..., metavar="TRACE", help="Trace file (any format), '-' for "
                                "standard input, or sample:NAME."),
    device: str = DEVICE_OPTION, model: str = BACKEND_MODEL_OPTION,
    profile: Optional[str] = typer.Option(None, "--profile", metavar="FILE", help="Fitted "
                                          "profile (kvsim profile); default: profile here, "
                                          "full grid (see --profile-timing)."),
    out: Optional[str] = typer.Option(
        None, "--out", metavar="DIR", callback=given_path,
        help="Write validation.json and validation.html here."),
    block_size: int = BACKEND_BLOCK_OPTION, dtype: BackendDtype = DTYPE_OPTION,
    threads: int = THREADS_OPTION, clock: Clock = CLOCK_OPTION, seed: int = SEED_OPTION,
    repeats: int = typer.Option(1, "--repeats", min=1, help="Forward passes timed per step "
                                "(median; tames noise)."),
    offline: bool = typer.Option(False, "--offline", help="Every request arrives at t=0."),
    noise_floor: bool = typer.Option(True, "--noise-floor/--no-noise-floor", help="Replay "
                                     "the real steps once more; judge each error against "
                                     "how much the two measurements differ."),
    quick_profile: bool = typer.Option(False, "--quick-profile", help="Without --profile: "
                                       "the quick grid, one pass (rough; says by how much)."),
    profile_timing: ProfileTiming = typer.Option(
        "interleaved", "--profile-timing", help="Without --profile: profile 'interleaved' "
        "between the real run's steps (and its replay's), as long again as the run, so the "
        "profile sees the host at the run's speed (a shared CPU host drifts 5-20 % within "
        "minutes); or 'before' the run (faster; off by that drift)."),
    breakdown: bool = typer.Option(False, "--breakdown", help="Time attention, MLP, LM head "
                                   "and host work of every real step."),
    html: bool = typer.Option(True, "--html/--no-html", help="Also write validation.html."),
    engine: dict = VALIDATE_ENGINE,
    reading: dict = trace_reading(model=TRACE_MODEL_OPTION),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run a trace through the real backend and the simulator and compare them.

    Same settings on both sides; prints the error table (step time, throughput,
    TTFT/TPOT/E2E) and checks that the cache decisions are identical."""
    if out is not None:     # before a minute of measuring, not after it
        from pathlib import Path

        from kvsim.reports.outdir import check_writable_dir
        check_writable_dir(Path(out))
    settings = _backend_settings(model, device, dtype, block_size, threads, seed, clock)
    from kvsim.real_backend.validate import ValidateJob, validate_job
    from kvsim.real_backend.validate_report import render_table
    job = ValidateJob(settings, engine, profile, repeats, offline, trace, noise_floor,
                      profile_grid="quick" if quick_profile else "full", breakdown=breakdown,
                      profile_timing=profile_timing)
    emit(validate_job(trace, trace_options(reading, seed=seed), job, out, html, progress),
         as_json, lambda r: typer.echo(render_table(r) + "".join(
             f"\nwrote {p}" for p in r.get("outputs", {}).values())))


#: The engine settings of a real run that ``kvsim validate-real`` may override.
REAL_RUN_SETTINGS = OptionGroup({
    "model": (Optional[str], opt("Model (default: the run's; tiny-llama for vllm-oracle).",
                                 "--model")),
    "gpu": (Optional[str], opt("GPU of the real run.", "--gpu")),
    "tp": (Optional[int], opt("Tensor-parallel GPUs.", "--tp")),
    "block_size": (Optional[int], opt("Tokens per KV block.", "--block-size")),
    "num_gpu_blocks": (Optional[int], opt("Usable KV blocks (a vLLM engine's less its null "
                                          "block).", "--num-gpu-blocks")),
    "max_num_seqs": (Optional[int], opt("Most requests in a batch.", "--max-num-seqs")),
    "max_num_batched_tokens": (Optional[int], opt("Token budget per step.",
                                                  "--max-num-batched-tokens")),
    "profile": (Optional[str], opt("Calibration profile for the cost model.", "--profile")),
}, lambda v: {k: x for k, x in v.items() if x is not None})


@with_groups
def validate_real_command(
    result: str = typer.Argument(..., metavar="RESULT", help="A real run: `vllm bench serve "
                                 "--save-result --save-detailed` JSON, or the output of "
                                 "vllm-oracle's replay.py (--timed)."),
    trace: Optional[str] = opt("The requests' trace (token ids, arrivals); needed for a "
                               "vllm-oracle replay (its input file).", "--trace"),
    overrides: dict = REAL_RUN_SETTINGS,
    fit: Optional[str] = opt("Fit the cost model to the run and write the profile here (for "
                             "kvsim run --profile): its step terms to the measured engine "
                             "steps (vllm-oracle), or one speed factor to the median TPOT "
                             "(vllm bench serve); also prints the error after fitting.",
                             "--fit", metavar="FILE", callback=given_path),
    as_json: bool = JSON_OPTION,
) -> None:
    """Replay a real vLLM run's requests in kvsim and print the error table.

    Same requests, same engine settings; per metric (throughput, TTFT/TPOT/E2E
    p50/p90/p99) the real value, kvsim's and the relative error."""
    from kvsim.realrun import render_validation, validate_real
    emit(validate_real(result, trace, overrides, fit, source="command line"), as_json,
         lambda r: typer.echo(render_validation(r) + (
             f"\nwrote {r['profile']}" if "profile" in r else "")))
