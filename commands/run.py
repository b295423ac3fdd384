"""``kvsim run`` (a trace through a simulated deployment) and ``kvsim report`` (its page
again). Wiring only: the work is :mod:`kvsim.pipeline`'s and :mod:`kvsim.reports`'."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kvsim.commands.options import (CPU_OFFLOAD_GB_OPTION, JSON_OPTION, KV_OFFLOADING_SIZE_OPTION,
                          LONG_PROMPT_OPTION, MAX_MODEL_LEN_OPTION, NUM_CPU_BLOCKS_OPTION,
                          OFFLOAD_EVICTION_OPTION, OFFLOAD_STORE_THRESHOLD_OPTION,
                          OFFLOAD_WRITE_OPTION, PREEMPTION_MODE_OPTION, SLO_TARGETS,
                          TRACE_MODEL_OPTION, OptionGroup, OutputFormat, emit, given_path, opt,
                          setting, trace_options, trace_reading, with_groups)
from kvsim.sim.config import (AllocatorName, EvictionPolicy, KvDtype, Layout, LongPrompt,
                         OffloadEvictionPolicy, OffloadWrite, PreemptionMode, ReservePolicy,
                         RouterName, Sampling, SchedulingPolicy, WeightDtype)

#: ``kvsim run``'s options of :class:`~kvsim.sim.config.RunConfig` settings, in --help order.
RUN_SETTINGS = OptionGroup({
    "model": (Optional[str], setting("model", "Catalog name, Hugging Face id, or path to a "
                                     "config.json.")),
    "gpu": (Optional[str], setting("gpu", "GPU: a100-40gb, a100-80gb, h100-80gb, h200, l4, "
                                   "l40s.")),
    "tp": (Optional[int], setting("tp", "Tensor-parallel GPUs per replica.", "--tp",
                                  "--tensor-parallel-size", "-tp")),
    "replicas": (Optional[int], setting("replicas", "Replicas behind the router.")),
    "router": (Optional[RouterName], setting("router", "How requests are spread over "
                                             "replicas.")),
    "block_size": (Optional[int], setting("block_size", "Tokens per KV block.")),
    "num_gpu_blocks": (Optional[int], setting("num_gpu_blocks", "Usable KV blocks per "
                                              "replica, overriding the sizing (vLLM's "
                                              "--num-gpu-blocks-override N gives N-1).")),
    "dtype": (Optional[KvDtype], setting("dtype", "KV cache (and weights) dtype.")),
    "weight_dtype": (Optional[WeightDtype], setting(
        "weight_dtype", "Weights stored as (int4: 4-bit with group-128 scales); none: the "
        "checkpoint's quantization_config, else --dtype.")),
    "gpu_memory_utilization": (Optional[float], setting(
        "gpu_memory_utilization", "Share of GPU memory vLLM may use.")),
    "max_num_seqs": (Optional[int], setting("max_num_seqs", "Most requests in a batch.")),
    "max_num_batched_tokens": (Optional[int], setting("max_num_batched_tokens",
                                                      "Token budget per step.")),
    "max_model_len": (Optional[int], MAX_MODEL_LEN_OPTION),
    "long_prompt": (Optional[LongPrompt], LONG_PROMPT_OPTION),
    "long_prefill_token_threshold": (Optional[int], setting(
        "long_prefill_token_threshold", "Longest prefill chunk when several requests compete "
        "(0: none).")),
    "enable_prefix_caching": (Optional[bool], setting(
        "enable_prefix_caching", "Prefix caching.", "--enable-prefix-caching/"
        "--no-enable-prefix-caching")),
    "scheduling_policy": (Optional[SchedulingPolicy], setting("scheduling_policy",
                                                              "Queue order.")),
    "enable_chunked_prefill": (Optional[bool], setting(
        "enable_chunked_prefill", "Chunked prefill (off needs --max-num-batched-tokens >= "
        "max_model_len).", "--enable-chunked-prefill/--no-enable-chunked-prefill")),
    "scheduler_reserve_full_isl": (Optional[bool], setting(
        "scheduler_reserve_full_isl", "Admit a request only when its whole sequence fits "
        "(vLLM's default).", "--scheduler-reserve-full-isl/--no-scheduler-reserve-full-isl")),
    "sampling": (Optional[Sampling], setting(
        "sampling", "Generated tokens without recorded ids: random (unique per request) or "
        "greedy (identical prompts generate identical blocks).")),
    "profile": (Optional[str], setting("profile", "Calibration profile JSON for the cost "
                                       "model.")),
    "seed": (Optional[int], setting("seed", "Seed of every random choice.")),
    "skip_ahead": (Optional[bool], setting(
        "skip_ahead", "Skip ahead over decode-only steps, and over a long prompt's chunks "
        "beside decodes (identical results, faster).",
        "--skip-ahead/--no-skip-ahead")),
    "eviction": (Optional[EvictionPolicy], setting(
        "eviction", "Eviction of cached blocks: lru is vLLM's; belady is the offline optimum.")),
    "layout": (Optional[Layout], setting(
        "layout", "KV layout: paged (vLLM), contiguous (one reserved region per request, "
        "first-fit) or hybrid (contiguous below --hybrid-threshold, paged above).")),
    "hybrid_threshold": (Optional[int], setting(
        "hybrid_threshold", "Hybrid: final length (tokens) under which a request gets a "
        "contiguous region.")),
    "reserve": (Optional[ReservePolicy], setting(
        "reserve", "Contiguous/hybrid reservation: max (max_model_len), pow2 (next power of "
        "two of the final length), oracle (exact), pow2-output (prompt + next power of two "
        "of the output: the vLLM paper's Orca (Pow2)).")),
    "allocator": (Optional[AllocatorName], setting(
        "allocator", "Contiguous: where regions go: first-fit (lowest gap that holds the "
        "region) or buddy (power-of-two blocks, as the vLLM paper's Orca baselines).")),
    "compaction_threshold": (Optional[float], setting(
        "compaction_threshold", "Contiguous: compact when free slots unusable by the next "
        "request exceed this share of the pool (none: never).")),
    "num_cpu_blocks": (Optional[int], NUM_CPU_BLOCKS_OPTION),
    "kv_offloading_size": (Optional[float], KV_OFFLOADING_SIZE_OPTION),
    "offload_write": (Optional[OffloadWrite], OFFLOAD_WRITE_OPTION),
    "offload_eviction_policy": (Optional[OffloadEvictionPolicy], OFFLOAD_EVICTION_OPTION),
    "offload_store_threshold": (Optional[int], OFFLOAD_STORE_THRESHOLD_OPTION),
    "cpu_offload_gb": (Optional[str], CPU_OFFLOAD_GB_OPTION),
    "preemption_mode": (Optional[PreemptionMode], PREEMPTION_MODE_OPTION),
})

QUIET_OPTION = typer.Option(False, "--quiet", "-q", help="No progress, no summary.")
OUTPUT_FORMAT_OPTION = typer.Option(
    "csv", "--output-format", help="How requests and timeline are stored: requests.csv and "
    "timeline.csv, or requests.parquet and timeline.parquet (same columns; needs pyarrow: "
    "pip install 'kvsim[parquet]').")
BENCH_JSON_OPTION = typer.Option(
    False, "--bench-json", help="Also write bench.json: the result in the fields and units of "
    "`vllm bench serve --save-result --save-detailed` (see docs/api.md).")


@with_groups
def run_command(
    trace: Optional[str] = typer.Argument(
        None, metavar="TRACE", help="Trace file, '-' for standard input, or sample:NAME "
        "(default: sample:mooncake; also sample:azure-conv)."),
    config_file: Optional[str] = opt("TOML file holding any of these settings.", "--config"),
    settings: dict = RUN_SETTINGS,
    out: str = typer.Option(
        "kvsim-out", "--out", metavar="DIR", callback=given_path, help="Output directory."),
    html: bool = typer.Option(True, "--html/--no-html", help="Also write report.html."),
    output_format: OutputFormat = OUTPUT_FORMAT_OPTION,
    bench_json: bool = BENCH_JSON_OPTION,
    slo: dict = SLO_TARGETS,
    reading: dict = trace_reading(model=TRACE_MODEL_OPTION),
    quiet: bool = QUIET_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Replay a trace through a simulated vLLM deployment.

    Writes summary.json, requests.csv, timeline.csv and report.html into --out."""
    from kvsim import pipeline
    config, path = pipeline.config_from_sources(trace, config_file, settings)
    job = pipeline.RunJob(config, path, trace_options(reading, seed=config.seed), Path(out),
                          slo or None, html=html, output_format=output_format, bench=bench_json)
    summary = pipeline.run_job(job, quiet=quiet or as_json, notes=not quiet)
    if quiet and summary["num_rejected"]:   # (a warning, not progress or summary: told after)
        from kvsim.reports.style import rejected_text
        pipeline.say(f"rejected {rejected_text(summary)}")
    if as_json and not quiet:       # (stdout is the JSON alone: where the files went, on stderr)
        pipeline.say(written(out, job))
    emit(summary, as_json, None if quiet else lambda s: show_run(s, out, job))


def show_run(summary: dict, out: str, job=None) -> None:
    """The summary table and the files written, for people."""
    from kvsim.reports.terminal import print_summary
    print_summary(summary)
    typer.echo(written(out, job))


def written(out: str, job=None) -> str:
    """``wrote DIR/summary.json, requests.csv, ...``: the files a run wrote."""
    ext = job.output_format if job is not None else "csv"
    names = [f"requests.{ext}", f"timeline.{ext}"]
    names += ["bench.json"] * bool(job is not None and job.bench)
    names += ["report.html"] * bool(job is None or job.html)
    return f"wrote {Path(out) / 'summary.json'}, {', '.join(names)}"


def report_command(
    run_dir: str = typer.Argument(..., metavar="DIR",
                                  help="A run's --out directory (summary.json, CSVs)."),
    out: Optional[str] = typer.Option(
        None, "--out", metavar="FILE", callback=given_path,
        help="Where to write the HTML (default: DIR/report.html)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Re-render report.html from a run's summary.json, requests.csv and timeline.csv."""
    from kvsim.reports.rerender import rerender_report
    emit(rerender_report(run_dir, out), as_json,
         lambda r: typer.echo(f"wrote {r['report']}"))
