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
    version: Optional[bool] = typer.Option(
        None, "--version", callback=_version_callback, is_eager=True,
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
                                 "agent or sharegpt-like."),
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
    out: str = typer.Option("kvsim-out", "--out", metavar="DIR", help="Output directory."),
    slo_ttft_p99: Optional[float] = _opt("TTFT p99 target (s), drawn in the report.",
                                         "--slo-ttft-p99"),
    slo_tpot_p99: Optional[float] = _opt("TPOT p99 target (s), drawn in the report.",
                                         "--slo-tpot-p99"),
    fmt: Optional[str] = FORMAT_OPTION, limit: Optional[int] = LIMIT_OPTION,
    start: Optional[float] = START_OPTION, end: Optional[float] = END_OPTION,
    rate_scale: float = RATE_SCALE_OPTION, sort: bool = SORT_OPTION,
    trace_model: Optional[str] = typer.Option(None, "--trace-model",
                                              help="BurstGPT only: keep this model's rows."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar, no summary."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Replay a trace through a simulated vLLM deployment and write summary.json,
    requests.csv, timeline.csv and report.html into --out."""
    from . import pipeline
    from .sim.config import RunConfig
    given = {k: v for k, v in locals().items() if k in RunConfig.__dataclass_fields__
             and v is not None}
    settings = pipeline.read_config_file(config_file) if config_file else {}
    path, label = pipeline.resolve_trace(trace or settings.pop("trace", None))
    settings.pop("trace", None)
    config = RunConfig.from_dict({**settings, **given, "trace": label},
                                 source=config_file or "options")
    slo = {k: v for k, v in (("ttft_p99_s", slo_ttft_p99), ("tpot_p99_s", slo_tpot_p99)) if v}
    job = pipeline.RunJob(config, path, trace_options(
        fmt, limit, start, end, rate_scale, sort, config.seed, trace_model), Path(out),
        slo or None)
    summary = pipeline.run_job(job, quiet=quiet or as_json)
    emit(summary, as_json, None if quiet else lambda s: _show_run(s, out))


def _show_run(summary: dict, out: str) -> None:
    from .reports.terminal import print_summary
    print_summary(summary)
    if summary["num_rejected"]:
        typer.echo(f"warning: {summary['num_rejected']} requests were rejected: their prompt "
                   f"is not shorter than max_model_len {summary['config']['max_model_len']:,}",
                   err=True)
    typer.echo(f"wrote {out}/summary.json, requests.csv, timeline.csv, report.html")


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
    except Exception as e:  # click usage errors carry their own exit code
        import click
        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(e.exit_code)
        raise


if __name__ == "__main__":
    main()
