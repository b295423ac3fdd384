"""``kvsim plan``: the cheapest deployment whose simulated latencies meet the SLO targets.
Wiring only: the search is :mod:`kvsim.sim.plan.planner`'s, the outputs :mod:`kvsim.reports.plan`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kvsim.commands.options import (CPU_OFFLOAD_GB_OPTION, JSON_OPTION, LONG_PROMPT_OPTION,
                          MAX_MODEL_LEN_OPTION, TRACE_MODEL_OPTION, OptionGroup, emit, given_path,
                          opt, slo_option_error, trace_options, trace_reading, with_groups)
from kvsim.errors import ConfigError
from kvsim.sim.config import LongPrompt, RouterName

#: The search space and targets of ``kvsim plan`` (comma-separated candidates), as
#: :func:`kvsim.sim.plan.spec.spec_from_options` takes them.
PLAN_SEARCH = OptionGroup({
    "model": (str, typer.Option("llama-3.1-8b", "--model", help="Catalog name, HF id or "
                                "config.json.")),
    "gpu": (str, typer.Option("a100-80gb", "--gpu", help="Candidate GPUs, comma-separated.")),
    "tp": (str, typer.Option("1", "--tp", "-tp", help="Candidate tensor-parallel sizes, e.g. "
                             "1,2,4.")),
    "block_size": (str, typer.Option("16", "--block-size", help="Candidate block sizes.")),
    "max_num_seqs": (str, typer.Option("256", "--max-num-seqs", help="Candidate sequence "
                                       "caps.")),
    "enable_prefix_caching": (bool, typer.Option(
        True, "--enable-prefix-caching/--no-enable-prefix-caching", help="Prefix caching.",
        show_default="on")),
    "eviction": (Optional[str], opt("Candidate eviction policies, comma-separated.",
                                    "--eviction")),
    "dtype": (Optional[str], opt("Candidate KV (and weight) dtypes, e.g. bf16,fp8.", "--dtype")),
    "weight_dtype": (Optional[str], opt("Candidate weight dtypes, e.g. bf16,int4.",
                                        "--weight-dtype")),
    "kv_offloading_size": (Optional[str], opt(
        "Candidate CPU KV offloading tiers in GiB per replica, e.g. 0,256 (priced per "
        "GiB-hour: --price-table key 'host-memory-gib').", "--kv-offloading-size")),
    "cpu_offload_gb": (Optional[str], CPU_OFFLOAD_GB_OPTION),
    "slo_ttft_p99": (Optional[float], opt("TTFT p99 target (s).", "--slo-ttft-p99")),
    "slo_tpot_p99": (Optional[float], opt("TPOT p99 target (s).", "--slo-tpot-p99")),
    "slo_ttft_p50": (Optional[float], opt("TTFT p50 target (s).", "--slo-ttft-p50")),
    "slo_e2e_p99": (Optional[float], opt("E2E p99 target (s).", "--slo-e2e-p99")),
    "target_rate": (Optional[float], opt("Plan for this many requests/s (instead of "
                                         "--rate-scale).", "--target-rate")),
    "burst": (bool, typer.Option(False, "--burst", help="The trace is the whole load, a "
                                 "burst to absorb: judge it however short its arrivals "
                                 "(default: it stands for a sustained rate, and its arrivals "
                                 "must last long enough for a 10% overload to show).")),
    "max_replicas": (int, typer.Option(32, "--max-replicas", help="Most replicas to try.")),
    "rate_iterations": (int, typer.Option(8, "--rate-iterations", help="Bisection steps of "
                                          "the sustainable-rate search.")),
    "router": (RouterName, typer.Option("least-outstanding-tokens", "--router",
                                        help="Router between replicas.")),
    "max_num_batched_tokens": (int, typer.Option(8192, "--max-num-batched-tokens", min=1,
                                                 help="Token budget per step.")),
    "gpu_memory_utilization": (float, typer.Option(0.9, "--gpu-memory-utilization",
                                                   help="Share of GPU memory vLLM may use.")),
    "max_model_len": (Optional[int], MAX_MODEL_LEN_OPTION),
    "long_prompt": (Optional[LongPrompt], LONG_PROMPT_OPTION),
    "profile": (Optional[str], opt("Calibration profile JSON for the cost model.", "--profile")),
    "price_table": (Optional[str], opt("JSON {gpu: USD per GPU-hour} overriding the catalog "
                                       "(and 'host-memory-gib': USD per GiB-hour).",
                                       "--price-table")),
})
#: kvsim plan's exit status when no candidate meets every SLO (its files are written).
NO_DEPLOYMENT = 3
PLAN_RATE_SCALE = (Optional[float], typer.Option(
    None, "--rate-scale", help="Load: request-rate multiplier of the trace (default 1)."))


@with_groups
def plan_command(
    trace: str = typer.Argument(..., metavar="TRACE", help="Trace file, '-' for standard "
                                "input, or sample:NAME."),
    search: dict = PLAN_SEARCH,
    out: str = typer.Option(
        "kvsim-plan", "--out", metavar="DIR", callback=given_path, help="Output directory."),
    use_ray: bool = typer.Option(False, "--ray", help="Run candidates as Ray tasks."),
    ray_address: Optional[str] = opt("Ray cluster to join ('auto' as Ray means it); implies "
                                     "--ray.", "--ray-address"),
    workers: Optional[int] = opt("Local processes or Ray CPUs.", "--workers", min=1,
                                 show_default="min(4, CPUs)"),
    reading: dict = trace_reading(rate_scale=PLAN_RATE_SCALE, seed=True,
                                  model=TRACE_MODEL_OPTION),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar, no table."),
    html: bool = typer.Option(True, "--html/--no-html", help="Also write report.html."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Find the cheapest deployment whose simulated latencies meet the SLO targets.

    Searches GPU x TP (x other listed settings) and the fewest replicas for each; writes
    plan.json, plan.csv and report.html into --out."""
    from kvsim.reports import plan as plan_report
    from kvsim.reports.frames import PLAN_FILES
    from kvsim.reports.outdir import OutputDir
    from kvsim.sim.plan import spec as plan_spec
    from kvsim.sim.plan import planner
    from kvsim.sim.plan import sweep
    from kvsim.workloads.sources import resolve_trace
    path, label = resolve_trace(trace)
    rate_scale = reading["rate_scale"]
    values = {**search, "rate_scale": rate_scale, "seed": reading["seed"]}
    given = 1.0 if rate_scale is None else rate_scale
    try:
        spec = plan_spec.spec_from_options(
            path, label, trace_options(reading, rate_scale=given), values)
    except ConfigError as e:
        raise slo_option_error(e) from None
    options = sweep.SweepOptions(workers or sweep.default_workers(),
                                 use_ray or ray_address is not None, ray_address)
    with OutputDir(out, reads=[path], writes=PLAN_FILES):
        with plan_report.PlanProgress(not (quiet or as_json)) as bar:
            result = planner.plan(spec, options, bar.update)
        plan_report.write_plan_outputs(out, result, html=html)
    emit(result, as_json, None if quiet else lambda r: (
        plan_report.print_plan(r),
        typer.echo(f"wrote {Path(out) / 'plan.json'}, plan.csv" + ", report.html" * html)))
    if result["recommended"] is None:       # (a complete answer, but not a deployment)
        if quiet or as_json:
            typer.echo("kvsim: plan: no candidate meets every SLO (the reasons are in "
                       f"{Path(out) / 'plan.json'})", err=True)
        raise typer.Exit(NO_DEPLOYMENT)
