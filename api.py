"""kvsim from Python: ``kvsim.run``, ``kvsim.load_trace`` and the result they return.

Every setting is checked before any work by the one settings schema
(:class:`~kvsim.sim.config.RunConfig`, shared with the command line and TOML files): an unknown
name or a bad value raises :class:`~kvsim.errors.ConfigError` (a ``ValueError``, one line of
text naming the setting). Nothing is written to disk unless a ``write``/``report`` method is
called. See ``docs/api.md``.
"""

from __future__ import annotations

import math
import operator
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import pandas as pd

from kvsim.errors import ConfigError, TraceError
from kvsim.output_file import refuse_overwriting
from kvsim.sim.config import RunConfig, located
from kvsim.workloads import Request, TraceOptions

#: Keyword arguments that say how to read the trace (the CLI's trace options); every other
#: keyword of :func:`run` is a run setting.
TRACE_KEYWORDS = ("format", "limit", "start", "end", "rate_scale", "sort", "trace_model")
#: The trace label of requests given in Python (no file names them).
PYTHON_LABEL = "python"


class Trace(list):
    """The requests of a trace (a list of :class:`~kvsim.workloads.Request`), remembering the
    file and reading options they came from (``None`` for requests built in Python)."""

    def __init__(self, requests: Iterable[Request], path: Path | None = None,
                 label: str = PYTHON_LABEL, options: TraceOptions | None = None,
                 rows_left_out: dict | None = None) -> None:
        super().__init__(requests)
        self.path, self.label, self.options = path, label, options
        #: the file's rows that held no request to run, by reason (``load_trace``'s count)
        self.rows_left_out = dict(rows_left_out or {})
        self._as_read = tuple(self)     # (the requests the file gave, to tell an edit)
        self._read_print = _fingerprint(self)

    @property
    def is_as_read(self) -> bool:
        """Whether the list still holds the requests its file gave, in order and unchanged (a
        study that reads the trace again from its file in every run needs it so)."""
        return (len(self) == len(self._as_read) and all(map(operator.is_, self, self._as_read))
                and _fingerprint(self) == self._read_print)

    def to_frame(self) -> pd.DataFrame:
        """One row per request: id, trace line, arrival (s), prompt and output tokens,
        priority (the columns requests.csv starts with)."""
        return pd.DataFrame({
            "request_id": [r.request_id for r in self],
            "trace_line": [r.trace_line for r in self], "arrival_s": [r.arrival_s for r in self],
            "prompt_tokens": [r.prompt_tokens for r in self],
            "output_tokens": [r.output_tokens for r in self],
            "priority": [r.priority for r in self]})

    def __repr__(self) -> str:
        return f"<kvsim.Trace {self.label}: {len(self)} requests>"


def _fingerprint(requests: list[Request]) -> int:
    """A sum of hashes of what a run reads of each request (its numbers, names, its arrays by
    length and ends, the id of the request it continues): changes when a field is set anew,
    not when the list is pickled or copied."""
    return sum(hash((r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.priority,
                     r.session_id, r.template_id, r.hash_block_size, _ends(r.prompt_token_ids),
                     _ends(r.prefix_hashes), _ends(r.output_token_ids),
                     None if r.continues is None else r.continues.request_id))
               for r in requests)


def _ends(ids) -> tuple | None:
    """An id array's length and end values (None: no array)."""
    if ids is None:
        return None
    return (len(ids), int(ids[0]), int(ids[-1])) if len(ids) else (0,)


def checked_flag(value: Any, name: str, call: str) -> bool:
    """``value`` if it is True or False, else a :class:`ConfigError` naming ``call``'s
    argument ``name`` (a string such as ``"no"`` would pass as true)."""
    if not isinstance(value, bool):
        raise ConfigError(f"expected True or False, got {value!r}", location=call, field=name)
    return value


def checked_path(value: Any, name: str, call: str) -> str:
    """``value`` (a str or path) as a str, else a :class:`ConfigError` naming ``call``'s
    argument ``name``."""
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"expected a file name or path, got {value!r}", location=call,
                          field=name)
    return os.fspath(value)


def plain(value: Any) -> Any:
    """``value`` as the settings take it: a NumPy number or 0-d array as the Python number
    (``np.int64(64)``), a NumPy array, a pandas Series or Index and a ``range`` as a list,
    inside lists too."""
    if isinstance(value, range):
        return list(value)
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return plain(value.tolist())        # (numpy and pandas: Python values, or a list)
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def plain_keywords(keywords: dict) -> dict:
    """:func:`plain` of every keyword argument's value."""
    return {name: plain(value) for name, value in keywords.items()}


def checked_count(value: Any, name: str, call: str, minimum: int = 1) -> int:
    """``value`` if it is an int of at least ``minimum``, else a :class:`ConfigError` naming
    ``call``'s argument ``name``."""
    value = plain(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"expected an integer >= {minimum}, got {value!r}", location=call,
                          field=name)
    return value


def checked_rate(value: Any, name: str, call: str) -> float | None:
    """``value`` (None, or a finite number > 0) as a float, else a :class:`ConfigError`."""
    value = plain(value)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"expected a number > 0, got {value!r}", location=call, field=name)
    return float(value)


def trace_options(values: dict, seed: int = 0, call: str = "kvsim.run") -> TraceOptions:
    """:class:`TraceOptions` from :data:`TRACE_KEYWORDS`, checked: a bad one names its
    keyword and ``call``."""
    if "sort" in values and not isinstance(values["sort"], bool):
        raise TraceError(f"expected True or False, got {values['sort']!r}", location=call,
                         field="sort")
    try:
        return TraceOptions(fmt=values.get("format"), limit=values.get("limit"),
                            start_s=values.get("start"), end_s=values.get("end"),
                            rate_scale=values.get("rate_scale", 1.0),
                            sort=values.get("sort", False), seed=seed,
                            model_filter=values.get("trace_model")).checked()
    except TraceError as e:
        keyword = {"start_s": "start", "end_s": "end", "model_filter": "trace_model"}.get(
            e.field, e.field)
        raise TraceError(e.message, location=call, field=keyword) from None


def split_keywords(keywords: dict) -> tuple[dict, dict]:
    """(trace options, run settings) of a call's keyword arguments."""
    reading = {k: v for k, v in keywords.items() if k in TRACE_KEYWORDS}
    return reading, {k: v for k, v in keywords.items() if k not in TRACE_KEYWORDS}


def load_trace(trace: str | os.PathLike | None = None, **reading: Any) -> Trace:
    """Read a trace file (any supported format), ``sample:NAME`` or ``None`` (the default
    sample) into a :class:`Trace`; ``reading`` takes :data:`TRACE_KEYWORDS` (``limit=100``,
    ``rate_scale=2``, ...). A bad line is a :class:`~kvsim.errors.TraceError` naming it."""
    unknown = sorted(set(reading) - set(TRACE_KEYWORDS))
    if unknown:
        raise ConfigError(f"not a trace option; known: {', '.join(TRACE_KEYWORDS)}",
                          location="kvsim.load_trace", field=unknown[0])
    reading = plain_keywords(reading)
    from kvsim.workloads.sources import resolve_trace
    from kvsim.workloads import load_trace as read
    path, label = resolve_trace(
        None if trace is None else checked_path(trace, "trace", "kvsim.load_trace"))
    options, left_out = trace_options(reading, call="kvsim.load_trace"), Counter()
    return Trace(read(path, options, left_out), path, label, options, left_out)


def run_config(trace_label: str, settings: dict, config: Any = None,
               source: str = "kvsim.run") -> RunConfig:
    """The run's :class:`RunConfig`: defaults < ``config`` (a TOML file, a dict or a
    RunConfig) < ``settings``; checked."""
    if isinstance(config, RunConfig):
        base = config.to_dict()
    elif isinstance(config, dict):
        base = dict(config)
    elif config is not None:
        from kvsim.pipeline import read_config_file
        base = read_config_file(checked_path(config, "config", source))
    else:
        base = {}
    base.pop("trace", None)
    return RunConfig.from_dict({**base, **settings, "trace": trace_label}, source=source)


@dataclass
class Result:
    """One simulated run: ``summary`` (the ``summary.json`` dict), ``requests`` (one row per
    request: ``requests.csv``'s columns), ``steps`` (one row per engine step, per replica, for
    a run with ``keep_steps=True``; else ``None``), ``timeline`` (``timeline.csv``: the steps
    on a uniform time grid) and the ``config``."""

    summary: dict
    requests: pd.DataFrame
    steps: pd.DataFrame | None
    timeline: pd.DataFrame
    config: RunConfig

    def write(self, out_dir: str | os.PathLike, *, html: bool = True,
              output_format: str = "csv", bench: bool = False) -> dict[str, Path]:
        """Write the run's files into ``out_dir`` exactly as ``kvsim run --out`` does
        (``output_format`` csv or parquet; ``bench``: also ``bench.json``); returns
        ``{name: path}``."""
        from kvsim.reports.io import require_parquet
        from kvsim.reports.run_outputs import write_run_outputs
        from kvsim.reports.outdir import OutputDir
        from kvsim.reports.frames import OUTPUT_FORMATS, run_files
        for name, flag in (("html", html), ("bench", bench)):
            checked_flag(flag, name, "Result.write")
        checked_path(out_dir, "out_dir", "Result.write")
        if output_format not in OUTPUT_FORMATS:     # (before the folder is touched)
            raise ConfigError(f"expected one of {', '.join(OUTPUT_FORMATS)}, got "
                              f"{output_format!r}", location="Result.write",
                              field="output_format")
        if output_format == "parquet":
            require_parquet()
        with OutputDir(out_dir, option="out_dir", reads=[self.config.trace],
                       writes=run_files(output_format, html, bench)):
            return write_run_outputs(out_dir, self.summary, self.requests, self.timeline,
                                     html=html, output_format=output_format, bench=bench)

    def report(self, path: str | os.PathLike) -> Path:
        """Write the run's interactive HTML report to ``path``; returns the path."""
        from kvsim.reports.html import render_run_report
        checked_path(path, "path", "Result.report")
        refuse_overwriting(Path(path), [self.config.trace], "path")
        return render_run_report(self.summary, self.requests, self.timeline, path,
                                 slo=self.summary.get("slo"))

    def bench(self, detailed: bool = True) -> dict:
        """The result in ``vllm bench serve --save-result`` form (see ``bench.json``)."""
        from kvsim.reports.bench import bench_result
        checked_flag(detailed, "detailed", "Result.bench")
        return bench_result(self.summary, self.requests, detailed=detailed)

    def __repr__(self) -> str:
        s = self.summary
        p50 = s["ttft_s"]["p50"]
        ttft = "n/a" if p50 is None else f"{p50 * 1e3:.1f} ms"
        return (f"<kvsim.Result {s['config']['trace']} on {s['config']['model']}: "
                f"{s['num_completed']}/{s['num_requests']} requests, "
                f"{s['throughput_output_tokens_per_s']:.1f} output tok/s, TTFT p50 {ttft}>")


def trace_source(trace: Any, reading: dict, call: str = "kvsim.run") -> tuple[str, Any]:
    """(label, source) of ``call``'s ``trace`` argument: the source is a trace file's path, or
    the list of requests given, checked as a trace file's lines are."""
    from kvsim.workloads.request_list import checked_requests
    from kvsim.workloads.sources import resolve_trace
    if trace is None or isinstance(trace, (str, os.PathLike)):
        return resolve_trace(None if trace is None else os.fspath(trace))[::-1]
    requests = checked_requests(trace)
    if reading:
        raise ConfigError("trace options apply to a trace file; filter the requests in "
                          "Python instead", location=call, field=sorted(reading)[0])
    as_read = isinstance(trace, Trace) and trace.is_as_read   # (an edited one: requests)
    return trace.label if as_read else PYTHON_LABEL, requests


def config_trace(config: Any, call: str = "kvsim.run") -> str | None:
    """The trace ``config`` names (a TOML file as ``kvsim run --config`` reads it, a dict, or
    a RunConfig such as ``Result.config``); None where it names none. The run of requests
    given in Python names none a file could give back."""
    if config is None:
        return None
    if isinstance(config, RunConfig):
        trace = config.trace
    elif isinstance(config, dict):
        trace = config.get("trace")
    else:
        from kvsim.pipeline import read_config_file
        trace = read_config_file(checked_path(config, "config", call)).get("trace")
    if trace == PYTHON_LABEL:
        again = ("pass them again as the trace argument" if call == "kvsim.run" else
                 "write them to a trace file and pass that (each run reads the file)")
        raise ConfigError(f"the config's trace stands for requests given in Python; {again}",
                          location=call, field="trace")
    return trace


def checked_slo(slo: dict | None, call: str = "kvsim.run") -> dict | None:
    """``slo`` checked (:func:`~kvsim.sim.plan.spec.checked_slo`), naming the API ``call``:
    a run's targets are percentiles its summary holds (:data:`SUMMARY_PERCENTILES`)."""
    from kvsim.reports.frames import SUMMARY_PERCENTILES
    from kvsim.sim.plan.spec import checked_slo as check, slo_targets
    try:
        slo = None if slo is None else check(slo)
    except ConfigError as e:
        raise located(e, call) from None
    for key, _, pct, _ in slo_targets(slo or {}):
        if pct not in SUMMARY_PERCENTILES:
            held = ", ".join(f"p{p}" for p in SUMMARY_PERCENTILES)
            raise ConfigError(f"a target's percentile must be one a run's summary holds "
                              f"({held})", location=call, field=key)
    return slo


def run(trace: Any = None, *, config: Any = None, slo: dict | None = None,
        keep_steps: bool = False, **settings: Any) -> Result:
    """Simulate ``trace`` (a file, ``sample:NAME``, ``None`` for the default sample, a
    :class:`Trace` or any list of requests) with ``settings`` (the ``kvsim run`` settings by
    their Python names: ``model="llama-2-7b"``, ``max_num_seqs=64``, ...; trace files also take
    :data:`TRACE_KEYWORDS`). ``config``: a TOML file, dict or RunConfig under the settings.
    ``slo``: targets such as ``{"ttft_p99_s": 2.0}``, kept in the summary and the report.
    ``keep_steps``: also return every engine step as ``Result.steps`` (memory grows with the
    steps; without it the run keeps running totals and the bounded timeline only).

    Everything is checked first (a :class:`ConfigError` before any work); nothing is written.
    """
    from kvsim.sim.serving.runner import resolve_deployment, simulate
    from kvsim.workloads import load_trace as read
    from kvsim.workloads.sharing import scan_trace_sharing
    reading, settings = split_keywords(plain_keywords(settings))
    slo = checked_slo(slo)
    checked_flag(keep_steps, "keep_steps", "kvsim.run")
    label, source = trace_source(trace if trace is not None else config_trace(config),
                                 reading)
    run_cfg = run_config(label, settings, config)
    run_cfg.check_unused_options("kvsim.run")
    options = None if isinstance(source, list) else trace_options(reading, run_cfg.seed)
    try:
        resolve_deployment(run_cfg)           # model, GPU, TP and pool, before the trace
    except ConfigError as e:
        raise located(e, "kvsim.run") from None
    if options is None and run_cfg.long_prompt == "truncate":
        from kvsim.workloads.request_list import copied_requests
        source = copied_requests(source)     # (the run cuts them in place; not the caller's)
    # a trace file's rows holding no request (emptied per reading; a Trace as read: its own)
    left_out = Counter(trace.rows_left_out if isinstance(trace, Trace) and trace.is_as_read
                       else {})
    requests = ((lambda: iter(source)) if options is None
                else (lambda: read(source, options, left_out)))
    read_with = options if options is not None else getattr(trace, "options", None)
    frames = run_frames(simulate(requests(), run_cfg, keep_steps=keep_steps,
                                 sharing=scan_trace_sharing(requests), trace_options=read_with,
                                 left_out=left_out))
    if slo:
        frames[0]["slo"] = dict(slo)
    if frames[0]["num_rejected"]:
        warn_rejected(frames[0], "kvsim.run")
    return Result(*frames, config=run_cfg)


def warn_rejected(summary: dict, call: str) -> None:
    """A :class:`~kvsim.errors.KvsimWarning` saying how many requests the run rejected and
    what to change (the command line's line, in the settings' Python names)."""
    import re
    import warnings
    from kvsim.errors import KvsimWarning
    from kvsim.reports.style import rejected_text
    text = rejected_text(summary).replace("--long-prompt truncate", 'long_prompt="truncate"')
    text = re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), text)
    warnings.warn(f"{call}: rejected {text}", KvsimWarning, stacklevel=3)


def run_frames(result) -> tuple[dict, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(summary, requests, steps, timeline) of a finished simulation."""
    from kvsim.sim.serving import results
    return results.run_frames(result)


def iter_requests(trace: Any) -> Iterator[Request]:
    """The requests of a :class:`Trace`, a list of requests, or a trace file / sample name."""
    if trace is None or isinstance(trace, (str, os.PathLike)):
        return iter(load_trace(trace))
    return iter(trace)
