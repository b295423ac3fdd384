"""Reports from result frames (docs/frames.md): HTML pages, terminal output, result files.

Knows frames only (a summary dict, a requests and a timeline frame: pandas DataFrames, or
:class:`~kvsim.reports.columns.Columns` as ``kvsim run`` builds them without pandas), nothing
of caches or simulation. Public API:

- the output contract (files, frame columns) in :mod:`kvsim.reports.frames`;
- :func:`write_run_outputs` (:mod:`kvsim.reports.run_outputs`), :func:`read_run_outputs` and
  the atomic writers in :mod:`kvsim.reports.io`, :func:`downsample`
  (:mod:`kvsim.reports.downsampling`);
- :func:`render_run_report`, :func:`render_compare_report`, :func:`render_hitrate_report`;
- :func:`print_summary`, :class:`RunProgress`;
- :func:`rerender_report` (``kvsim report DIR``).
"""

from importlib import import_module

#: Public name -> the module defining it, imported on first use: a module that reads only the
#: output contract (``kvsim.reports.frames``, as the settings do) loads no HTML or plotly.
_WHERE = {
    "render_compare_report": "html", "render_hitrate_report": "html", "render_run_report": "html",
    "downsample": "downsampling", "read_run_outputs": "io", "write_csv_atomic": "io",
    "write_json_atomic": "io", "write_text_atomic": "io", "write_run_outputs": "run_outputs",
    "rerender_report": "rerender", "RunProgress": "terminal", "print_summary": "terminal",
    "summary_table": "terminal",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):       # (as kvsim.workloads loads its names)
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
