"""Write a run's result directory: frames, bench.json, report.html, then ``summary.json``.

The one writer of ``kvsim run --out DIR`` (the CLI, the Python API and studies go through it).
It sits above :mod:`kvsim.reports.io` (the atomic writers) and :mod:`kvsim.reports.html` (the
report page); a directory holding ``summary.json`` holds a complete run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from kvsim.errors import KvsimError
from kvsim.reports.bench import write_bench_json
from kvsim.reports.columns import Columns
from kvsim.reports.frames import (BENCH_FILE, OUTPUT_FORMATS, REPORT_FILE, REQUESTS_FILE, SUMMARY_FILE,
                     TIMELINE_FILE)
from kvsim.reports.html import render_run_report
from kvsim.reports.io import require_parquet, write_csv_atomic, write_json_atomic, write_parquet_atomic

if TYPE_CHECKING:
    import pandas as pd


def write_frames(out: Path, requests_df: pd.DataFrame | Columns,
                 timeline_df: pd.DataFrame | Columns,
                 output_format: str = "csv") -> dict[str, Path]:
    """``requests`` and ``timeline`` (DataFrames, or :class:`Columns` as ``kvsim run`` builds
    them) as CSV or Parquet files in ``out``."""
    if output_format not in OUTPUT_FORMATS:
        raise KvsimError(f"expected one of {', '.join(OUTPUT_FORMATS)}, got {output_format!r}",
                         field="output_format")
    if output_format == "parquet":
        return {"requests": write_parquet_atomic(out / "requests.parquet", requests_df),
                "timeline": write_parquet_atomic(out / "timeline.parquet", timeline_df)}
    return {"requests": write_csv_atomic(out / REQUESTS_FILE, requests_df),
            "timeline": write_csv_atomic(out / TIMELINE_FILE, timeline_df)}


def write_run_outputs(out_dir: str | os.PathLike, summary: dict,
                      requests_df: pd.DataFrame | Columns, timeline_df: pd.DataFrame | Columns,
                      html: bool = True, *,
                      plotlyjs: str = "inline", output_format: str = "csv",
                      bench: bool = False) -> dict[str, Path]:
    """Write a run's result files into ``out_dir``; returns ``{name: path}``.

    Order: a stale ``summary.json`` is removed, then requests and timeline (``output_format``
    csv or parquet), bench.json (when ``bench``), report.html (when ``html``), and
    ``summary.json`` last, each atomically. A run interrupted part-way thus leaves no
    ``summary.json``, the marker of a complete run.
    """
    out = Path(out_dir)
    if output_format == "parquet":
        require_parquet()  # before anything is written
    out.mkdir(parents=True, exist_ok=True)
    (out / SUMMARY_FILE).unlink(missing_ok=True)
    written = write_frames(out, requests_df, timeline_df, output_format)
    if bench:
        written["bench"] = write_bench_json(out / BENCH_FILE, summary, requests_df)
    if html:
        written["report"] = render_run_report(
            summary, requests_df, timeline_df, out / REPORT_FILE,
            slo=summary.get("slo"), plotlyjs=plotlyjs)
    written["summary"] = write_json_atomic(out / SUMMARY_FILE, summary)
    return written
