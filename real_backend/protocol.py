"""A validation that reproduces: profile and validate back to back, N times; median and spread.

One *repeat* is one :func:`~.validate.validate` call without a profile file: it runs the trace
on the real backend while it profiles it between the steps (the full grid, as long again as
the run; :mod:`.interleaved_profile`), replays the real steps for the noise floor
(:mod:`.noise_floor`, profiling on between them) and runs the simulator. With
``profile_timing="before"`` it profiles first (three passes, seconds before the run), then
runs and replays. The summary gives, per quantity, every repeat's
value, the median and the spread (max - min), each error as a multiple of its own repeat's noise
floor, and the verdicts; with a breakdown, which part of the step moved between the runs.

While each repeat runs, :class:`HostLoad` measures the CPU other processes used (from
``/proc/stat``), so a result measured on a busy host says so.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from typing import Callable, Iterable

import numpy as np

from kvsim.real_backend.breakdown import PARTS, part_table
from kvsim.real_backend.noise_floor import FAIL, PASS, TARGETS, UNJUDGED, WITHIN
from kvsim.real_backend.profiling import quiet
from kvsim.real_backend.validate import ValidateJob, validate

#: Quantities summarised over repeats: name -> how to read it from a validation report.
QUANTITIES = {
    "step_median_error": lambda r: r["step_duration"]["all"]["median_abs_rel_error"],
    "throughput_error": lambda r: r["metrics"]["throughput_output_tokens_per_s"]["rel_error"],
    "busy_time_signed_error": lambda r: r["step_duration"]["total_time_signed_error"],
    "noise_floor_step": lambda r: r["noise_floor"]["step_median_abs_rel_diff"],
    "noise_floor_throughput": lambda r: r["noise_floor"]["throughput_rel_diff"],
    "step_error_times_floor": lambda r: r["verdicts"]["step_median"]["times_floor"],
    "throughput_error_times_floor": lambda r: r["verdicts"]["throughput"]["times_floor"],
    "refit_speed_factor": lambda r: r["speed_refit"]["factor"],
    "refit_step_median_error": lambda r: r["speed_refit"]["step_median_after"],
    "refit_busy_time_signed_error": lambda r: r["speed_refit"]["busy_time_after"],
    "profile_fit_median": lambda r: r["profile_quality"]["fit_median"],
    "profile_round_spread": lambda r: (r["profile_quality"]["round_spread"] or {}).get("median"),
    "mean_step_real_s": lambda r: r["mean_step_s"]["real"],
    "others_cpus": lambda r: r["host"]["others_cpus"],
    "repeat_wall_s": lambda r: r["host"]["wall_s"],
}


class HostLoad:
    """CPUs used by other processes between :meth:`start` and :meth:`stop` (Linux; None
    elsewhere): the host's busy time less this process's own CPU time, per wall second."""

    def start(self) -> "HostLoad":
        self._t0, self._busy0, self._own0 = time.monotonic(), busy_seconds(), own_seconds()
        return self

    def stop(self) -> dict:
        wall = time.monotonic() - self._t0
        busy = busy_seconds()
        others = None
        if busy is not None and self._busy0 is not None and wall > 0:
            others = max(busy - self._busy0 - (own_seconds() - self._own0), 0.0) / wall
        return {"wall_s": wall, "others_cpus": others, "load_avg": _load_avg()}


def busy_seconds() -> float | None:
    """Non-idle CPU seconds of the whole host since boot (None without ``/proc/stat``)."""
    try:
        fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _load_avg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def run_protocol(requests: Iterable, job: ValidateJob, repeats: int = 3,
                 progress: Callable[[str], None] = quiet) -> dict:
    """``repeats`` validations of ``requests`` (each profiling first unless ``job.profile``
    names a file); returns :func:`summarize` of their reports, with each report slimmed to
    its numbers (:func:`slim`) under ``repeats``."""
    if job.profile is None and job.profile_grid != "full":
        progress("protocol: warning: a quick profile per repeat (rough)")
    reqs = list(requests)
    reports = []
    for i in range(repeats):
        load = HostLoad().start()
        report = validate(reqs, job, progress)
        report["host"] = load.stop()
        reports.append(slim(report))
        progress(f"protocol: repeat {i + 1}/{repeats} done in {report['host']['wall_s']:.0f}s")
    return summarize(reports)


def slim(report: dict) -> dict:
    """A validation report without its per-step arrays; with a breakdown, the part totals of
    the real run and of its replay (``part_totals``) are kept."""
    out = {k: v for k, v in report.items() if k != "steps"}
    steps = report["steps"]
    if "parts" in steps:
        out["part_totals"] = {"run": {k: float(np.sum(v)) for k, v in steps["parts"].items()}}
        if "replayed_parts" in steps:
            out["part_totals"]["replay"] = {k: float(np.sum(v))
                                            for k, v in steps["replayed_parts"].items()}
        out["part_table"] = part_table(steps)
    return out


def spread(values: list) -> dict:
    """Every value, their median, min, max and spread (max - min); Nones are left out of
    the statistics."""
    known = [v for v in values if v is not None]
    if not known:
        return {"values": values, "median": None, "min": None, "max": None, "spread": None}
    return {"values": values, "median": statistics.median(known), "min": min(known),
            "max": max(known), "spread": max(known) - min(known)}


def summarize(reports: list[dict]) -> dict:
    """Median and spread of every :data:`QUANTITIES` over the repeats, the verdicts per
    repeat and overall, and (with a breakdown) how each part of the step moved."""
    quantities = {name: spread([_read(read, r) for r in reports])
                  for name, read in QUANTITIES.items()}
    verdicts = {key: [r["verdicts"][key]["verdict"] for r in reports] for key in TARGETS}
    out = {"num_repeats": len(reports), "targets": dict(TARGETS), "quantities": quantities,
           "verdicts": verdicts,
           "conclusion": {key: conclusion(verdicts[key], TARGETS[key]) for key in TARGETS},
           "decisions_identical": [r["decisions"]["identical"] for r in reports],
           "repeats": reports}
    parts = part_movement(reports)
    if parts:
        out["parts"] = parts
    return out


def _read(read: Callable[[dict], object], report: dict):
    try:
        return read(report)
    except (KeyError, TypeError):
        return None


def conclusion(verdicts: list[str], target: float) -> str:
    """One sentence on a quantity's verdicts over the repeats."""
    n = len(verdicts)
    count = {v: verdicts.count(v) for v in (PASS, WITHIN, FAIL, UNJUDGED)}
    if count[UNJUDGED]:
        return (f"not judged in {count[UNJUDGED]} of {n} repeats (no noise floor); pass "
                f"{count[PASS]}, within the noise floor {count[WITHIN]}, fail {count[FAIL]}")
    if count[PASS] == n:
        return f"within the {target:.0%} target and above the noise floor in all {n} repeats"
    if count[FAIL] == 0 and count[PASS] + count[WITHIN] == n:
        return (f"within the noise floor in {count[WITHIN]} of {n} repeats, within the "
                f"{target:.0%} target in the other {count[PASS]}: no repeat failed")
    return (f"failed the {target:.0%} target (above the noise floor) in {count[FAIL]} of "
            f"{n} repeats; pass {count[PASS]}, within the noise floor {count[WITHIN]}")


def part_movement(reports: list[dict]) -> dict:
    """Per part of the step: its share of the real runs' time; the spread of its total over
    every measured run (each repeat's run and replay: ``(max - min) / median``), i.e. how much
    it moved between runs minutes apart; and the median per-step move between a run and its
    replay (seconds apart)."""
    runs = [totals for r in reports for totals in r.get("part_totals", {}).values()]
    if not runs:
        return {}
    out = {}
    grand = sum(run["total"] for run in runs) or 1.0
    for part in PARTS + ("total",):
        values = np.array([run[part] for run in runs])
        med = float(np.median(values))
        step_moves = [r["part_table"][part].get("step_median_abs_rel_diff") for r in reports
                      if "part_table" in r]
        out[part] = {"share": float(values.sum()) / grand,
                     "totals_s": values.tolist(),
                     "run_to_run_spread": float((values.max() - values.min()) / med) if med
                     else None,
                     "step_move_median": spread(step_moves)["median"]}
    return out


# --- the table -----------------------------------------------------------------------------

ROWS = (("step median error", "step_median_error", "pct"),
        ("throughput error", "throughput_error", "pct"),
        ("busy time, sim vs real (signed)", "busy_time_signed_error", "signed"),
        ("noise floor: step (median)", "noise_floor_step", "pct"),
        ("noise floor: throughput", "noise_floor_throughput", "pct"),
        ("step error / its floor", "step_error_times_floor", "times"),
        ("throughput error / its floor", "throughput_error_times_floor", "times"),
        ("speed refit on first 10 % (x)", "refit_speed_factor", "times"),
        ("  then step median error", "refit_step_median_error", "pct"),
        ("  then busy time (signed)", "refit_busy_time_signed_error", "signed"),
        ("profile fit error (median)", "profile_fit_median", "pct"),
        ("profile passes disagree (median)", "profile_round_spread", "pct"),
        ("mean real step (ms)", "mean_step_real_s", "ms"),
        ("other processes (CPUs)", "others_cpus", "cpus"),
        ("repeat wall time (s)", "repeat_wall_s", "s"))


SHORT = {WITHIN: "in floor", UNJUDGED: "n/a"}


def _fmt(value, kind: str) -> str:
    if value is None:
        return "n/a"
    return {"pct": f"{value:.1%}", "signed": f"{value:+.1%}", "times": f"{value:.2f}x",
            "ms": f"{value * 1e3:.2f}", "cpus": f"{value:.2f}", "s": f"{value:.0f}"}[kind]


def render_protocol(summary: dict) -> str:
    """The summary as a plain-text table: one column per repeat, then median and spread."""
    n = summary["num_repeats"]
    head = f"{'quantity':<34}" + "".join(f"{f'repeat {i + 1}':>10}" for i in range(n))
    lines = [head + f"{'median':>10}{'spread':>10}"]
    for label, key, kind in ROWS:
        q = summary["quantities"][key]
        cells = "".join(f"{_fmt(v, kind):>10}" for v in q["values"])
        spread_kind = "pct" if kind == "signed" else kind
        lines.append(f"{label:<34}{cells}{_fmt(q['median'], kind):>10}"
                     f"{_fmt(q['spread'], spread_kind):>10}")
    for key, verdicts in summary["verdicts"].items():
        lines.append(f"{'verdict: ' + key:<34}" + "".join(f"{SHORT.get(v, v):>10}"
                                                          for v in verdicts))
    lines.append(f"decisions identical: {summary['decisions_identical']}")
    lines += [f"{key}: {text}" for key, text in summary["conclusion"].items()]
    return "\n".join(lines + _part_lines(summary.get("parts")))


def _part_lines(parts: dict | None) -> list[str]:
    if not parts:
        return []
    lines = [f"{'part of the step':<18}{'share':>8}{'moved between runs':>20}"
             f"{'per step, run vs replay':>25}"]
    for part, row in parts.items():
        lines.append(f"{part:<18}{row['share']:>8.1%}{_fmt(row['run_to_run_spread'], 'pct'):>20}"
                     f"{_fmt(row['step_move_median'], 'pct'):>25}")
    return lines
