"""``kvsim compare``: a grid of ``kvsim run`` settings over one trace, in one table.

Grid options (``--eviction lru,lfu --block-size 16,32`` ...) are parsed by :mod:`kvsim.grid`
from the remaining arguments, so every RunConfig field can vary without an option here; the
trace reading and SLO options are ``kvsim run``'s (one definition, in :mod:`kvsim.commands.options`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kvsim.commands.options import (JSON_OPTION, SLO_TARGETS, TRACE_MODEL_OPTION, emit, given_path,
                          opt, trace_options, trace_reading, with_groups)


@with_groups
def compare_command(
    ctx: typer.Context,
    config_file: Optional[str] = opt("TOML file holding shared settings.", "--config"),
    out: str = typer.Option(
        "kvsim-compare", "--out", metavar="DIR", callback=given_path, help="Output directory."),
    workers: Optional[int] = opt("Worker processes.", "--workers", min=1,
                                 show_default="min(4, CPUs)"),
    slo: dict = SLO_TARGETS,
    reading: dict = trace_reading(model=TRACE_MODEL_OPTION),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No table."),
    html: bool = typer.Option(True, "--html/--no-html", help="Also write the HTML reports "
                              "(the comparison's and each run's; plotly.min.js once)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run a grid of `kvsim run` settings over TRACE and compare them in one table.

    Any run setting takes a comma-separated list (e.g. --eviction lru,priority
    --enable-prefix-caching true,false); one value is shared. TRACE defaults to the bundled
    sample:mooncake, as for `kvsim run`. Writes compare.json, report.html and one run
    directory per configuration into --out."""
    from rich.console import Console
    from kvsim import grid
    from kvsim.reports.terminal import CountBar, ProgressLines
    from kvsim.sim.plan.sweep import default_workers
    spec = grid.spec_from_cli(ctx.args, config_file, trace_options(reading, seed=0), out,
                              slo or None, html)
    told = not (quiet or as_json)
    stderr = Console(stderr=True)
    with ProgressLines("compare") as lines, CountBar("comparing", "configurations",
                                                     stderr if told else None,
                                                     lazy=True) as bar:   # (after the checks)
        show = bar.update if stderr.is_terminal else lines.update_count  # (a bar, or a line
        result = grid.run_compare(spec, workers or default_workers(),   # every 10 s in a log)
                                  (lambda done, total, _: show(done, total)) if told else None)
    emit(result, as_json, None if quiet else lambda r: typer.echo(
        _table(r) + f"\nwrote {Path(out) / 'compare.json'}{', report.html' if html else ''} "
        f"and {len(r['runs'])} run director{'ies' if len(r['runs']) != 1 else 'y'}"))


def _table(result: dict) -> str:
    """The comparison table, in blocks as wide as the terminal (whole when piped)."""
    import shutil
    import sys
    import textwrap
    from kvsim.reports.grid_table import LEGEND, render_compare_table
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    return _header(result) + "\n\n" + render_compare_table(
        [run["label"] for run in result["runs"]], [run["summary"] for run in result["runs"]],
        width) + "\n\n" + (textwrap.fill(LEGEND, width) if width else LEGEND)


def _header(result: dict) -> str:
    """What every configuration shares: the trace, and the deployment and KV cache where
    no dimension of the grid changes them."""
    from kvsim.reports.style import get, left_out_summary_text
    from kvsim.reports.run_texts import cache_text, deployment_text, trace_text
    configs = [run["summary"].get("config") or {} for run in result["runs"]]
    deployments = {deployment_text(c, get(run["summary"], "model", "weight_dtype"),
                                   get(run["summary"], "model", "name"))
                   for c, run in zip(configs, result["runs"])}
    rows = [("trace", {trace_text(c) for c in configs}),
            ("left out", {left_out_summary_text(run["summary"]) for run in result["runs"]}),
            ("deployment", deployments), ("KV cache", {cache_text(c) for c in configs})]
    if len(deployments) > 1:    # (a grid over GPUs, TP or replicas: what they share)
        rows[2:2] = [("model", {get(run["summary"], "model", "name") or c.get("model")
                                for c, run in zip(configs, result["runs"])}),
                     *((name, {str(c[key]) for c in configs}) for name, key in (
                         ("GPU", "gpu"), ("TP", "tp"), ("replicas", "replicas"),
                         ("dtype", "dtype")) if all(c.get(key) is not None for c in configs))]
    shared = [(name, texts.pop()) for name, texts in rows if len(texts) == 1]
    return "\n".join(f"{name:<12}{text}" for name, text in shared if text)
