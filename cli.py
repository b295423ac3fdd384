"""The ``kvsim`` command line. Wiring only: every command calls into the packages.

Conventions every command follows:
- ``--json`` prints the command's machine-readable result on stdout and nothing else;
- a :class:`kvsim.errors.KvsimError` becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal, Optional

import typer

from . import __version__
from .errors import KvsimError
from .sim.config import (AllocatorName, EvictionPolicy, KvDtype, Layout, LongPrompt,
                         OffloadWrite, PreemptionMode, ReservePolicy, RouterName, Sampling,
                         SchedulingPolicy, WeightDtype)
from .workloads.generators.presets import PresetName
from .workloads.options import TraceFormat

app = typer.Typer(
    name="kvsim",
    help="Simulate and plan the KV cache of LLM serving engines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,          # plain help: wraps at 80 columns, never cuts option names
    context_settings={"show_default": True},
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

FORMAT_OPTION = typer.Option(None, "--format", help="Trace format (kvsim, jsonl: native; "
                             "azure-llm: azure).", show_default="detected from the content")
LIMIT_OPTION = typer.Option(None, "--limit", min=1, help="Keep at most N requests.",
                            show_default="all")
START_OPTION = typer.Option(None, "--start", help="Keep requests arriving at or after this "
                            "many seconds after the trace's first request.")
END_OPTION = typer.Option(None, "--end", help="Keep requests arriving before this many "
                          "seconds after the trace's first request.")
RATE_SCALE_OPTION = typer.Option(1.0, "--rate-scale", help="Request-rate multiplier: 2 "
                                 "doubles the rate (inter-arrival gaps halved).")
SORT_OPTION = typer.Option(False, "--sort", help="Sort by arrival instead of rejecting "
                           "timestamps that go backwards.")
SEED_OPTION = typer.Option(0, "--seed", min=0, help="Seed of every random draw.")
MODEL_OPTION = typer.Option(None, "--model", help="BurstGPT only: keep this model's rows.")


def trace_options(fmt, limit, start, end, rate_scale, sort, seed, model):
    """The :class:`TraceOptions` of the shared trace options above."""
    from .workloads import TraceOptions
    return TraceOptions(fmt=fmt, limit=limit, start_s=start, end_s=end, rate_scale=rate_scale,
                        sort=sort, seed=seed, model_filter=model)


@app.command("trace-stats")
def trace_stats_command(
    trace: str = typer.Argument(..., metavar="TRACE", help="Trace file (any supported "
                                "format), '-' for standard input, or sample:NAME."),
    block_size: int = typer.Option(16, "--block-size", min=1, help="Block size (tokens) of "
                                   "the ideal prefix hit ratio."),
    fmt: Optional[TraceFormat] = FORMAT_OPTION, limit: Optional[int] = LIMIT_OPTION,
    start: Optional[float] = START_OPTION, end: Optional[float] = END_OPTION,
    rate_scale: float = RATE_SCALE_OPTION, sort: bool = SORT_OPTION, seed: int = SEED_OPTION,
    model: Optional[str] = MODEL_OPTION, as_json: bool = JSON_OPTION,
) -> None:
    """Requests, time span, rate, length percentiles, burstiness, ideal prefix hit ratio."""
    from .pipeline import resolve_trace
    from .workloads.stats import render_stats, trace_file_stats
    opts = trace_options(fmt, limit, start, end, rate_scale, sort, seed, model)
    path, label = resolve_trace(trace)
    emit({**trace_file_stats(path, opts, block_size), "trace": label}, as_json,
         lambda s: typer.echo(render_stats(s)))


@app.command("gen")
def gen_command(
    preset: PresetName = typer.Argument(..., metavar="PRESET", help="Workload preset."),
    out: str = typer.Option(..., "--out", metavar="FILE", help="Native JSONL file to write."),
    num_requests: int = typer.Option(1000, "--num-requests", "-n", min=1),
    seed: int = SEED_OPTION,
    arrival: Literal["poisson", "gamma", "trace"] = typer.Option(
        "poisson", "--arrival", help="Arrival process."),
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


def _opt(help_text: str, *names: str, **kwargs):
    return typer.Option(None, *names, help=help_text, **kwargs)


def setting(name: str, help_text: str, *names: str):
    """An option of run setting ``name`` whose shown default is the schema's
    (:class:`~kvsim.sim.config.RunConfig`); left unset (``None``) so a TOML file can set it."""
    from .sim.config import default_of
    default = default_of(name)
    shown = ("on" if default else "off") if isinstance(default, bool) else str(default)
    return typer.Option(None, *(names or ("--" + name.replace("_", "-"),)), help=help_text,
                        show_default="none" if default is None else shown)


SLO_TTFT_P99_OPTION = _opt("TTFT p99 target (s), drawn in the report.", "--slo-ttft-p99",
                           min=0.0)
SLO_TPOT_P99_OPTION = _opt("TPOT p99 target (s), drawn in the report.", "--slo-tpot-p99",
                           min=0.0)
TRACE_MODEL_OPTION = typer.Option(None, "--trace-model",
                                  help="BurstGPT only: keep this model's rows.")
NUM_CPU_BLOCKS_OPTION = setting(
    "num_cpu_blocks", "Host (CPU) tier: KV blocks per replica that evicted cached blocks are "
    "demoted to.")
OFFLOAD_WRITE_OPTION = setting(
    "offload_write", "Host tier: back (copy a cached block when the GPU evicts it) or through "
    "(copy every block once it is full).")
PREEMPTION_MODE_OPTION = setting(
    "preemption_mode", "recompute (vLLM) or swap (copy a preempted request's blocks to the "
    "host tier and back; vLLM v1 has no swap).")
MAX_MODEL_LEN_OPTION = setting(
    "max_model_len", "Longest sequence (none: the model's, capped by the pool).")
LONG_PROMPT_OPTION = setting(
    "long_prompt", "Prompts of max_model_len tokens or more: reject them (vLLM) or truncate "
    "prompt and output in proportion until they fit (Vidur).")
QUIET_OPTION = typer.Option(False, "--quiet", "-q", help="No progress, no summary.")
OutputFormat = Literal["csv", "parquet"]
OUTPUT_FORMAT_OPTION = typer.Option(
    "csv", "--output-format", help="How requests and timeline are stored: requests.csv and "
    "timeline.csv, or requests.parquet and timeline.parquet (same columns; needs pyarrow: "
    "pip install 'kvsim[parquet]').")
BENCH_JSON_OPTION = typer.Option(
    False, "--bench-json", help="Also write bench.json: the result in the fields and units of "
    "`vllm bench serve --save-result --save-detailed` (see docs/api.md).")


def slo_targets(ttft_p99: float | None, tpot_p99: float | None) -> dict:
    """The ``--slo-*`` targets given, keyed as the summary names them."""
    return {k: v for k, v in (("ttft_p99_s", ttft_p99), ("tpot_p99_s", tpot_p99))
            if v is not None}


@app.command("run")
def run_command(
    trace: Optional[str] = typer.Argument(
        None, metavar="[TRACE]", help="Trace file, '-' for standard input, or sample:NAME "
        "(default: sample:mooncake; also sample:azure-conv)."),
    config_file: Optional[str] = _opt("TOML file holding any of these settings.", "--config"),
    model: Optional[str] = setting("model", "Catalog name, Hugging Face id, or path to a "
                                   "config.json."),
    gpu: Optional[str] = setting("gpu", "GPU: a100-40gb, a100-80gb, h100-80gb, h200, l4, "
                                 "l40s."),
    tp: Optional[int] = setting("tp", "Tensor-parallel GPUs per replica."),
    replicas: Optional[int] = setting("replicas", "Replicas behind the router."),
    router: Optional[RouterName] = setting("router", "How requests are spread over "
                                           "replicas."),
    block_size: Optional[int] = setting("block_size", "Tokens per KV block."),
    num_gpu_blocks: Optional[int] = setting("num_gpu_blocks", "KV blocks per replica "
                                            "(overrides sizing)."),
    dtype: Optional[KvDtype] = setting("dtype", "KV cache (and weights) dtype."),
    weight_dtype: Optional[WeightDtype] = setting(
        "weight_dtype", "Weights stored as (int4: 4-bit with group-128 scales); none: --dtype."),
    gpu_memory_utilization: Optional[float] = setting(
        "gpu_memory_utilization", "Share of GPU memory vLLM may use."),
    max_num_seqs: Optional[int] = setting("max_num_seqs", "Most requests in a batch."),
    max_num_batched_tokens: Optional[int] = setting("max_num_batched_tokens",
                                                    "Token budget per step."),
    max_model_len: Optional[int] = MAX_MODEL_LEN_OPTION,
    long_prompt: Optional[LongPrompt] = LONG_PROMPT_OPTION,
    long_prefill_token_threshold: Optional[int] = setting(
        "long_prefill_token_threshold", "Longest prefill chunk when several requests compete "
        "(0: none)."),
    enable_prefix_caching: Optional[bool] = setting(
        "enable_prefix_caching", "Prefix caching.", "--enable-prefix-caching/"
        "--no-enable-prefix-caching"),
    scheduling_policy: Optional[SchedulingPolicy] = setting("scheduling_policy",
                                                            "Queue order."),
    enable_chunked_prefill: Optional[bool] = setting(
        "enable_chunked_prefill", "Chunked prefill (off needs --max-num-batched-tokens >= "
        "max_model_len).", "--enable-chunked-prefill/--no-enable-chunked-prefill"),
    scheduler_reserve_full_isl: Optional[bool] = setting(
        "scheduler_reserve_full_isl", "Admit a request only when its whole sequence fits "
        "(vLLM's default).", "--scheduler-reserve-full-isl/--no-scheduler-reserve-full-isl"),
    sampling: Optional[Sampling] = setting(
        "sampling", "Generated tokens without recorded ids: random (unique per request) or "
        "greedy (identical prompts generate identical blocks)."),
    profile: Optional[str] = setting("profile", "Calibration profile JSON for the cost model."),
    seed: Optional[int] = setting("seed", "Seed of every random choice."),
    skip_ahead: Optional[bool] = setting(
        "skip_ahead", "Skip ahead over decode-only steps (identical results, faster).",
        "--skip-ahead/--no-skip-ahead"),
    eviction: Optional[EvictionPolicy] = setting(
        "eviction", "Eviction of cached blocks: lru is vLLM's; belady is the offline optimum."),
    layout: Optional[Layout] = setting(
        "layout", "KV layout: paged (vLLM), contiguous (one reserved region per request, "
        "first-fit) or hybrid (contiguous below --hybrid-threshold, paged above)."),
    hybrid_threshold: Optional[int] = setting(
        "hybrid_threshold", "Hybrid: final length (tokens) under which a request gets a "
        "contiguous region."),
    reserve: Optional[ReservePolicy] = setting(
        "reserve", "Contiguous/hybrid reservation: max (max_model_len), pow2 (next power of "
        "two of the final length), oracle (exact), pow2-output (prompt + next power of two "
        "of the output: the vLLM paper's Orca (Pow2))."),
    allocator: Optional[AllocatorName] = setting(
        "allocator", "Contiguous: where regions go: first-fit (lowest gap that holds the "
        "region) or buddy (power-of-two blocks, as the vLLM paper's Orca baselines)."),
    compaction_threshold: Optional[float] = setting(
        "compaction_threshold", "Contiguous: compact when free slots unusable by the next "
        "request exceed this share of the pool (none: never)."),
    num_cpu_blocks: Optional[int] = NUM_CPU_BLOCKS_OPTION,
    cpu_offload_gb: Optional[float] = setting(
        "cpu_offload_gb", "Host tier given as GiB of host memory per GPU."),
    offload_write: Optional[OffloadWrite] = OFFLOAD_WRITE_OPTION,
    preemption_mode: Optional[PreemptionMode] = PREEMPTION_MODE_OPTION,
    out: str = typer.Option("kvsim-out", "--out", metavar="DIR", help="Output directory."),
    html: bool = typer.Option(True, "--html/--no-html", help="Also write report.html."),
    output_format: OutputFormat = OUTPUT_FORMAT_OPTION,
    bench_json: bool = BENCH_JSON_OPTION,
    slo_ttft_p99: Optional[float] = SLO_TTFT_P99_OPTION,
    slo_tpot_p99: Optional[float] = SLO_TPOT_P99_OPTION,
    fmt: Optional[TraceFormat] = FORMAT_OPTION, limit: Optional[int] = LIMIT_OPTION,
    start: Optional[float] = START_OPTION, end: Optional[float] = END_OPTION,
    rate_scale: float = RATE_SCALE_OPTION, sort: bool = SORT_OPTION,
    trace_model: Optional[str] = TRACE_MODEL_OPTION,
    quiet: bool = QUIET_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Replay a trace through a simulated vLLM deployment.

    Writes summary.json, requests.csv, timeline.csv and report.html into --out."""
    from . import pipeline
    given = dict(
        model=model, gpu=gpu, tp=tp, replicas=replicas, router=router, block_size=block_size,
        num_gpu_blocks=num_gpu_blocks, dtype=dtype, weight_dtype=weight_dtype,
        gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
        long_prompt=long_prompt, long_prefill_token_threshold=long_prefill_token_threshold,
        enable_prefix_caching=enable_prefix_caching, scheduling_policy=scheduling_policy,
        enable_chunked_prefill=enable_chunked_prefill,
        scheduler_reserve_full_isl=scheduler_reserve_full_isl, sampling=sampling,
        profile=profile, seed=seed, skip_ahead=skip_ahead, eviction=eviction, layout=layout,
        hybrid_threshold=hybrid_threshold, reserve=reserve, allocator=allocator,
        compaction_threshold=compaction_threshold, num_cpu_blocks=num_cpu_blocks,
        cpu_offload_gb=cpu_offload_gb, offload_write=offload_write,
        preemption_mode=preemption_mode)
    config, path = pipeline.config_from_sources(trace, config_file, given)
    job = pipeline.RunJob(config, path, trace_options(
        fmt, limit, start, end, rate_scale, sort, config.seed, trace_model), Path(out),
        slo_targets(slo_ttft_p99, slo_tpot_p99) or None, html=html,
        output_format=output_format, bench=bench_json)
    summary = pipeline.run_job(job, quiet=quiet or as_json, notes=not quiet)
    emit(summary, as_json, None if quiet else lambda s: _show_run(s, out, job))


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
    router: RouterName = typer.Option("least-outstanding-tokens", "--router",
                                      help="Router between replicas."),
    max_num_batched_tokens: int = typer.Option(8192, "--max-num-batched-tokens", min=1),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization"),
    max_model_len: Optional[int] = MAX_MODEL_LEN_OPTION,
    long_prompt: Optional[LongPrompt] = LONG_PROMPT_OPTION,
    profile: Optional[str] = _opt("Calibration profile JSON for the cost model.", "--profile"),
    price_table: Optional[str] = _opt("JSON {gpu: USD per GPU-hour} overriding the catalog "
                                      "(and 'host-memory-gib': USD per GiB-hour).",
                                      "--price-table"),
    out: str = typer.Option("kvsim-plan", "--out", metavar="DIR", help="Output directory."),
    use_ray: bool = typer.Option(False, "--ray", help="Run candidates as Ray tasks."),
    ray_address: Optional[str] = _opt("Ray cluster to join ('auto' as Ray means it); implies "
                                      "--ray.", "--ray-address"),
    workers: Optional[int] = _opt("Local processes or Ray CPUs.", "--workers", min=1,
                                  show_default="min(4, CPUs)"),
    fmt: Optional[TraceFormat] = FORMAT_OPTION, limit: Optional[int] = LIMIT_OPTION,
    start: Optional[float] = START_OPTION, end: Optional[float] = END_OPTION,
    rate_scale: Optional[float] = typer.Option(None, "--rate-scale", help="Load: request-rate "
                                               "multiplier of the trace (default 1)."),
    sort: bool = SORT_OPTION, seed: int = SEED_OPTION,
    trace_model: Optional[str] = TRACE_MODEL_OPTION,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar, no table."),
    html: bool = typer.Option(True, "--html/--no-html", help="Also write report.html."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Find the cheapest deployment whose simulated latencies meet the SLO targets.

    Searches GPU x TP (x other listed settings) and the fewest replicas for each; writes
    plan.json, plan.csv and report.html into --out."""
    from . import pipeline
    from .reports import plan as plan_report
    from .sim import plan_spec, planner, sweep
    from .reports.outdir import OutputDir
    path, label = pipeline.resolve_trace(trace)
    values = dict(
        model=model, gpu=gpu, tp=tp, block_size=block_size, max_num_seqs=max_num_seqs,
        enable_prefix_caching=enable_prefix_caching, eviction=eviction, dtype=dtype,
        weight_dtype=weight_dtype, cpu_offload_gb=cpu_offload_gb, slo_ttft_p99=slo_ttft_p99,
        slo_tpot_p99=slo_tpot_p99, slo_ttft_p50=slo_ttft_p50, slo_e2e_p99=slo_e2e_p99,
        target_rate=target_rate, max_replicas=max_replicas, rate_iterations=rate_iterations,
        router=router, max_num_batched_tokens=max_num_batched_tokens,
        gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
        long_prompt=long_prompt, profile=profile, price_table=price_table,
        rate_scale=rate_scale, seed=seed)
    spec = plan_spec.spec_from_options(
        path, label, trace_options(fmt, limit, start, end, rate_scale or 1.0, sort, seed,
                                   trace_model), values)
    options = sweep.SweepOptions(workers or sweep.default_workers(),
                                 use_ray or ray_address is not None, ray_address)
    with OutputDir(out, plan_report.PLAN_FILES):
        with plan_report.PlanProgress(not (quiet or as_json)) as bar:
            result = planner.plan(spec, options, bar.update)
        plan_report.write_plan_outputs(out, result, html=html)
    emit(result, as_json, None if quiet else lambda r: (
        plan_report.print_plan(r),
        typer.echo(f"wrote {Path(out) / 'plan.json'}, plan.csv" + ", report.html" * html)))


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
                                 "--eviction", help="Policies to compare, comma-separated."),
    out: Optional[str] = _opt("Directory for hitrate.json and hitrate.html.", "--out"),
    lookahead_s: float = typer.Option(30.0, "--lookahead-s", min=0,
                                      help="lookahead policy: requests arriving within this "
                                      "many seconds count as queued (a queueing delay)."),
    fmt: Optional[TraceFormat] = FORMAT_OPTION, limit: Optional[int] = LIMIT_OPTION,
    start: Optional[float] = START_OPTION, end: Optional[float] = END_OPTION,
    sort: bool = SORT_OPTION,
    html: bool = typer.Option(True, "--html/--no-html", help="With --out: also write "
                              "hitrate.html."),
    as_json: bool = JSON_OPTION,
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
        if html:
            render_hitrate_report(pd.DataFrame(result["rows"]), Path(out) / "hitrate.html",
                                  config={k: v for k, v in result.items() if k != "rows"})
        write_json_atomic(Path(out) / "hitrate.json", result)
    emit(result, as_json, lambda r: typer.echo(hitrate.render_hitrate_table(r)))


def _progress(message: str) -> None:
    """Progress of the long real-backend commands, on stderr (stdout stays the result)."""
    typer.echo(f"kvsim: {message}", err=True)


def _show_run(summary: dict, out: str, job=None) -> None:
    from .reports.terminal import print_summary
    print_summary(summary)
    ext = job.output_format if job is not None else "csv"
    names = [f"requests.{ext}", f"timeline.{ext}"]
    names += ["bench.json"] * bool(job is not None and job.bench)
    names += ["report.html"] * bool(job is None or job.html)
    typer.echo(f"wrote {Path(out) / 'summary.json'}, {', '.join(names)}")


# --- kvsim compare (issue 5) ---
# Grid options (--eviction lru,lfu --block-size 16,32 ...) are parsed by kvsim.grid from the
# remaining arguments, so every RunConfig field can vary without an option here.


@app.command("compare", options_metavar="TRACE --FIELD V1,V2,... [OPTIONS]",
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def compare_command(
    ctx: typer.Context,
    config_file: Optional[str] = _opt("TOML file holding shared settings.", "--config"),
    out: str = typer.Option("kvsim-compare", "--out", metavar="DIR", help="Output directory."),
    workers: Optional[int] = _opt("Worker processes.", "--workers", min=1,
                                  show_default="min(4, CPUs)"),
    slo_ttft_p99: Optional[float] = SLO_TTFT_P99_OPTION,
    slo_tpot_p99: Optional[float] = SLO_TPOT_P99_OPTION,
    fmt: Optional[TraceFormat] = FORMAT_OPTION, limit: Optional[int] = LIMIT_OPTION,
    start: Optional[float] = START_OPTION, end: Optional[float] = END_OPTION,
    rate_scale: float = RATE_SCALE_OPTION, sort: bool = SORT_OPTION,
    trace_model: Optional[str] = TRACE_MODEL_OPTION,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No table."),
    html: bool = typer.Option(True, "--html/--no-html", help="Also write the HTML reports "
                              "(the comparison's and each run's; plotly.min.js once)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run a grid of `kvsim run` settings over TRACE and compare them in one table.

    Any run setting takes a comma-separated list (e.g. --eviction lru,priority
    --enable-prefix-caching true,false); one value is shared. Writes compare.json,
    report.html and one run directory per configuration into --out."""
    from . import grid as compare
    from .reports.compare_table import render_compare_table
    from .sim.sweep import default_workers
    slo = slo_targets(slo_ttft_p99, slo_tpot_p99)
    from .reports.terminal import ProgressLines
    spec = compare.spec_from_cli(ctx.args, config_file, trace_options(
        fmt, limit, start, end, rate_scale, sort, 0, trace_model), out, slo or None, html)
    with ProgressLines("compare") as lines:
        result = compare.run_compare(spec, workers or default_workers(), None if (
            quiet or as_json) else lambda done, total, _: lines.update_count(done, total))
    emit(result, as_json, None if quiet else lambda r: typer.echo(render_compare_table(
        [run["label"] for run in r["runs"]], [run["summary"] for run in r["runs"]])
        + f"\nwrote {Path(out) / 'compare.json'}{', report.html' if html else ''} and "
        f"{len(r['runs'])} run directories"))


# --- kvsim profile, kvsim validate (issue 7) ---
# Job logic lives in kvsim.real_backend.profiling / .validate; torch is imported on use.

DEVICE_OPTION = typer.Option("cpu", "--device", help="cpu or cuda.")
BACKEND_MODEL_OPTION = typer.Option("tiny-llama", "--model", help="tiny-llama (bundled), a "
                                    "Llama-like catalog name, or a path to a config.json.")
BACKEND_BLOCK_OPTION = typer.Option(32, "--block-size", min=1, help="Tokens per KV block.")
BackendDtype = Literal["fp32", "bf16", "fp16"]
Clock = Literal["wall", "cpu"]
DTYPE_OPTION = typer.Option("fp32", "--dtype", help="Weights and KV cache dtype.")
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
    from .real_backend.profiling import Limits, profile_job, render_fit
    limits = Limits(max_num_seqs, max_num_batched_tokens, max_context)
    emit(profile_job(settings, limits, out, quick, _progress), as_json,
         lambda p: typer.echo(render_fit(p) + f"\nwrote {p['path']}"))


@app.command("validate")
def validate_command(
    trace: str = typer.Argument(..., metavar="TRACE", help="Trace file (any format)."),
    device: str = DEVICE_OPTION, model: str = BACKEND_MODEL_OPTION,
    profile: Optional[str] = typer.Option(None, "--profile", metavar="FILE", help="Fitted "
                                          "profile (kvsim profile); default: profile first, full grid."),
    out: Optional[str] = typer.Option(None, "--out", metavar="DIR", help="Write "
                                      "validation.json and validation.html here."),
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
    breakdown: bool = typer.Option(False, "--breakdown", help="Time attention, MLP, LM head "
                                   "and host work of every real step."),
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
    fmt: Optional[TraceFormat] = FORMAT_OPTION, limit: Optional[int] = LIMIT_OPTION,
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
    job = ValidateJob(settings, engine, profile, repeats, offline, trace, noise_floor,
                      profile_grid="quick" if quick_profile else "full", breakdown=breakdown)
    opts = trace_options(fmt, limit, start, end, rate_scale, sort, seed, None)
    emit(validate_job(trace, opts, job, out, html, _progress), as_json,
         lambda r: typer.echo(render_table(r) + "".join(
             f"\nwrote {p}" for p in r.get("outputs", {}).values())))


# --- kvsim validate-real (issue 18) ---


@app.command("validate-real")
def validate_real_command(
    result: str = typer.Argument(..., metavar="RESULT", help="A real run: `vllm bench serve "
                                 "--save-result --save-detailed` JSON, or the output of "
                                 "vllm-oracle's replay.py (--timed)."),
    trace: Optional[str] = _opt("The requests' trace (token ids, arrivals); needed for a "
                                "vllm-oracle replay (its input file).", "--trace"),
    model: Optional[str] = _opt("Model (default: the run's; tiny-llama for vllm-oracle).",
                                "--model"),
    gpu: Optional[str] = _opt("GPU of the real run.", "--gpu"),
    tp: Optional[int] = _opt("Tensor-parallel GPUs.", "--tp"),
    block_size: Optional[int] = _opt("Tokens per KV block.", "--block-size"),
    num_gpu_blocks: Optional[int] = _opt("KV blocks (the real engine's).", "--num-gpu-blocks"),
    max_num_seqs: Optional[int] = _opt("Most requests in a batch.", "--max-num-seqs"),
    max_num_batched_tokens: Optional[int] = _opt("Token budget per step.",
                                                 "--max-num-batched-tokens"),
    profile: Optional[str] = _opt("Calibration profile for the cost model.", "--profile"),
    fit: Optional[str] = _opt("Fit the cost model to the run and write the profile here (for "
                              "kvsim run --profile): its step terms to the measured engine "
                              "steps (vllm-oracle), or one speed factor to the median TPOT "
                              "(vllm bench serve); also prints the error after fitting.",
                              "--fit", metavar="FILE"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Replay a real vLLM run's requests in kvsim and print the error table.

    Same requests, same engine settings; per metric (throughput, TTFT/TPOT/E2E
    p50/p90/p99) the real value, kvsim's and the relative error."""
    from .realrun import render_validation, validate_real
    given = dict(model=model, gpu=gpu, tp=tp, block_size=block_size,
                 num_gpu_blocks=num_gpu_blocks, max_num_seqs=max_num_seqs,
                 max_num_batched_tokens=max_num_batched_tokens, profile=profile)
    out = validate_real(result, trace, {k: v for k, v in given.items() if v is not None}, fit)
    emit(out, as_json, lambda r: typer.echo(render_validation(r) + (
        f"\nwrote {r['profile']}" if "profile" in r else "")))


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived (a BaseException, so no ``except Exception`` swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame) -> None:
    raise Interrupted(signum)


def main() -> None:
    """Console entry point: run the app, turning user errors into one line and exit status 2,
    and SIGINT / SIGTERM into one line and exit status 130 / 143."""
    import signal
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    try:
        app(standalone_mode=False)
    except Interrupted as e:
        left = getattr(e, "left", "") or "no result was written"
        sys.stderr.write(f"kvsim: interrupted by {signal.Signals(e.signum).name}; {left}\n")
        sys.exit(128 + e.signum)
    except KvsimError as e:
        sys.stderr.write(f"kvsim: error: {e.one_line()}\n")
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except OSError as e:     # the disk, not the input: a full disk, a vanished directory
        where = f"{e.filename}: " if e.filename else ""
        sys.stderr.write(f"kvsim: error: {where}{e.strerror or e}\n")
        sys.exit(1)
    except Exception as e:
        if not _is_usage_error(e):
            raise
        text = " ".join(e.format_message().split()).replace("Value error, ", "")
        sys.stderr.write(f"kvsim: error: {text}\n")
        sys.exit(e.exit_code)


def _is_usage_error(e: Exception) -> bool:
    """A command-line usage error (bad option value, missing argument, unknown option): click's
    ``ClickException``, which recent typer versions vendor under ``typer.TyperException``."""
    import click
    return isinstance(e, (click.ClickException, typer.TyperException)) and \
        hasattr(e, "format_message") and hasattr(e, "exit_code")


if __name__ == "__main__":
    main()
