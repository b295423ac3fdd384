"""``kvsim report DIR``: re-render a run's report.html from its CSV/JSON outputs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from kvsim.output_file import refuse_overwriting
from kvsim.reports.html import render_run_report
from kvsim.reports.frames import REPORT_FILE, RUN_FILES
from kvsim.reports.io import read_run_outputs
from kvsim.reports.page import PLOTLY_JS_FILE


def rerender_report(run_dir: str | os.PathLike, out: Optional[str | os.PathLike] = None, *,
                    plotlyjs: str | None = None) -> dict:
    """Read ``run_dir`` (summary.json, requests.csv, timeline.csv) and write its report.

    ``out`` defaults to ``run_dir/report.html``; an existing directory gets ``report.html``
    inside it. ``plotlyjs``: as the page it replaces had it (a compare run's page loads the
    ``plotly.min.js`` beside the comparison), else inline. Returns what was done, for
    ``--json``: ``report`` (path), ``run_dir``, ``num_requests``, ``num_completed``,
    ``timeline_rows``.
    """
    target = Path(out) if out is not None else Path(run_dir) / REPORT_FILE
    if target.is_dir():
        target = target / REPORT_FILE
    refuse_overwriting(target, [Path(run_dir) / name for name in RUN_FILES
                                if name != REPORT_FILE])
    summary, requests, timeline = read_run_outputs(run_dir)
    mode = plotlyjs or _plotly_mode(target)
    path = render_run_report(summary, requests, timeline, target, plotlyjs=mode)
    completed = int((requests["completed"] == 1).sum()) if len(requests) else 0
    return {"report": str(path), "run_dir": str(run_dir), "num_requests": int(len(requests)),
            "num_completed": completed, "timeline_rows": int(len(timeline))}


def _plotly_mode(page: Path) -> str:
    """How the page at ``page`` loads plotly.js (``parent``: the file beside a comparison's
    run folders, ``sibling``, else ``inline``), read from its head."""
    try:
        with open(page, encoding="utf-8", errors="replace") as f:
            head = f.read(1 << 16)       # (the head: styles, then the script tag)
    except OSError:
        return "inline"
    for mode, src in (("parent", f'src="../{PLOTLY_JS_FILE}"'),
                      ("sibling", f'src="{PLOTLY_JS_FILE}"')):
        if src in head and (page.parent / src[5:-1]).is_file():
            return mode
    return "inline"
