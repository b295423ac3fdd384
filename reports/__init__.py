"""Reports from result frames (docs/frames.md): HTML pages, terminal output, result files.

Knows frames only (a summary dict, a requests and a timeline DataFrame), nothing of caches or
simulation. Public API:

- the output contract (files, frame columns) in :mod:`kvsim.reports.frames`;
- :func:`write_run_outputs` (:mod:`kvsim.reports.run_outputs`), :func:`read_run_outputs`,
  :func:`downsample` and the atomic writers in :mod:`kvsim.reports.io`;
- :func:`render_run_report`, :func:`render_compare_report`, :func:`render_hitrate_report`;
- :func:`print_summary`, :class:`RunProgress`;
- :func:`rerender_report` (``kvsim report DIR``).
"""

from kvsim.reports.html import render_compare_report, render_hitrate_report, render_run_report
from kvsim.reports.io import downsample, read_run_outputs, write_csv_atomic, write_json_atomic, write_text_atomic
from kvsim.reports.run_outputs import write_run_outputs
from kvsim.reports.rerender import rerender_report
from kvsim.reports.terminal import RunProgress, print_summary, summary_table

__all__ = [
    "RunProgress", "downsample", "print_summary", "read_run_outputs", "render_compare_report",
    "render_hitrate_report", "render_run_report", "rerender_report", "summary_table",
    "write_csv_atomic", "write_json_atomic", "write_run_outputs", "write_text_atomic",
]
