"""The report's figures are plotly.js JSON built without plotly's object model
(:mod:`kvsim.reports.plot`): the same JSON as plotly's own figure API would give."""

from __future__ import annotations

import base64
import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest
from plotly.subplots import make_subplots as plotly_subplots

from kvsim.reports.plot import Figure, figure_json, make_subplots, scatter, template


def plotly_json(fig: go.Figure) -> dict:
    """plotly's figure as plain JSON, typed arrays decoded (compared as values), without the
    default template plotly adds."""
    found = _decoded(json.loads(pio.to_json(fig)))
    del found["layout"]["template"]
    return found


def our_json(fig: Figure) -> dict:
    data, layout = figure_json(fig)
    return _decoded({"data": json.loads(data), "layout": json.loads(layout)})


def _decoded(value):
    if isinstance(value, dict):
        if {"dtype", "bdata"} <= set(value):
            raw = base64.b64decode(value["bdata"])
            return np.frombuffer(raw, dtype=np.dtype(value["dtype"]).newbyteorder("<")).tolist()
        return {k: _decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


@pytest.mark.parametrize("grid", [
    dict(rows=1, cols=3, horizontal_spacing=0.06, subplot_titles=["a", "b", "c"]),
    dict(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=["a", "b"]),
    dict(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1, row_heights=[0.7, 0.3],
         subplot_titles=["top", "bottom"]),
    dict(rows=1, cols=1, shared_xaxes=True, vertical_spacing=0.1),
    dict(rows=3, cols=2, shared_xaxes=True, subplot_titles=["a", "", "c"]),
    dict(rows=1, cols=2),
])
def test_a_grid_of_subplots_has_plotlys_domains_anchors_titles_and_shared_axes(grid):
    theirs, ours = plotly_subplots(**grid), make_subplots(**grid)
    theirs.add_trace(go.Scatter(x=[1, 2], y=[3, 4]), row=grid["rows"], col=grid["cols"])
    ours.add_trace(scatter(x=[1, 2], y=[3, 4]), row=grid["rows"], col=grid["cols"])
    for fig in (theirs, ours):
        fig.update_xaxes(title=dict(text="time"), row=grid["rows"], col=1)
        fig.update_yaxes(tickformat=".0%")
    assert our_json(ours) == plotly_json(theirs)


def test_reference_lines_and_their_labels_are_plotlys():
    theirs, ours = plotly_subplots(rows=1, cols=3), make_subplots(rows=1, cols=3)
    for col in (1, 2):        # (plotly draws no line on the third, empty subplot)
        theirs.add_trace(go.Scatter(x=[0, 1], y=[2, 50]), row=1, col=col)
        ours.add_trace(scatter(x=[0, 1], y=[2, 50]), row=1, col=col)
    line = dict(color="#dc2626", dash="dash", width=1.5)
    theirs.add_vline(x=0.5, line=line, annotation_text="SLO", annotation_position="bottom right",
                     annotation_font=dict(size=11), row=1, col=2)
    theirs.add_hline(y=0.99, line=line, row=1, col=2)
    theirs.add_hline(y=40, line=line, annotation_text="pool", annotation_position="top left",
                     row=1, col=1)
    ours.add_vline(x=0.5, line=line, row=1, col=2, label="SLO", label_font=dict(size=11))
    ours.add_hline(y=0.99, line=line, row=1, col=2)
    ours.add_hline(y=40, line=line, row=1, col=1, label="pool")
    theirs.add_vline(x=0.2, line=line, annotation_text="nothing here", row=1, col=3)
    ours.add_vline(x=0.2, line=line, row=1, col=3, label="nothing here")
    assert our_json(ours) == plotly_json(theirs)
    assert len(ours.layout["shapes"]) == 3


def test_layout_updates_merge_nested_properties_and_none_removes_one():
    legend = dict(orientation="h", y=-0.18)
    fig = Figure().update_layout(legend=legend, title=dict(text="t", x=0.01))
    fig.update_layout(legend=dict(font=dict(size=12)), title=dict(x=0.5), height=300)
    assert fig.layout == {"legend": {"orientation": "h", "y": -0.18, "font": {"size": 12}},
                          "title": {"text": "t", "x": 0.5}, "height": 300}
    assert legend == dict(orientation="h", y=-0.18)       # the caller's dict is left alone
    fig.update_layout(title=None)
    assert "title" not in fig.layout


def test_axis_updates_reach_every_axis_or_one_subplots_and_a_plain_figure_gets_one():
    plain = Figure().update_xaxes(visible=False)
    assert plain.layout == {"xaxis": {"visible": False}}
    grid = make_subplots(rows=1, cols=2).update_yaxes(type="log")
    grid.update_yaxes(title=dict(text="right"), row=1, col=2)
    assert grid.layout["yaxis"] == {"anchor": "x", "domain": [0.0, 1.0], "type": "log"}
    assert grid.layout["yaxis2"]["title"] == {"text": "right"}
    with pytest.raises(ValueError, match="no subplot at row 2, col 1"):
        grid.add_trace(scatter(x=[1]), row=2, col=1)
    with pytest.raises(ValueError, match="make_subplots"):
        plain.add_trace(scatter(x=[1]), row=1, col=1)


def test_arrays_travel_as_typed_arrays_and_the_json_is_safe_in_a_script():
    fig = Figure(scatter(x=pd.Series([0.5, np.nan, 2.0]), y=np.array([1, 300, -2], dtype=np.int64),
                         customdata=np.array([7, 8], dtype=np.int64), text=["a", "b"],
                         name="</script><b>", hoverinfo=None))
    data, _ = figure_json(fig)
    trace = json.loads(data)[0]
    assert trace["x"]["dtype"] == "f8" and trace["y"]["dtype"] == "i2"
    assert trace["customdata"]["dtype"] == "i1" and "hoverinfo" not in trace
    assert _decoded(trace)["x"][::2] == [0.5, 2.0] and np.isnan(_decoded(trace)["x"][1])
    assert _decoded(trace)["y"] == [1, 300, -2]
    assert "</script>" not in data and trace["name"] == "</script><b>"
    assert json.loads(figure_json(Figure(scatter(y=[float("nan"), 1.0])))[0])[0]["y"] == [None, 1.0]


def test_the_template_is_plotlys_registered_one():
    assert template("plotly_white") == json.loads(json.dumps(
        pio.templates["plotly_white"].to_plotly_json()))
