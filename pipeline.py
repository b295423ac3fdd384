"""The jobs the CLI runs, wired end to end: trace -> simulator -> output files.

Here and not in ``cli.py`` so tests (and notebooks) can run a job without a shell.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import ConfigError
from .reports.io import write_run_outputs
from .reports.terminal import RunProgress
from .sim import results
from .sim.config import RunConfig
from .sim.runner import simulate
from .workloads import TraceOptions, load_trace, sample_path

DEFAULT_SAMPLE = "mooncake"


@dataclass(frozen=True)
class RunJob:
    """A ``kvsim run``: the trace, how to read it, the deployment, where to write."""

    config: RunConfig
    trace_path: Path
    trace_options: TraceOptions
    out_dir: Path
    slo: dict | None = None
    html: bool = True


def resolve_trace(trace: str | None) -> tuple[Path, str]:
    """The trace file to read and its label (``sample:NAME`` for a bundled sample)."""
    if trace is None:
        return sample_path(DEFAULT_SAMPLE), f"sample:{DEFAULT_SAMPLE}"
    if trace.startswith("sample:"):
        return sample_path(trace.split(":", 1)[1]), trace
    return Path(trace), trace


def read_config_file(path: str) -> dict:
    """Settings from a TOML file (top level, or a ``[run]`` table)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("no such config file", location=path) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"not valid TOML: {e}", location=path) from None
    return data.get("run", data)


def run_job(job: RunJob, quiet: bool = True, progress: bool | None = None) -> dict:
    """Simulate the job's trace and write its outputs; returns the summary.

    The trace streams through the simulator; only when a progress bar may be shown is it
    scanned once beforehand for its length and time span. A bad line aborts the run before
    anything is written.
    """
    return run_job_frames(job, quiet, progress)[0]


def run_job_frames(job: RunJob, quiet: bool = True, progress: bool | None = None):
    """:func:`run_job`, returning ``(summary, requests frame, timeline frame)``."""
    console = _stderr_console()
    show = not quiet and (progress if progress is not None else console.is_terminal)
    span, count = _scan(job) if show else (0.0, 0)
    with RunProgress(span, count, show, console=console) as bar:
        result = simulate(load_trace(job.trace_path, job.trace_options), job.config,
                          progress=bar.update if show else None)
    summary, requests_df, timeline_df = run_outputs(result)
    if job.slo:
        summary["slo"] = job.slo
    write_run_outputs(job.out_dir, summary, requests_df, timeline_df, html=job.html)
    return summary, requests_df, timeline_df


def _scan(job: RunJob) -> tuple[float, int]:
    span = count = 0
    for request in load_trace(job.trace_path, job.trace_options):
        span, count = request.arrival_s, count + 1
    return span, count


def run_outputs(result):
    """(summary, requests frame, timeline frame) of a finished simulation."""
    requests_df = results.requests_frame(result)
    steps = results.steps_frame(result)
    summary = results.build_summary(result, requests_df, steps)
    timeline_df = results.timeline_frame(steps, result.duration_s,
                                         result.deployment.num_gpu_blocks,
                                         result.config.block_size, result.config.replicas)
    return summary, requests_df, timeline_df


def with_trace_label(config: RunConfig, label: str) -> RunConfig:
    return replace(config, trace=label)


def _stderr_console():
    from rich.console import Console
    return Console(file=sys.stderr)
