"""The ``kvsim`` command line. Wiring only: every command calls into the packages.

Conventions every command follows:
- ``--json`` prints the command's machine-readable result on stdout and nothing else;
- a :class:`kvsim.errors.KvsimError` becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from . import __version__
from .errors import KvsimError

app = typer.Typer(
    name="kvsim",
    help="Simulate and plan the KV cache of LLM serving engines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JSON_OPTION = typer.Option(False, "--json", help="Print the machine-readable result as JSON.")


def emit(result: Any, as_json: bool, render=None) -> None:
    """Print ``result`` as JSON (``--json``) or through ``render`` for people."""
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, sort_keys=True, default=_jsonable) + "\n")
    elif render is not None:
        render(result)


def _jsonable(value: Any):
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"kvsim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True,
        help="Print the version and exit."),
) -> None:
    """kvsim: replay request traces against a paged KV cache engine and report what happens."""


# --- commands -------------------------------------------------------------------------------
# (each command section below is added by the issue that owns it)


# --- kvsim trace-stats, kvsim gen (issue 3) ---
# The trace options below are shared by every command that reads a trace (reuse them).

FORMAT_OPTION = typer.Option(None, "--format", help="Trace format: native, mooncake, azure, "
                             "burstgpt (default: detected from the content).")
LIMIT_OPTION = typer.Option(None, "--limit", min=1, help="Keep at most N requests.")
START_OPTION = typer.Option(None, "--start", help="Keep requests arriving at or after this "
                            "many seconds after the trace's first request.")
END_OPTION = typer.Option(None, "--end", help="Keep requests arriving before this many "
                          "seconds after the trace's first request.")
RATE_SCALE_OPTION = typer.Option(1.0, "--rate-scale", help="Request-rate multiplier: 2 "
                                 "doubles the rate (inter-arrival gaps halved).")
SORT_OPTION = typer.Option(False, "--sort", help="Sort by arrival instead of rejecting "
                           "timestamps that go backwards.")
SEED_OPTION = typer.Option(0, "--seed", help="Seed of every random draw.")
MODEL_OPTION = typer.Option(None, "--model", help="BurstGPT only: keep this model's rows.")


def trace_options(fmt, limit, start, end, rate_scale, sort, seed, model):
    """The :class:`TraceOptions` of the shared trace options above."""
    from .workloads import TraceOptions
    return TraceOptions(fmt=fmt, limit=limit, start_s=start, end_s=end, rate_scale=rate_scale,
                        sort=sort, seed=seed, model_filter=model)


@app.command("trace-stats")
def trace_stats_command(
    trace: str = typer.Argument(..., metavar="FILE", help="Trace file (any supported format)."),
    block_size: int = typer.Option(16, "--block-size", min=1, help="Block size (tokens) of "
                                   "the ideal prefix hit ratio."),
    fmt: Optional[str] = FORMAT_OPTION, limit: Optional[int] = LIMIT_OPTION,
    start: Optional[float] = START_OPTION, end: Optional[float] = END_OPTION,
    rate_scale: float = RATE_SCALE_OPTION, sort: bool = SORT_OPTION, seed: int = SEED_OPTION,
    model: Optional[str] = MODEL_OPTION, as_json: bool = JSON_OPTION,
) -> None:
    """Requests, time span, rate, length percentiles, burstiness, ideal prefix hit ratio."""
    from .workloads.stats import render_stats, trace_file_stats
    opts = trace_options(fmt, limit, start, end, rate_scale, sort, seed, model)
    emit(trace_file_stats(trace, opts, block_size), as_json,
         lambda s: typer.echo(render_stats(s)))


@app.command("gen")
def gen_command(
    preset: str = typer.Argument(..., metavar="PRESET", help="chat, customer-service, rag, "
                                 "agent, sharegpt-like or long-doc."),
    out: str = typer.Option(..., "--out", metavar="FILE", help="Native JSONL file to write."),
    num_requests: int = typer.Option(1000, "--num-requests", "-n", min=1),
    seed: int = SEED_OPTION,
    arrival: str = typer.Option("poisson", "--arrival", help="poisson, gamma or trace."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Arrivals per second "
                                         "(conversations, tasks or requests; preset default)."),
    cv: float = typer.Option(1.0, "--cv", help="Gamma arrivals: CV of the gaps (burstiness)."),
    arrival_trace: Optional[str] = typer.Option(None, "--arrival-trace", metavar="FILE",
                                                help="Trace whose timestamps to reuse."),
    high_priority: float = typer.Option(0.0, "--high-priority-fraction", help="Share of "
                                        "sessions at priority 0; the others get 1."),
    input_len: Optional[str] = typer.Option(None, "--input-len", metavar="SPEC", help="New "
                                            "input lengths: fixed:N, uniform:LO:HI, "
                                            "lognormal:MEAN:SIGMA or trace:FILE."),
    output_len: Optional[str] = typer.Option(None, "--output-len", metavar="SPEC",
                                             help="Output lengths (same forms)."),
    hash_block_size: int = typer.Option(16, "--hash-block-size", min=1),
    with_token_ids: bool = typer.Option(False, "--token-ids", help="Write prompt_token_ids "
                                        "(for vllm-oracle; small workloads)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Generate a synthetic workload as native JSONL (same seed, same file)."""
    from .workloads.generators import GenConfig, parse_lengths, write_workload
    config = GenConfig(
        num_requests=num_requests, seed=seed, arrival=arrival, rate=rate, cv=cv,
        arrival_trace=arrival_trace, high_priority_fraction=high_priority,
        input_tokens=input_len and parse_lengths(input_len, "prompt"),
        output_tokens=output_len and parse_lengths(output_len, "output"),
        hash_block_size=hash_block_size, token_ids=with_token_ids)
    emit(write_workload(preset, out, config), as_json,
         lambda r: typer.echo(f"wrote {r['num_requests']} {r['preset']} requests to {r['path']}"))


# --- kvsim report (issue 6) ---

@app.command("report")
def report_command(
    run_dir: str = typer.Argument(..., metavar="DIR",
                                  help="A run's --out directory (summary.json, CSVs)."),
    out: Optional[str] = typer.Option(None, "--out", metavar="FILE", help="Where to write "
                                      "the HTML (default: DIR/report.html)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Re-render report.html from a run's summary.json, requests.csv and timeline.csv."""
    from .reports.rerender import rerender_report
    emit(rerender_report(run_dir, out), as_json,
         lambda r: typer.echo(f"wrote {r['report']}"))


# --- kvsim run (issue 4) ---


def _opt(help_text: str, *names: str):
    return typer.Option(None, *names, help=help_text)


SLO_TTFT_P99_OPTION = typer.Option(None, "--slo-ttft-p99",
                                   help="TTFT p99 target (s), drawn in the report.")
SLO_TPOT_P99_OPTION = typer.Option(None, "--slo-tpot-p99",
                                   help="TPOT p99 target (s), drawn in the report.")
TRACE_MODEL_OPTION = typer.Option(None, "--trace-model",
                                  help="BurstGPT only: keep this model's rows.")
NUM_CPU_BLOCKS_OPTION = typer.Option(
    None, "--num-cpu-blocks", min=0,
    help="Host (CPU) tier: KV blocks per replica that evicted cached blocks are demoted to.")
OFFLOAD_WRITE_OPTION = typer.Option(
    None, "--offload-write", help="Host tier: back (copy a cached block when the GPU evicts "
    "it, default) or through (copy every block once it is full).")
PREEMPTION_MODE_OPTION = typer.Option(
    None, "--preemption-mode", help="recompute (vLLM, default) or swap (copy a preempted "
    "request's blocks to the host tier and back).")


def slo_targets(ttft_p99: float | None, tpot_p99: float | None) -> dict:
    """The ``--slo-*`` targets given, keyed as the summary names them."""
    return {k: v for k, v in (("ttft_p99_s", ttft_p99), ("tpot_p99_s", tpot_p99)) if v}


@app.command("run")
def run_command(
    trace: Optional[str] = typer.Argument(
        None, metavar="[TRACE]", help="Trace file (default: the bundled Mooncake sample; "
        "'sample:azure-conv' names the other one)."),
    config_file: Optional[str] = _opt("TOML file holding any of these settings.", "--config"),
    model: Optional[str] = _opt("Catalog name, Hugging Face id, or path to a config.json.",
                                "--model"),
    gpu: Optional[str] = _opt("GPU: a100-40gb, a100-80gb, h100-80gb, h200, l4, l40s.", "--gpu"),
    tp: Optional[int] = _opt("Tensor-parallel GPUs per replica.", "--tp"),
    replicas: Optional[int] = _opt("Replicas behind the router.", "--replicas"),
    router: Optional[str] = _opt("round-robin, least-outstanding-tokens, prefix-affinity.",
                                 "--router"),
    block_size: Optional[int] = _opt("Tokens per KV block.", "--block-size"),
    num_gpu_blocks: Optional[int] = _opt("KV blocks per replica (overrides sizing).",
                                         "--num-gpu-blocks"),
    dtype: Optional[str] = _opt("KV cache (and weights) dtype: bf16 (default), fp16, fp8, "
                                "int8.", "--dtype"),
    weight_dtype: Optional[str] = _opt("Weights stored as: bf16, fp16, fp8, int8 or int4 "
                                       "(4-bit with group-128 scales); default --dtype.",
                                       "--weight-dtype"),
    gpu_memory_utilization: Optional[float] = _opt("Share of GPU memory vLLM may use.",
                                                   "--gpu-memory-utilization"),
    max_num_seqs: Optional[int] = _opt("Most requests in a batch.", "--max-num-seqs"),
    max_num_batched_tokens: Optional[int] = _opt("Token budget per step.",
                                                 "--max-num-batched-tokens"),
    max_model_len: Optional[int] = _opt("Longest sequence (default: the model's, capped by the "
                                        "pool).", "--max-model-len"),
    long_prefill_token_threshold: Optional[int] = _opt(
        "Longest prefill chunk when several requests compete (0: none).",
        "--long-prefill-token-threshold"),
    enable_prefix_caching: Optional[bool] = typer.Option(
        None, "--enable-prefix-caching/--no-enable-prefix-caching", help="Prefix caching."),
    scheduling_policy: Optional[str] = _opt("fcfs or priority.", "--scheduling-policy"),
    profile: Optional[str] = _opt("Calibration profile JSON for the cost model.", "--profile"),
    seed: Optional[int] = _opt("Seed of every random choice.", "--seed"),
    skip_ahead: Optional[bool] = typer.Option(
        None, "--skip-ahead/--no-skip-ahead", help="Skip ahead over decode-only steps "
        "(identical results, faster)."),
    eviction: Optional[str] = _opt("Eviction policy of cached blocks: lru (vLLM), lfu, "
                                   "priority, hybrid, arc, s3fifo, lookahead, belady (offline "
                                   "optimal).", "--eviction"),
    layout: Optional[str] = _opt("KV layout: paged (vLLM), contiguous (one reserved region "
                                 "per request, first-fit) or hybrid (contiguous below "
                                 "--hybrid-threshold, paged above).", "--layout"),
    hybrid_threshold: Optional[int] = _opt("Hybrid: final length (tokens) under which a "
                                           "request gets a contiguous region (default 256).",
                                           "--hybrid-threshold"),
    reserve: Optional[str] = _opt("Contiguous/hybrid reservation: max (max_model_len), pow2 (next "
                                  "power of two of the final length), oracle (exact).",
                                  "--reserve"),
    compaction_threshold: Optional[float] = _opt(
        "Contiguous: compact when free slots unusable by the next request exceed this share "
        "of the pool (default: never).", "--compaction-threshold"),
    num_cpu_blocks: Optional[int] = NUM_CPU_BLOCKS_OPTION,
    cpu_offload_gb: Optional[float] = _opt("Host tier given as GiB of host memory per GPU.",
                                           "--cpu-offload-gb"),
    offload_write: Optional[str] = OFFLOAD_WRITE_OPTION,
    preemption_mode: Optional[str] = PREEMPTION_MODE_OPTION,
    out: str = typer.Option("kvsim-out", "--out", metavar="DIR", help="Output directory."),
    slo_ttft_p99: Optional[float] = SLO_TTFT_P99_OPTION,
    slo_tpot_p99: Optional[float] = SLO_TPOT_P99_OPTION,
    fmt: Optional[str] = FORMAT_OPTION, limit: Optional[int] = LIMIT_OPTION,
    start: Optional[float] = START_OPTION, end: Optional[float] = END_OPTION,
    rate_scale: float = RATE_SCALE_OPTION, sort: bool = SORT_OPTION,
    trace_model: Optional[str] = TRACE_MODEL_OPTION,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar, no summary."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Replay a trace through a simulated vLLM deployment.

    Writes summary.json, requests.csv, timeline.csv and report.html into --out."""
    from . import pipeline
    from .sim.config import RunConfig
    given = {k: v for k, v in locals().items() if k in RunConfig.__dataclass_fields__
             and v is not None}
    settings = pipeline.read_config_file(config_file) if config_file else {}
    path, label = pipeline.resolve_trace(trace or settings.pop("trace", None))
    settings.pop("trace", None)
    config = RunConfig.from_dict({**settings, **given, "trace": label},
                                 source=config_file or "options")
    slo = slo_targets(slo_ttft_p99, slo_tpot_p99)
    job = pipeline.RunJob(config, path, trace_options(
        fmt, limit, start, end, rate_scale, sort, config.seed, trace_model), Path(out),
        slo or None)
    summary = pipeline.run_job(job, quiet=quiet or as_json)
    emit(summary, as_json, None if quiet else lambda s: _show_run(s, out))


# --- kvsim plan (issue 8) ---


@app.command("plan")
def plan_command(
    trace: str = typer.Argument(..., metavar="TRACE", help="Trace file, or sample:NAME."),
    model: str = typer.Option("llama-3.1-8b", "--model", help="Catalog name, HF id or "
                              "config.json."),
    gpu: str = typer.Option("a100-80gb", "--gpu", help="Candidate GPUs, comma-separated."),
    tp: str = typer.Option("1", "--tp", help="Candidate tensor-parallel sizes, e.g. 1,2,4."),
    block_size: str = typer.Option("16", "--block-size", help="Candidate block sizes."),
    max_num_seqs: str = typer.Option("256", "--max-num-seqs", help="Candidate sequence caps."),
    enable_prefix_caching: bool = typer.Option(
        True, "--enable-prefix-caching/--no-enable-prefix-caching", help="Prefix caching."),
    eviction: Optional[str] = _opt("Candidate eviction policies, comma-separated.",
                                   "--eviction"),
    dtype: Optional[str] = _opt("Candidate KV (and weight) dtypes, e.g. bf16,fp8.", "--dtype"),
    weight_dtype: Optional[str] = _opt("Candidate weight dtypes, e.g. bf16,int4.",
                                       "--weight-dtype"),
    cpu_offload_gb: Optional[str] = _opt("Candidate host KV tiers in GiB per GPU, e.g. 0,64 "
                                         "(priced per GiB-hour: --price-table key "
                                         "'host-memory-gib').", "--cpu-offload-gb"),
    slo_ttft_p99: Optional[float] = _opt("TTFT p99 target (s).", "--slo-ttft-p99"),
    slo_tpot_p99: Optional[float] = _opt("TPOT p99 target (s).", "--slo-tpot-p99"),
    slo_ttft_p50: Optional[float] = _opt("TTFT p50 target (s).", "--slo-ttft-p50"),
    slo_e2e_p99: Optional[float] = _opt("E2E p99 target (s).", "--slo-e2e-p99"),
    target_rate: Optional[float] = _opt("Plan for this many requests/s (instead of "
                                        "--rate-scale).", "--target-rate"),
    max_replicas: int = typer.Option(32, "--max-replicas", help="Most replicas to try."),
    rate_iterations: int = typer.Option(8, "--rate-iterations", help="Bisection steps of "
                                        "the sustainable-rate search."),
    router: str = typer.Option("least-outstanding-tokens", "--router", help="Router between "
                               "replicas: least-outstanding-tokens, round-robin, "
                               "prefix-affinity."),
    max_num_batched_tokens: int = typer.Option(8192, "--max-num-batched-tokens"),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization"),
    profile: Optional[str] = _opt("Calibration profile JSON for the cost model.", "--profile"),
    price_table: Optional[str] = _opt("JSON {gpu: USD per GPU-hour} overriding the catalog "
                                      "(and 'host-memory-gib': USD per GiB-hour).",
                                      "--price-table"),
    out: str = typer.Option("kvsim-plan", "--out", metavar="DIR", help="Output directory."),
    use_ray: bool = typer.Option(False, "--ray", help="Run candidates as Ray tasks."),
    ray_address: Optional[str] = _opt("Ray cluster to join ('auto' as Ray means it); implies "
                                      "--ray.", "--ray-address"),
    workers: Optional[int] = _opt("Local processes or Ray CPUs (default min(4, CPUs)).",
                                  "--workers"),
    fmt: Optional[str] = FORMAT_OPTION, limit: Optional[int] = LIMIT_OPTION,
    start: Optional[float] = START_OPTION, end: Optional[float] = END_OPTION,
    rate_scale: Optional[float] = typer.Option(None, "--rate-scale", help="Load: request-rate "
                                               "multiplier of the trace (default 1)."),
    sort: bool = SORT_OPTION, seed: int = SEED_OPTION,
    trace_model: Optional[str] = TRACE_MODEL_OPTION,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar, no table."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Find the cheapest deployment whose simulated latencies meet the SLO targets.

    Searches GPU x TP (x other listed settings) and the fewest replicas for each; writes
    plan.json, plan.csv and report.html into --out."""
    from . import pipeline
    from .reports import plan as plan_report
    from .sim import plan_spec, planner, sweep
    path, label = pipeline.resolve_trace(trace)
    spec = plan_spec.spec_from_options(
        path, label, trace_options(fmt, limit, start, end, rate_scale or 1.0, sort, seed,
                                   trace_model), locals())
    options = sweep.SweepOptions(workers or sweep.default_workers(),
                                 use_ray or ray_address is not None, ray_address)
    with plan_report.PlanProgress(not (quiet or as_json)) as bar:
        result = planner.plan(spec, options, bar.update)
    plan_report.write_plan_outputs(out, result)
    emit(result, as_json, None if quiet else lambda r: (
        plan_report.print_plan(r), typer.echo(f"wrote {out}/plan.json, plan.csv, report.html")))


# --- kvsim hitrate (issue 5) ---


@app.command("hitrate")
def hitrate_command(
    trace: str = typer.Argument(..., metavar="TRACE", help="Trace file, or sample:NAME."),
    capacity: Optional[str] = _opt("Cache capacities in blocks, comma-separated "
                                   "(e.g. 1000,5000,20000).", "--capacity"),
    capacity_tokens: Optional[str] = _opt("Cache capacities in tokens instead.",
                                          "--capacity-tokens"),
    block_size: int = typer.Option(16, "--block-size", min=1, help="Tokens per block."),
    eviction: str = typer.Option("lru,lfu,priority,hybrid,arc,s3fifo,lookahead,belady",
                                 "--eviction",
                                 help="Policies to compare, comma-separated."),
    out: Optional[str] = _opt("Directory for hitrate.json and hitrate.html.", "--out"),
    lookahead_s: float = typer.Option(30.0, "--lookahead-s", min=0,
                                      help="lookahead policy: requests arriving within this "
                                      "many seconds count as queued (a queueing delay)."),
    fmt: Optional[str] = FORMAT_OPTION, limit: Optional[int] = LIMIT_OPTION,
    start: Optional[float] = START_OPTION, end: Optional[float] = END_OPTION,
    sort: bool = SORT_OPTION, as_json: bool = JSON_OPTION,
) -> None:
    """Cache-only replay: prefix hit rate per eviction policy and capacity.

    No timing; LRU's whole curve comes from one stack-distance pass."""
    from . import pipeline
    from .cache import hitrate
    from .workloads import load_trace
    caps = hitrate.parse_capacities(capacity, capacity_tokens, block_size)
    policies = hitrate.parse_policies(eviction)
    path, label = pipeline.resolve_trace(trace)
    opts = trace_options(fmt, limit, start, end, 1.0, sort, 0, None)
    result = {**hitrate.hitrate_curves(load_trace(path, opts), caps, policies, block_size,
                                       lookahead_s), "trace": label}
    if out:
        import pandas as pd
        from .reports.html import render_hitrate_report
        from .reports.io import write_json_atomic
        render_hitrate_report(pd.DataFrame(result["rows"]), Path(out) / "hitrate.html",
                              config={k: v for k, v in result.items() if k != "rows"})
        write_json_atomic(Path(out) / "hitrate.json", result)
    emit(result, as_json, lambda r: typer.echo(hitrate.render_hitrate_table(r)))


def _progress(message: str) -> None:
    """Progress of the long real-backend commands, on stderr (stdout stays the result)."""
    typer.echo(f"kvsim: {message}", err=True)


def _show_run(summary: dict, out: str) -> None:
    from .reports.terminal import print_summary
    print_summary(summary)
    if summary["num_rejected"]:
        typer.echo(f"warning: {summary['num_rejected']} requests were rejected: their prompt "
                   f"is not shorter than max_model_len {summary['config']['max_model_len']:,}",
                   err=True)
    typer.echo(f"wrote {out}/summary.json, requests.csv, timeline.csv, report.html")


# --- kvsim compare (issue 5) ---
# Grid options (--eviction lru,lfu --block-size 16,32 ...) are parsed by kvsim.compare from the
# remaining arguments, so every RunConfig field can vary without an option here.


@app.command("compare", options_metavar="TRACE --FIELD V1,V2,... [OPTIONS]",
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def compare_command(
    ctx: typer.Context,
    config_file: Optional[str] = _opt("TOML file holding shared settings.", "--config"),
    out: str = typer.Option("kvsim-compare", "--out", metavar="DIR", help="Output directory."),
    workers: Optional[int] = _opt("Worker processes (default min(4, CPUs)).", "--workers"),
    slo_ttft_p99: Optional[float] = SLO_TTFT_P99_OPTION,
    slo_tpot_p99: Optional[float] = SLO_TPOT_P99_OPTION,
    fmt: Optional[str] = FORMAT_OPTION, limit: Optional[int] = LIMIT_OPTION,
    start: Optional[float] = START_OPTION, end: Optional[float] = END_OPTION,
    rate_scale: float = RATE_SCALE_OPTION, sort: bool = SORT_OPTION,
    trace_model: Optional[str] = TRACE_MODEL_OPTION,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No table."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run a grid of `kvsim run` settings over TRACE and compare them in one table.

    Any run setting takes a comma-separated list (e.g. --eviction lru,priority
    --enable-prefix-caching true,false); one value is shared. Writes compare.json,
    report.html and one run directory per configuration into --out."""
    from . import compare
    from .reports.compare_table import render_compare_table
    from .sim.sweep import default_workers
    slo = slo_targets(slo_ttft_p99, slo_tpot_p99)
    spec = compare.spec_from_cli(ctx.args, config_file, trace_options(
        fmt, limit, start, end, rate_scale, sort, 0, trace_model), out, slo or None)
    result = compare.run_compare(spec, workers or default_workers())
    emit(result, as_json, None if quiet else lambda r: typer.echo(render_compare_table(
        [run["label"] for run in r["runs"]], [run["summary"] for run in r["runs"]])
        + f"\nwrote {out}/compare.json, report.html and {len(r['runs'])} run directories"))


# --- kvsim profile, kvsim validate (issue 7) ---
# Job logic lives in kvsim.real_backend.profiling / .validate; torch is imported on use.

DEVICE_OPTION = typer.Option("cpu", "--device", help="cpu or cuda.")
BACKEND_MODEL_OPTION = typer.Option("tiny-llama", "--model", help="tiny-llama (bundled), a "
                                    "Llama-like catalog name, or a path to a config.json.")
BACKEND_BLOCK_OPTION = typer.Option(32, "--block-size", min=1, help="Tokens per KV block.")
DTYPE_OPTION = typer.Option("fp32", "--dtype", help="fp32, bf16 or fp16.")
THREADS_OPTION = typer.Option(1, "--threads", min=1, help="torch CPU threads (keep equal "
                              "between profile and validate).")
CLOCK_OPTION = typer.Option("wall", "--clock", help="wall (perf_counter; CUDA events on a "
                            "GPU) or cpu (process CPU time; CPU only, steadier on a busy host).")


def _backend_settings(model, device, dtype, block_size, threads, seed, clock):
    from .real_backend.models import require_torch
    require_torch()
    from .real_backend.session import BackendSettings
    return BackendSettings(model=model, device=device, dtype=dtype, block_size=block_size,
                           threads=threads, seed=seed, clock=clock)


@app.command("profile")
def profile_command(
    device: str = DEVICE_OPTION, model: str = BACKEND_MODEL_OPTION,
    out: str = typer.Option("profile.json", "--out", metavar="FILE", help="Profile to write."),
    block_size: int = BACKEND_BLOCK_OPTION, dtype: str = DTYPE_OPTION,
    threads: int = THREADS_OPTION, clock: str = CLOCK_OPTION, seed: int = SEED_OPTION,
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
    from .real_backend.profiling import Limits, profile_job, render_fit
    limits = Limits(max_num_seqs, max_num_batched_tokens, max_context)
    emit(profile_job(settings, limits, out, quick, _progress), as_json,
         lambda p: typer.echo(render_fit(p) + f"\nwrote {p['path']}"))


@app.command("validate")
def validate_command(
    trace: str = typer.Argument(..., metavar="TRACE", help="Trace file (any format)."),
    device: str = DEVICE_OPTION, model: str = BACKEND_MODEL_OPTION,
    profile: Optional[str] = typer.Option(None, "--profile", metavar="FILE", help="Fitted "
                                          "profile (kvsim profile); default: a quick one."),
    out: Optional[str] = typer.Option(None, "--out", metavar="DIR", help="Write "
                                      "validation.json and validation.html here."),
    block_size: int = BACKEND_BLOCK_OPTION, dtype: str = DTYPE_OPTION,
    threads: int = THREADS_OPTION, clock: str = CLOCK_OPTION, seed: int = SEED_OPTION,
    repeats: int = typer.Option(1, "--repeats", min=1, help="Forward passes timed per step "
                                "(median; tames noise)."),
    offline: bool = typer.Option(False, "--offline", help="Every request arrives at t=0."),
    noise_floor: bool = typer.Option(False, "--noise-floor", help="Run the real side twice "
                                     "and report how much the two runs differ."),
    html: bool = typer.Option(True, "--html/--no-html", help="Also write validation.html."),
    num_gpu_blocks: int = typer.Option(512, "--num-gpu-blocks", min=1),
    max_num_seqs: int = typer.Option(16, "--max-num-seqs", min=1),
    max_num_batched_tokens: int = typer.Option(512, "--max-num-batched-tokens", min=1),
    max_model_len: Optional[int] = _opt("Longest sequence.", "--max-model-len"),
    enable_prefix_caching: bool = typer.Option(
        True, "--enable-prefix-caching/--no-enable-prefix-caching"),
    scheduling_policy: str = typer.Option("fcfs", "--scheduling-policy"),
    num_cpu_blocks: Optional[int] = NUM_CPU_BLOCKS_OPTION,
    offload_write: Optional[str] = OFFLOAD_WRITE_OPTION,
    preemption_mode: Optional[str] = PREEMPTION_MODE_OPTION,
    fmt: Optional[str] = FORMAT_OPTION, limit: Optional[int] = LIMIT_OPTION,
    start: Optional[float] = START_OPTION, end: Optional[float] = END_OPTION,
    rate_scale: float = RATE_SCALE_OPTION, sort: bool = SORT_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Run a trace through the real backend and the simulator and compare them.

    Same settings on both sides; prints the error table (step time, throughput,
    TTFT/TPOT/E2E) and checks that the cache decisions are identical."""
    settings = _backend_settings(model, device, dtype, block_size, threads, seed, clock)
    from .real_backend.validate import ValidateJob, validate_job
    from .real_backend.validate_report import render_table
    engine = {"num_gpu_blocks": num_gpu_blocks, "max_num_seqs": max_num_seqs,
              "max_num_batched_tokens": max_num_batched_tokens, "max_model_len": max_model_len,
              "enable_prefix_caching": enable_prefix_caching,
              "scheduling_policy": scheduling_policy}
    tier = {"num_cpu_blocks": num_cpu_blocks or None, "offload_write": offload_write,
            "preemption_mode": preemption_mode}
    engine.update((k, v) for k, v in tier.items() if v is not None)
    job = ValidateJob(settings, engine, profile, repeats, offline, trace, noise_floor)
    opts = trace_options(fmt, limit, start, end, rate_scale, sort, seed, None)
    emit(validate_job(trace, opts, job, out, html, _progress), as_json,
         lambda r: typer.echo(render_table(r) + "".join(
             f"\nwrote {p}" for p in r.get("outputs", {}).values())))


def main() -> None:
    """Console entry point: run the app, turning user errors into one line and exit status 2."""
    try:
        app(standalone_mode=False)
    except KvsimError as e:
        sys.stderr.write(f"kvsim: error: {e.one_line()}\n")
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.stderr.write("kvsim: aborted\n")
        sys.exit(130)
    except Exception as e:
        if not _is_usage_error(e):
            raise
        sys.stderr.write(f"kvsim: error: {' '.join(e.format_message().split())}\n")
        sys.exit(e.exit_code)


def _is_usage_error(e: Exception) -> bool:
    """A command-line usage error (bad option value, missing argument, unknown option): click's
    ``ClickException``, which recent typer versions vendor under ``typer.TyperException``."""
    import click
    return isinstance(e, (click.ClickException, typer.TyperException)) and \
        hasattr(e, "format_message") and hasattr(e, "exit_code")


if __name__ == "__main__":
    main()
