"""``kvsim report DIR``: re-render a run's report.html from its CSV/JSON outputs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from kvsim.reports.html import render_run_report
from kvsim.reports.frames import REPORT_FILE
from kvsim.reports.io import read_run_outputs


def rerender_report(run_dir: str | os.PathLike, out: Optional[str | os.PathLike] = None, *,
                    plotlyjs: str = "inline") -> dict:
    """Read ``run_dir`` (summary.json, requests.csv, timeline.csv) and write its report.

    ``out`` defaults to ``run_dir/report.html``; an existing directory gets ``report.html``
    inside it. Returns what was done, for ``--json``: ``report`` (path), ``run_dir``,
    ``num_requests``, ``num_completed``, ``timeline_rows``.
    """
    summary, requests, timeline = read_run_outputs(run_dir)
    target = Path(out) if out is not None else Path(run_dir) / REPORT_FILE
    if target.is_dir():
        target = target / REPORT_FILE
    path = render_run_report(summary, requests, timeline, target, plotlyjs=plotlyjs)
    completed = int((requests["completed"] == 1).sum()) if len(requests) else 0
    return {"report": str(path), "run_dir": str(run_dir), "num_requests": int(len(requests)),
            "num_completed": completed, "timeline_rows": int(len(timeline))}
