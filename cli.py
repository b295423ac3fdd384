"""The ``kvsim`` command line. Wiring only: every command calls into the packages.

Conventions every command follows:
- ``--json`` prints the command's machine-readable result on stdout and nothing else;
- a :class:`kvsim.errors.KvsimError` becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys
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
