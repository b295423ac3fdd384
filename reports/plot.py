"""Report figures as plotly.js JSON: plain dicts, built with the part of plotly's figure API
the reports use (traces, a grid of subplots, axis updates, annotations, reference lines).

plotly's ``graph_objects`` validate every property through a large object model, imported
lazily, class by class: about a third of a second for one report page, more than simulating a
small trace takes. The reports draw a few fixed kinds of figure, so they are written directly
in plotly.js' schema and serialised here; the browser's plotly.js is the same. The grid of
:func:`make_subplots` and the reference lines follow plotly's own
(``tests/test_report_plot.py`` builds both and compares them).
"""

from __future__ import annotations

import base64
import json
import math
import re
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

__all__ = ["Figure", "bar", "figure_json", "make_subplots", "scatter", "template"]

_AXIS_KEY = re.compile(r"^([xy])axis(\d*)$")
#: numpy dtypes plotly.js reads from base64 (its typed-array spec), by their short names.
_TYPED = {"int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2", "int32": "i4",
          "uint32": "u4", "float32": "f4", "float64": "f8"}
#: Characters a figure's JSON escapes, so that it can sit inside a <script> element.
_HTML_SAFE = (("<", "\\u003c"), (">", "\\u003e"), ("/", "\\u002f"))


def scatter(**props) -> dict:
    """A ``scatter`` trace (properties left None are not set)."""
    return _trace("scatter", props)


def bar(**props) -> dict:
    """A ``bar`` trace (properties left None are not set)."""
    return _trace("bar", props)


def _trace(kind: str, props: dict) -> dict:
    return {"type": kind, **_given(props)}


class Figure:
    """A figure's ``data`` (traces) and ``layout``, as plotly.js reads them. Layout updates
    merge nested dicts, as plotly's ``update_layout`` does; a None value removes a property."""

    __slots__ = ("data", "layout", "_cells")

    def __init__(self, data: dict | list | None = None):
        self.data: list[dict] = [data] if isinstance(data, dict) else list(data or [])
        self.layout: dict[str, Any] = {}
        self._cells: list[list[int]] | None = None     # subplot number of each (row, col)

    def add_trace(self, trace: dict, row: int | None = None, col: int | None = None):
        """Add ``trace``; with ``row`` and ``col`` (from 1), in that subplot."""
        if row is not None:
            n = self._cell(row, col)
            trace = {**trace, "xaxis": _axis_id("x", n), "yaxis": _axis_id("y", n)}
        self.data.append(trace)
        return self

    def update_layout(self, **props):
        _merge(self.layout, props)
        return self

    def update_xaxes(self, row: int | None = None, col: int | None = None, **props):
        """Update every x axis, or with ``row`` and ``col`` that subplot's."""
        return self._update_axes("x", row, col, props)

    def update_yaxes(self, row: int | None = None, col: int | None = None, **props):
        """Update every y axis, or with ``row`` and ``col`` that subplot's."""
        return self._update_axes("y", row, col, props)

    def add_annotation(self, **props):
        self.layout.setdefault("annotations", []).append(_given(props))
        return self

    def add_hline(self, y: float, line: dict, row: int | None = None, col: int | None = None,
                  label: str | None = None):
        """A horizontal line across the plot at ``y``, ``label`` above its left end (none in
        a subplot without traces, as plotly does)."""
        x_ref, y_ref = self._refs(row, col)
        if row is not None and not self._draws_on(x_ref, y_ref):
            return self
        self._add_shape(dict(type="line", x0=0, x1=1, xref=f"{x_ref} domain", y0=y, y1=y,
                             yref=y_ref, line=line))
        if label is not None:
            self.add_annotation(text=label, showarrow=False, x=0, xanchor="left",
                                xref=f"{x_ref} domain", y=y, yanchor="bottom", yref=y_ref)
        return self

    def add_vline(self, x: float, line: dict, row: int | None = None, col: int | None = None,
                  label: str | None = None, label_font: dict | None = None):
        """A vertical line across the plot at ``x``, ``label`` right of its foot (none in a
        subplot without traces, as plotly does)."""
        x_ref, y_ref = self._refs(row, col)
        if row is not None and not self._draws_on(x_ref, y_ref):
            return self
        self._add_shape(dict(type="line", x0=x, x1=x, xref=x_ref, y0=0, y1=1,
                             yref=f"{y_ref} domain", line=line))
        if label is not None:
            self.add_annotation(text=label, font=label_font, showarrow=False, x=x,
                                xanchor="left", xref=x_ref, y=0, yanchor="bottom",
                                yref=f"{y_ref} domain")
        return self

    def to_dict(self) -> dict:
        return {"data": self.data, "layout": self.layout}

    # --- internals -----------------------------------------------------------------------

    def _cell(self, row: int, col: int) -> int:
        if self._cells is None:
            raise ValueError("row and col need a figure made by make_subplots")
        if not (0 < row <= len(self._cells) and 0 < col <= len(self._cells[0])):
            raise ValueError(f"no subplot at row {row}, col {col}")
        return self._cells[row - 1][col - 1]

    def _refs(self, row: int | None, col: int | None) -> tuple[str, str]:
        n = 1 if row is None else self._cell(row, col)
        return _axis_id("x", n), _axis_id("y", n)

    def _draws_on(self, x_ref: str, y_ref: str) -> bool:
        """Whether a trace is drawn on the subplot of axes ``x_ref``, ``y_ref``."""
        return any(t.get("xaxis", "x") == x_ref and t.get("yaxis", "y") == y_ref
                   for t in self.data)

    def _update_axes(self, letter: str, row, col, props: dict):
        if row is not None:
            names = [_axis_name(letter, self._cell(row, col))]
        else:
            names = [k for k in self.layout if (m := _AXIS_KEY.match(k)) and m[1] == letter]
        for name in names or [f"{letter}axis"]:
            _merge(self.layout.setdefault(name, {}), props)
        return self

    def _add_shape(self, shape: dict) -> None:
        self.layout.setdefault("shapes", []).append(shape)


def make_subplots(rows: int = 1, cols: int = 1, *, shared_xaxes: bool = False,
                  horizontal_spacing: float | None = None,
                  vertical_spacing: float | None = None, row_heights=None,
                  subplot_titles=None) -> Figure:
    """A figure with a ``rows`` x ``cols`` grid of x/y subplots, numbered row by row from
    the top left, with plotly's geometry: default spacings ``0.2 / cols`` and ``0.3 / rows``
    (``0.5 / rows`` with titles), ``row_heights`` (top first) shared in proportion, titles
    centred above each subplot, and with ``shared_xaxes`` each column's x axes matching its
    bottom one (the others without tick labels)."""
    if vertical_spacing is None:        # (more room between rows for their titles)
        vertical_spacing = (0.3 if subplot_titles is None else 0.5) / rows
    fig = Figure()
    fig._cells = [[r * cols + c + 1 for c in range(cols)] for r in range(rows)]
    domains = _grid_domains(rows, cols, horizontal_spacing, vertical_spacing, row_heights)
    for n, (x_domain, y_domain) in enumerate(domains, start=1):
        fig.layout[_axis_name("x", n)] = {"anchor": _axis_id("y", n), "domain": x_domain}
        fig.layout[_axis_name("y", n)] = {"anchor": _axis_id("x", n), "domain": y_domain}
    if shared_xaxes:
        for r, c in ((r, c) for r in range(rows - 1) for c in range(cols)):
            fig.layout[_axis_name("x", fig._cells[r][c])].update(
                matches=_axis_id("x", fig._cells[rows - 1][c]), showticklabels=False)
    for title, (x_domain, y_domain) in zip(subplot_titles or (), domains):
        if title:
            fig.add_annotation(y=y_domain[1], xref="paper", x=sum(x_domain) / 2.0,
                               yref="paper", text=title, showarrow=False, font={"size": 16},
                               xanchor="center", yanchor="bottom")
    return fig


def _grid_domains(rows: int, cols: int, h: float | None, v: float,
                  row_heights) -> list[tuple[list[float], list[float]]]:
    """``(x domain, y domain)`` of each subplot, row by row from the top left, in plotly's
    arithmetic (the same floats)."""
    h = 0.2 / cols if h is None else h
    widths = [(1.0 - h * (cols - 1)) / cols] * cols
    if row_heights is None:
        heights = [(1.0 - v * (rows - 1)) / rows] * rows
    else:                                           # (bottom row first)
        total = float(sum(row_heights))
        heights = [(1.0 - v * (rows - 1)) * (x / total) for x in row_heights][::-1]
    domains = []
    for below in range(rows - 1, -1, -1):          # (rows below this one)
        y0 = sum(heights[:below]) + below * v
        y_domain = [_clamp(y0), _clamp(y0 + heights[below])]
        for c in range(cols):
            x0 = sum(widths[:c]) + c * h
            domains.append(([x0, x0 + widths[c]], y_domain))
    return domains


def figure_json(fig: Figure) -> tuple[str, str]:
    """``(data, layout)`` of a figure as JSON safe inside an HTML ``<script>``: numeric
    arrays as plotly.js typed arrays (base64), NaN and infinities as null elsewhere."""
    return _json(fig.data), _json(fig.layout)


@lru_cache(maxsize=None)
def template(name: str) -> dict:
    """plotly's registered template ``name`` as plotly.js JSON (read from plotly's package
    data, as :data:`plotly.io.templates` does, without building its objects)."""
    path = resources.files("plotly") / "package_data" / "templates" / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8"))


# --- helpers ---------------------------------------------------------------------------------

def _axis_id(letter: str, n: int) -> str:
    return letter if n == 1 else f"{letter}{n}"


def _axis_name(letter: str, n: int) -> str:
    return f"{letter}axis" if n == 1 else f"{letter}axis{n}"


def _clamp(y: float) -> float:
    """plotly's rounding of a domain end a float error puts just outside ``[0, 1]``."""
    return 0.0 if -0.01 < y < 0.0 else 1.0 if 1.0 < y < 1.01 else y


def _given(props: dict) -> dict:
    """The properties set (not None)."""
    return {key: value for key, value in props.items() if value is not None}


def _merge(target: dict, props: dict) -> None:
    """Update ``target`` with ``props``, nested dicts merged into nested dicts (and copied:
    the caller's stay unchanged)."""
    for key, value in props.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            if not isinstance(target.get(key), dict):
                target[key] = {}
            _merge(target[key], value)
        else:
            target[key] = value


def _json(obj) -> str:
    text = json.dumps(_plain(obj), separators=(",", ":"))
    for char, escaped in _HTML_SAFE:      # (str.replace: a C scan each, ten times faster
        text = text.replace(char, escaped)  # than one str.translate through a table)
    return text


def _plain(value):
    """``value`` in JSON types; numeric arrays (numpy, pandas) as typed arrays."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "to_numpy") and not isinstance(value, np.generic):   # pandas
        value = value.to_numpy()
    if isinstance(value, np.ndarray):
        return _typed_array(value)
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _typed_array(a: np.ndarray):
    """plotly.js' typed-array spec of a 1-d numeric array (int64 narrowed to the smallest
    type holding it, as plotly does); other arrays as lists."""
    if a.dtype.kind in "iu" and a.dtype.itemsize == 8 and a.size:
        lo, hi = int(a.min()), int(a.max())
        for name in (("int8", "int16", "int32") if a.dtype.kind == "i"
                     else ("uint8", "uint16", "uint32")):
            if np.iinfo(name).min <= lo and hi <= np.iinfo(name).max:
                a = a.astype(name)
                break
    short = _TYPED.get(str(a.dtype))
    if short is None or a.ndim != 1 or not a.size:
        return [_plain(v) for v in a.tolist()]
    data = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    return {"dtype": short, "bdata": base64.b64encode(data.tobytes()).decode("ascii")}
