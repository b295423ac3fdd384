"""The jobs the CLI runs, wired end to end: trace -> simulator -> output files.

Here and not in ``cli.py`` so tests (and notebooks) can run a job without a shell.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
import textwrap
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from kvsim.errors import ConfigError, TraceError
from kvsim.reports.io import require_parquet
from kvsim.reports.run_outputs import write_run_outputs
from kvsim.reports.frames import run_files
from kvsim.reports.outdir import OutputDir
from kvsim.run_notes import (TraceScan, beyond_context_note, fell_behind, fell_behind_note,
                             long_prompt_note, median_queue_s, oversized_pool_note,
                             profile_note, scan_trace, uncompiled_note,
                             unnamed_content_note)
from kvsim.sim.serving import results
from kvsim.sim.config import RunConfig, located, setting_names
from kvsim.sim.serving.runner import default_executor, resolve_deployment, simulate
from kvsim.workloads import TraceOptions, load_trace
from kvsim.workloads.request import left_out_text, rows_text
from kvsim.workloads.sharing import read_scanned
from kvsim.workloads.sources import check_regular_file, resolve_trace

@dataclass(frozen=True)
class RunJob:
    """A ``kvsim run``: the trace, how to read it, the deployment, where to write."""

    config: RunConfig
    trace_path: Path
    trace_options: TraceOptions
    out_dir: Path
    slo: dict | None = None
    html: bool = True
    output_format: str = "csv"     # requests/timeline as csv or parquet
    bench: bool = False            # also bench.json (vllm bench serve's result shape)
    plotlyjs: str = "inline"       # report.html's plotly.js (reports.page.PLOTLYJS_MODES)


def read_config_file(path: str) -> dict:
    """Settings from a TOML file: top-level keys, or a ``[run]`` table holding them."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        check_regular_file(path, "TOML file")
        text = Path(path).read_text(encoding="utf-8-sig")     # (a BOM is fine)
        data = tomllib.loads(text)
    except TraceError as e:
        raise ConfigError(e.message, location=path, field="config") from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", location=path) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"not valid TOML: {' '.join(str(e).split())}",
                          location=path) from None
    if "run" in data:
        if not isinstance(data["run"], dict):
            raise ConfigError("must be a table ([run]) of settings", location=path,
                              field="run")
        extra = sorted(set(data) - {"run"})
        if extra:
            raise ConfigError("settings go inside the [run] table (or all at the top level)",
                              location=path, field=extra[0])
        data = dict(data["run"])
    _refuse_other_tables(data, text, path)
    _refuse_twice(data, path)
    return _beside(data, Path(path).parent)


def _table_key(header: str) -> str:
    """The key a table's header gives the settings read: ``other`` for ``[other.sub]`` and
    for ``[run.other]``."""
    parts = [part.strip().strip("\"'") for part in header.split(".")]
    return parts[1] if parts[0] == "run" and len(parts) > 1 else parts[0]


_HEADER = re.compile(r"\s*\[\[?\s*([^\]]+?)\s*\]")     # a TOML table's header: [a.b], [[a]]


def _refuse_other_tables(settings: dict, text: str, path: str) -> None:
    """A table the file (``text``) heads with a name that is no setting (``[other]``,
    ``[[other]]``, ``[run.other]``) is refused as a table kvsim does not read; a misspelt key given an
    inline table is left to the unknown-setting check (and its "did you mean")."""
    known = setting_names()
    headers = [m.group(1) for m in map(_HEADER.match, text.splitlines()) if m]
    for key, value in settings.items():
        if str(key).replace("-", "_") in known or not isinstance(value, (dict, list)):
            continue
        header = next((h for h in headers if _table_key(h) == key), None)
        if header is not None:
            raise ConfigError(f"a table [{header}] is not read: kvsim reads the settings at "
                              "the top level or in [run]", location=path, field=str(key))


#: Settings naming a file; a relative path in a TOML file is read from the file's folder.
PATH_SETTINGS = ("trace", "profile")


def _beside(settings: dict, folder: Path) -> dict:
    """``settings`` with each relative path of :data:`PATH_SETTINGS` made relative to
    ``folder`` (a TOML file's), as a configuration file's paths are read; so is ``model``
    where it names a ``.json`` file or something there (else it is a catalog name or a
    Hugging Face id: a missing config.json is then named where it was looked for)."""
    for name in (*PATH_SETTINGS, "model"):
        value = settings.get(name)
        if (isinstance(value, str) and value.strip() and value != "-"
                and not value.startswith("sample:") and not Path(value).is_absolute()
                and (name != "model" or value.endswith(".json")
                     or (folder / value).exists())):
            settings[name] = str(folder / value)
    return settings


def _refuse_twice(settings: dict, path: str) -> None:
    """A setting spelt with '-' and with '_' in one file is an error (the last one won)."""
    seen: set = set()
    for key in settings:
        name = str(key).replace("-", "_")
        if name in seen:
            raise _at_line(ConfigError("given twice (spelt with '-' and with '_')",
                                       location=path, field=str(key)), path)
        seen.add(name)


def _at_line(error: ConfigError, path: str) -> ConfigError:
    """``error`` (about a key of the TOML file at ``path``) located at the key's line."""
    lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    field = str(error.field)
    for name in (re.escape(field), "[-_]".join(map(re.escape, re.split(r"[-_]", field)))):
        pattern = re.compile(r"\s*[\"']?" + name + r"[\"']?\s*=")  # (as spelt, then either)
        line = next((i for i, text in enumerate(lines, 1) if pattern.match(text)), None)
        if line is not None:
            break
    if line is not None and error.location == path:
        error.location = f"{path}:{line}"
        error.args = (error.one_line(),)
    return error


def checked_file_settings(settings: dict, path: str | None, overridden=()) -> RunConfig:
    """The settings read from the TOML file at ``path``, each value checked on its own, and
    its GPU and model looked up unless ``overridden`` (by the command line): an error names
    the file and the key's line."""
    try:
        config = RunConfig.from_dict(settings, source=path or "", check=False)
    except ConfigError as e:
        raise _at_line(e, path) from None
    _look_up_names(config, set(settings) - set(overridden), path)
    return config


def _look_up_names(config: RunConfig, from_file: set, path: str | None) -> None:
    """The GPU and model that the TOML file at ``path`` names (``from_file``: its keys the
    command line leaves) are looked up now, so that an unknown one is shown at its line of
    the file (found later, it named neither)."""
    from kvsim.sim.perf.gpus import resolve_gpu
    from kvsim.sim.perf.models import resolve_model
    for name, resolve in (("gpu", resolve_gpu), ("model", resolve_model)):
        if name not in from_file:
            continue
        try:
            resolve(getattr(config, name))
        except ConfigError as e:
            if e.location is not None:      # (a model's own config.json: its own place)
                raise
            raise _at_line(ConfigError(e.message, location=path, field=name), path) from None


def config_from_sources(trace: str | None, config_file: str | None,
                        given: dict) -> tuple[RunConfig, Path]:
    """The run's settings (defaults < TOML file < command-line options) and its trace file."""
    settings = read_config_file(config_file) if config_file else {}
    in_file = settings.pop("trace", None)
    if in_file is not None and not isinstance(in_file, str):
        raise ConfigError(f"expected a string, got {in_file!r}", location=config_file,
                          field="trace")
    try:
        path, label = resolve_trace(trace if trace is not None else in_file)
    except TraceError as e:
        if trace is not None:
            raise
        where = f"{e.location}: " if e.location else ""
        raise _at_line(ConfigError(where + e.message, location=config_file, field="trace"),
                       config_file) from None
    options = {k: v for k, v in given.items() if v is not None}
    in_toml = checked_file_settings({**settings, "trace": label}, config_file, options)
    # (the file's values were checked: a value wrong on its own is the command line's)
    config = RunConfig.from_dict({**in_toml.to_dict(), **options}, "command line",
                                 check=False)
    from_file = file_keys(settings, options)
    try:
        config.validate()
        config.check_unused_options()
    except ConfigError as e:
        if config_file and options:     # (settings checked together, from both: say so)
            raise located(e, f"{config_file} with the command line") from None
        raise _placed(e, config_file, from_file, ("command line", set(options))) from None
    check_deployment(config, config_file, from_file)
    return config, path


def file_keys(settings: dict, overridden=()) -> set[str]:
    """The settings a TOML file gives (``settings``, spelt with '-' or '_') that the command
    line (``overridden``) leaves to it, by schema name."""
    return {str(key).replace("-", "_") for key in settings} - set(overridden)


def check_deployment(config: RunConfig, path: str | None, from_file: set,
                     given: tuple[str, set] | None = None) -> None:
    """Model, GPU, TP and KV pool checked together before the run. The setting they refuse is
    shown at its line of the TOML file at ``path`` when the file gave it (one of
    ``from_file``), or located at ``given[0]`` when that gave it (one of ``given[1]``: a
    compare grid's settings); else it stays unlocated (the command line's option, as typed,
    or a default)."""
    try:
        resolve_deployment(config)
    except ConfigError as e:
        raise _placed(e, path, from_file, given) from None


def _placed(error: ConfigError, path: str | None, from_file: set,
            given: tuple[str, set] | None) -> ConfigError:
    """A refusal of settings checked together, shown where its setting came from: its line
    of the TOML file at ``path`` (one of ``from_file``), ``given[0]`` (one of ``given[1]``),
    else unlocated (a default: ``field 'x'``); one that names its place already as it is."""
    if error.location is not None:
        return error
    if path and error.field in from_file:
        return _at_line(ConfigError(error.message, location=path, field=error.field), path)
    if given is not None and error.field in given[1]:
        return located(error, given[0])
    return error


def run_job(job: RunJob, quiet: bool = True, progress: bool | None = None,
            notes: bool = False) -> dict:
    """Simulate the job's trace and write its outputs; returns the summary.

    ``--out`` is checked and locked before anything else; a bad setting or trace line aborts
    the run before a result is written (and an interrupt removes what was). ``notes``
    announces requests that will be rejected or truncated before the simulation starts.
    """
    return run_job_frames(job, quiet, progress, notes)[0]


def run_job_frames(job: RunJob, quiet: bool = True, progress: bool | None = None,
                   notes: bool = False):
    """:func:`run_job`, returning ``(summary, requests, timeline)`` (the frames as
    :class:`~kvsim.reports.columns.Columns`)."""
    console = None if quiet else _stderr_console()   # (rich: only for someone to read)
    bar = not quiet and (progress if progress is not None else console.is_terminal)
    if job.output_format == "parquet":
        require_parquet()
    with OutputDir(job.out_dir, reads=[job.trace_path],
                   writes=run_files(job.output_format, job.html, job.bench)):
        deployment = resolve_deployment(job.config)
        scan = scan_trace(job, deployment.max_model_len) if (notes or not quiet) else None
        for note in _notes_before(job.config, deployment, scan) if notes else ():
            say(note)
        show = None if quiet else _progress(scan, bar, console)
        with show or nullcontext():
            left_out = Counter()
            requests, sharing = read_scanned(partial(load_trace, job.trace_path,
                                                     job.trace_options, left_out=left_out))
            result = simulate(requests, job.config, progress=show.update if show else None,
                              sharing=sharing, trace_options=job.trace_options,
                              left_out=left_out)
        summary, requests_df, timeline_df = run_outputs(result)
        queued = median_queue_s(requests_df) if notes else None
        if fell_behind(scan, queued):
            say(fell_behind_note(scan, queued))
        if job.slo:
            summary["slo"] = job.slo
        write_run_outputs(job.out_dir, summary, requests_df, timeline_df, html=job.html,
                          output_format=job.output_format, bench=job.bench,
                          plotlyjs=job.plotlyjs)
    return summary, requests_df, timeline_df


def _notes_before(config, deployment, scan: TraceScan) -> list[str]:
    """What a run says before it starts: a pool larger than its GPUs, a max_model_len past
    the model's context, where step times come from (a bad profile raises its error first),
    prompts too long, trace rows left out, a trace that names no prompt's content, a long
    trace run without the cache's compiled parts."""
    notes = [oversized_pool_note(config)]
    if deployment.max_model_len > (deployment.model_max_len or math.inf):
        notes.append(beyond_context_note(config, deployment))
    if config.profile:
        notes.append(profile_note(config, default_executor(config).profile.raw))
    if scan.num_long or config.long_prompt == "truncate" and scan.num_overflowing:
        notes.append(long_prompt_note(scan, config, deployment))
    if scan.left_out:
        total = sum(scan.left_out.values())
        notes.append(f"{rows_text(total)} of the trace hold{'s' * (total == 1)} no request to "
                     f"run and {'are' if total != 1 else 'is'} left out: "
                     f"{left_out_text(scan.left_out)}")
    notes.append(unnamed_content_note(scan, config))
    notes.append(uncompiled_note(scan))
    return [note for note in notes if note]


def say(message: str) -> None:
    """A note for the person at the terminal, on stderr: one line in a log or a pipe, wrapped
    at the width of a terminal (a terminal cuts words)."""
    line = f"kvsim: {message}"
    if sys.stderr.isatty() and "\n" not in line:
        try:        # (stderr's own width: stdout may be a file; 0: a terminal that has none)
            width = os.get_terminal_size(sys.stderr.fileno()).columns
        except OSError:
            width = 0
        width = width or shutil.get_terminal_size().columns
        line = textwrap.fill(line, width=max(width - 1, 40), subsequent_indent="  ",
                             break_on_hyphens=False, break_long_words=False)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def run_outputs(result):
    """(summary, requests, timeline) of a finished simulation, the frames as
    :class:`~kvsim.reports.columns.Columns` (no pandas)."""
    return results.run_columns(result)


def _progress(scan: TraceScan, bar: bool, console):
    """A progress bar over the trace's span (at a terminal), else a line now and then."""
    from kvsim.reports.terminal import ProgressLines, RunProgress
    if bar:
        return RunProgress(scan.span_s, scan.num_requests, True, console=console)
    return ProgressLines("simulating", scan.num_requests)


def _stderr_console():
    from rich.console import Console
    return Console(file=sys.stderr)
