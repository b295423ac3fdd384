"""The grid of ``kvsim compare``: run a grid of configurations over one trace, every other setting shared.

A *dimension* is a :class:`~kvsim.sim.config.RunConfig` field given on the command line as
``--field-name V1,V2,...`` (``--field-name=V1,V2`` too). Each value is converted with the
field's type: ``int``, ``float``, ``str``, ``bool`` (``true``/``false``, also ``yes/no``,
``1/0``), and ``none`` for a field that may be unset. A bare ``--flag`` of a ``bool`` field is
``true`` and ``--no-flag`` is ``false``. A dimension with one value is a shared setting; the
grid is the cartesian product of all dimensions, first dimension slowest, and every result is
reported in that order (grid position), whatever order the worker processes finish in.

Outputs under ``--out DIR``: one sub-directory per configuration holding its run outputs
(``summary.json``, ``requests.csv``, ``timeline.csv``, ``report.html``, exactly as ``kvsim run``
writes them), ``compare.json`` (every summary, see :func:`compare_result`) and ``report.html``
(all runs overlaid). Each configuration gives the same summary as ``kvsim run`` with the same
settings would (apart from ``wall_time_s``).
"""

from __future__ import annotations

import itertools
import re
import typing
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Sequence

from kvsim.errors import ConfigError
from kvsim.pipeline import (RunJob, check_deployment, checked_file_settings, file_keys,
                            read_config_file, run_job_frames)
from kvsim.workloads.sources import resolve_trace
from kvsim.reports.frames import COMPARE_FILE, COMPARE_FILES, REPORT_FILE
from kvsim.reports.grid_table import identical_to, table_metrics
from kvsim.sim.config import RunConfig
from kvsim.sim.perf._catalog import close_matches
from kvsim.sim.perf.gpus import gpu_name
from kvsim.workloads import TraceOptions

TRUE, FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")
#: RunConfig fields that cannot be a dimension (the trace is the positional argument).
NOT_DIMENSIONS = ("trace",)


def field_types() -> dict[str, Any]:
    """RunConfig field name -> its type, with ``X | None`` kept as a union."""
    hints = typing.get_type_hints(RunConfig)
    return {f.name: hints[f.name] for f in fields(RunConfig)}


def _base_type(tp: Any) -> tuple[type, bool]:
    """``(type, may be None)`` of a field type such as ``int`` or ``int | None`` (a choice,
    ``Literal[...]``, is a ``str``)."""
    if typing.get_origin(tp) is typing.Literal:
        return str, False
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if args and typing.get_origin(args[0]) is typing.Literal:
        return str, len(args) < len(typing.get_args(tp))
    if args:
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def parse_value(name: str, text: str, tp: Any) -> Any:
    """One value of dimension ``name`` converted to the field type ``tp``."""
    base, optional = _base_type(tp)
    word = text.strip()
    if optional and word.lower() == "none":
        return None
    try:
        if base is bool:
            if word.lower() in TRUE + FALSE:
                return word.lower() in TRUE
            raise ValueError
        return base(word)
    except ValueError:
        expected = {bool: "true or false", int: "an integer", float: "a number"}.get(
            base, base.__name__)
        raise ConfigError(f"expected {expected}, got {word!r}", field=name) from None


def parse_values(name: str, text: str, tp: Any) -> list:
    """The comma-separated values of one dimension, in order, duplicates removed."""
    parts = text.split(",")
    if not any(part.strip() for part in parts):
        raise ConfigError("needs at least one value", field=name)
    if not all(part.strip() for part in parts):
        raise ConfigError(f"empty item in {text!r}", field=name)
    values = [parse_value(name, part, tp) for part in parts]
    return list(dict.fromkeys(values))


def _field_name(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


#: vLLM's other spellings of run options (``kvsim run`` takes them as its own).
OPTION_ALIASES = {"-tp": "--tp", "--tensor-parallel-size": "--tp"}


def parse_grid_args(args: Sequence[str]) -> tuple[str | None, dict[str, list]]:
    """``(trace, dimensions)`` from the command line's remaining arguments.

    Positional words are the trace (at most one). An option naming no RunConfig field, or a
    field that cannot vary (:data:`NOT_DIMENSIONS`), is a :class:`ConfigError`.
    """
    types, trace, dims = field_types(), None, {}
    tokens = list(args)
    while tokens:
        token = tokens.pop(0)
        option, _, text = token.partition("=")
        option = OPTION_ALIASES.get(option, option)
        if not option.startswith("--"):
            if trace is not None:
                raise ConfigError(f"one trace only, got {trace!r} and {token!r}", field="TRACE")
            trace = token
            continue
        name, value = _field_name(option), text if "=" in token else None
        negated = name.startswith("no_") and name not in types and name[3:] in types
        name = name[3:] if negated else name
        if name == "trace":
            raise ConfigError("the trace is the first argument (kvsim compare TRACE --FIELD "
                              "V1,V2 ...), one file for every configuration", field=option)
        if name not in types or name in NOT_DIMENSIONS:
            varied = {n: "--" + n.replace("_", "-") for n in types if n not in NOT_DIMENSIONS}
            raise ConfigError(f"not a run setting that can vary{close_matches(name, varied)}; "
                              f"those are {', '.join(varied.values())}", field=option)
        is_flag = _base_type(types[name])[0] is bool
        if value is None and is_flag and (negated or not tokens or tokens[0].startswith("--")):
            value = "false" if negated else "true"
        elif value is None:
            if not tokens:
                raise ConfigError("needs a value (V1,V2,...)", field=option.lstrip("-"))
            value = tokens.pop(0)
        if name in dims:        # (the second would replace the first's values unseen)
            raise ConfigError(f"given twice; list every value once: --"
                              f"{name.replace('_', '-')} {','.join(map(_text, dims[name]))},"
                              f"{value}", field=option.lstrip("-"))
        dims[name] = parse_values(name, value, types[name])
    return trace, dims


@dataclass(frozen=True)
class GridPoint:
    """One configuration of the grid: its label, output sub-directory and run job."""

    label: str
    settings: dict
    job: RunJob


def _text(value: Any) -> str:
    """A setting's value as the command line spells it (``true``, ``none``)."""
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)


def point_label(settings: dict, varying: Sequence[str]) -> str:
    """``eviction=lru enable_prefix_caching=false``: the settings that vary across the grid
    (``base`` when none does)."""
    return " ".join(f"{k}={_text(settings[k])}" for k in varying) or "base"


def point_dir(index: int, settings: dict, varying: Sequence[str]) -> str:
    """``03_eviction-lru_enable-prefix-caching-false``: a file-system-safe directory name."""
    parts = [f"{k.replace('_', '-')}-{_text(settings[k])}" for k in varying]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", "_".join(parts)).strip("-") if parts else "base"
    return f"{index:02d}_{slug}"[:120]


@dataclass(frozen=True)
class CompareSpec:
    """Everything a ``kvsim compare`` needs: trace, base settings, dimensions, trace reading."""

    trace: str | None
    dims: dict
    base: dict
    trace_options: TraceOptions
    out_dir: Path
    slo: dict | None = None
    html: bool = True
    config_file: str | None = None      # the TOML file ``base`` was read from


def spec_from_cli(args: Sequence[str], config_file: str | None, trace_options: TraceOptions,
                  out_dir: str, slo: dict | None = None, html: bool = True) -> CompareSpec:
    """A :class:`CompareSpec` from the grid arguments and the explicit options."""
    trace, dims = parse_grid_args(args)
    base = read_config_file(config_file) if config_file else {}
    in_file = base.pop("trace", None)
    if config_file:
        checked_file_settings(base, config_file, dims)
    trace = trace if trace is not None else in_file
    return CompareSpec(trace, dims, base, trace_options, Path(out_dir), slo, html, config_file)


def grid_points(spec: CompareSpec, source: str = "compare options") -> list[GridPoint]:
    """The jobs of the grid in grid order (first dimension slowest); each is validated (an
    error names ``source``: the command's options, or the API call)."""
    path, label = resolve_trace(spec.trace)
    dims = {**spec.dims}
    if "gpu" in dims:           # (an alias is its catalog name: one GPU, one label, one run)
        dims["gpu"] = list(dict.fromkeys(gpu_name(g) or g for g in dims["gpu"]))
    names = list(dims)
    varying = [n for n in names if len(dims[n]) > 1]
    points = []
    for i, values in enumerate(itertools.product(*(dims[n] for n in names)), start=1):
        settings = dict(zip(names, values))
        config = RunConfig.from_dict({**spec.base, **settings, "trace": label}, source=source)
        config.validate()
        # (checked before any run starts: a worker that found an unknown model raced the
        # others' cleanup, and a lock file was left; the shared settings are the caller's
        # unless a file gave them)
        mine = {*settings} if spec.config_file else {*settings, *spec.base}
        check_deployment(config, spec.config_file, file_keys(spec.base, settings),
                         (source, mine))
        job = RunJob(config, path, replace(spec.trace_options, seed=config.seed),
                     spec.out_dir / point_dir(i, settings, varying), spec.slo,
                     html=spec.html, plotlyjs="parent")   # one plotly.js for the directory
        points.append(GridPoint(point_label(settings, varying), settings, job))
    _check_options_used(points, source)
    return points


def _check_options_used(points: list[GridPoint], source: str) -> None:
    """Refuse options no configuration of the grid uses (a layout's or a CPU tier's options
    where no point has that layout or tier: :meth:`RunConfig.check_unused_options`); an
    option some points use and others ignore is fine."""
    refusals = []
    for point in points:
        try:
            point.job.config.check_unused_options(source)
            return
        except ConfigError as e:
            refusals.append(e)
    if refusals:
        raise refusals[0]


def run_dirs(points: Sequence[GridPoint]) -> list[str]:
    """The run directories a compare of ``points`` writes (under its ``--out``)."""
    return [p.job.out_dir.name for p in points]


def run_pages(points: Sequence[GridPoint]) -> dict[str, str]:
    """Each configuration's own report, relative to the comparison's (by label)."""
    return {p.label: f"{p.job.out_dir.name}/{REPORT_FILE}" for p in points}


def run_point(point: GridPoint):
    """Run one configuration and write its outputs (module level: runs in a worker)."""
    return run_job_frames(point.job, quiet=True)


def compare_result(spec: CompareSpec, points: Sequence[GridPoint],
                   summaries: Sequence[dict]) -> dict:
    """``compare.json``: the trace, the dimensions and, per configuration in grid order, its
    label, settings, output directory, table numbers and full summary."""
    same = identical_to([p.label for p in points], summaries)
    return {
        "trace": resolve_trace(spec.trace)[1],
        "dimensions": {k: v for k, v in spec.dims.items()},
        "runs": [{"label": p.label, "settings": p.settings, "dir": p.job.out_dir.name,
                  "metrics": table_metrics(s), "identical_to": other, "summary": s}
                 for p, s, other in zip(points, summaries, same)],
    }


def run_compare(spec: CompareSpec, workers: int = 1, progress=None) -> dict:
    """Run every configuration (``workers`` processes; 1: in this process), write each one's
    outputs, ``compare.json`` and ``report.html``; returns the ``compare.json`` dict."""
    from kvsim.reports.html import render_compare_report
    from kvsim.reports.io import write_json_atomic
    from kvsim.sim.plan.sweep import SweepOptions, run_tasks
    from kvsim.reports.outdir import OutputDir
    points = grid_points(spec)
    if progress is not None:
        progress(0, len(points), None)      # (how many, from the start)
    with OutputDir(spec.out_dir, subdirs=run_dirs(points), reads=[spec.trace],
                   writes=COMPARE_FILES):
        outputs = run_tasks(run_point, points, SweepOptions(workers=workers), progress)
        result = compare_result(spec, points, [summary for summary, _, _ in outputs])
        if spec.html:
            render_compare_report([(p.label, *frames) for p, frames in zip(points, outputs)],
                                  spec.out_dir / "report.html", spec.slo, plotlyjs="sibling",
                                  pages=run_pages(points))
        write_json_atomic(spec.out_dir / COMPARE_FILE, result)
    return result
