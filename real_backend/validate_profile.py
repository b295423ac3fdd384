"""The profile a validation uses, and what it says about its own trust.

``kvsim validate`` takes a profile file (``--profile``) or profiles the backend itself: before
the real run (:func:`~.profiling.run_profile`) or between its steps
(:class:`~.interleaved_profile.InterleavedProfile`, the default). :func:`profile_quality`
summarises where a profile came from, how well its fit follows its own points, how much its
passes disagreed and how old it is; :mod:`.validate_report` turns that into warnings.
"""

from __future__ import annotations

import calendar
import json
import time
from pathlib import Path
from typing import Callable

from kvsim.errors import ConfigError

from kvsim.real_backend.profiling import Limits, quiet, run_profile

BEFORE, INTERLEAVED = "before", "interleaved"
#: When a validation without a profile file measures its profile (``--profile-timing``).
PROFILE_TIMINGS = (INTERLEAVED, BEFORE)


def check_timing(timing: str, share: float) -> None:
    """Refuse an unknown profile timing or a share of profiling time that is not positive."""
    if timing not in PROFILE_TIMINGS:
        raise ConfigError(f"expected one of {PROFILE_TIMINGS}, got {timing!r}",
                          field="profile_timing")
    if not share > 0:
        raise ConfigError(f"expected a positive share of the run's time, got {share!r}",
                          field="profile_share")


def load_or_make_profile(job, limits: Limits, progress: Callable[[str], None] = quiet) -> dict:
    """The job's profile file, or a new one measured now, before the run, over the run's
    operating range ``limits`` (the full grid, or the quick one if ``job.profile_grid`` says
    so)."""
    if job.profile:
        try:
            return json.loads(Path(job.profile).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read profile: {exc}", location=job.profile) from None
    return run_profile(job.settings, limits, quick=job.profile_grid == "quick",
                       progress=progress, rounds=job.profile_rounds)


def profile_source(job) -> str:
    """``file``, or the grid a validation profiled (``full grid``, ``quick grid``)."""
    return "file" if job.profile else f"{job.profile_grid} grid"


def profile_quality(profile: dict, source: str, now: float | None = None) -> dict:
    """What a profile says about its own trust: where it came from (``file``, ``full grid``,
    ``quick grid``), when it was measured (``timing``: ``before`` the run, or ``interleaved``
    with it, and then which share of its items were measured between the steps rather than
    after the run), its points and passes, the median and worst fit error over its compute
    groups, how much its passes disagreed (``round_spread``, None after one pass) and its age
    in seconds when the validation started (None when it has no timestamp)."""
    fit = {g: e for g, e in (profile.get("fit_error") or {}).items() if g != "transfer"}
    created = profile.get("created")
    age = None
    if created:
        stamp = calendar.timegm(time.strptime(created, "%Y-%m-%dT%H:%M:%SZ"))
        age = max((time.time() if now is None else now) - stamp, 0.0)
    grid, timing = profile.get("grid") or {}, profile.get("timing") or {}
    return {"source": source, "timing": timing.get("kind", BEFORE),
            "between_steps": timing.get("measured_between_steps"),
            "points": len(profile.get("points", [])), "passes": grid.get("rounds"),
            "fit_median": max((e["median_abs_rel_error"] for e in fit.values()), default=None),
            "fit_max": max((e["max_abs_rel_error"] for e in fit.values()), default=None),
            "round_spread": profile.get("round_spread"), "age_s": age}


def profile_mismatch(profile: dict, settings) -> dict:
    """Settings the profile was measured under that differ from this run's (``{key: (profile,
    run)}``); timings only transfer between equal device, dtype, threads and clock."""
    measured = profile.get("settings", {})
    keys = ("device", "dtype", "threads", "clock", "block_size")
    run = settings.to_dict()
    return {k: (measured[k], run[k]) for k in keys if k in measured and measured[k] != run[k]}
