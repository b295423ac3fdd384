"""Every numeric axis of every figure in the run and compare reports says what it measures
(a title, with its unit)."""

import pytest

from kvsim.reports import html
from synthetic_runs import synthetic_run


def axes_without_titles(fig) -> list[str]:
    """Names of the layout's axes that carry data but no title; a category axis (horizontal
    bars' labels), an axis tied to another (``matches``) and an empty figure are exempt."""
    used = {u for t in fig.data for u in (t.get("xaxis", "x").replace("x", "xaxis", 1),
                                          t.get("yaxis", "y").replace("y", "yaxis", 1))}
    missing = []
    for name in sorted(used):
        axis = fig.layout.get(name, {})
        if axis.get("matches") or axis.get("autorange") == "reversed":
            continue
        if not axis.get("title", {}).get("text"):
            missing.append(name)
    return missing


@pytest.fixture
def figures(monkeypatch):
    seen = []
    real = html.figure_div

    def keep(fig, div_id, *args, **kwargs):
        seen.append((div_id, fig))
        return real(fig, div_id, *args, **kwargs)
    monkeypatch.setattr(html, "figure_div", keep)
    return seen


def test_run_and_compare_report_axes_have_titles(tmp_path, figures):
    summary, requests, timeline = synthetic_run(num_requests=120, timeline_rows=80)
    html.render_run_report(summary, requests, timeline, tmp_path / "run.html")
    other = synthetic_run(num_requests=120, timeline_rows=80, seed=1)
    html.render_compare_report([("a", summary, requests, timeline), ("b", *other)],
                               tmp_path / "cmp.html")
    assert len(figures) >= 12
    untitled = {div: axes_without_titles(fig) for div, fig in figures}
    assert {div: axes for div, axes in untitled.items() if axes} == {}
