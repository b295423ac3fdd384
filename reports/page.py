"""HTML page assembly: template, cards, settings, tables, and embedding plotly figures offline.

plotly.js is never loaded from a network: ``plotlyjs="inline"`` puts it in the page (one
self-contained file, ~5 MB), ``plotlyjs="sibling"`` writes ``plotly.min.js`` beside the page and
links it by relative path, ``plotlyjs="parent"`` writes it one directory up (``../plotly.min.js``:
the pages of a ``kvsim compare`` directory's runs share the comparison's one copy).
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from string import Template
from typing import Any, Iterable

from plotly.offline import get_plotlyjs

from kvsim.reports.io import write_text_atomic
from kvsim.reports.plot import Figure, figure_json
from kvsim.reports.style import fmt_num, is_number

ASSETS = Path(__file__).resolve().parent / "assets"
PLOTLY_JS_FILE = "plotly.min.js"
PLOTLYJS_MODES = ("inline", "sibling", "parent")
FIGURE_CONFIG = {"displaylogo": False, "responsive": True,
                 "toImageButtonOptions": {"format": "png", "scale": 2}}
_CONFIG_JSON = json.dumps(FIGURE_CONFIG)


def _version() -> str:
    try:
        from kvsim import __version__
        return str(__version__)
    except ImportError:  # pragma: no cover - running outside the package
        return "unknown"


def esc(value: Any) -> str:
    """HTML-escape ``str(value)``."""
    return html.escape(str(value), quote=True)


def figure_div(fig: Figure, div_id: str) -> str:
    """A figure as an HTML fragment (no plotly.js) in a div with id ``div_id``, as
    :func:`plotly.io.to_html` writes one: the layout's height, the page's width."""
    data, layout = figure_json(fig)
    height = fig.layout.get("height")
    height = f"{height}px" if height is not None else "100%"
    return (f'<div style="height:{height}; width:100%;"><div id="{div_id}" '
            'class="plotly-graph-div" style="height:100%; width:100%;"></div><script>'
            f'if (document.getElementById("{div_id}")) {{Plotly.newPlot("{div_id}", {data}, '
            f'{layout}, {_CONFIG_JSON})}}</script></div>')


def plotly_head_script(mode: str, page_path: Path) -> str:
    """The ``<script>`` that provides plotly.js for ``mode``; writes the sibling file if needed."""
    if mode not in PLOTLYJS_MODES:
        raise ValueError(f"plotlyjs must be one of {PLOTLYJS_MODES}, not {mode!r}")
    js = get_plotlyjs()
    if mode == "inline":
        return f'<script type="text/javascript">{js}</script>'
    folder, src = ((page_path.parent, PLOTLY_JS_FILE) if mode == "sibling"
                   else (page_path.parent.parent, f"../{PLOTLY_JS_FILE}"))
    shared = folder / PLOTLY_JS_FILE
    if not shared.is_file() or shared.stat().st_size != len(js.encode("utf-8")):
        write_text_atomic(shared, js)
    else:       # kept: touched, so that the --out directory counts it as this result's
        os.utime(shared)
    # a page copied without the file: say so at the top instead of drawing blank plots
    missing = ("This page loads plotly.js from the file plotly.min.js beside it, which is not "
               "there: copy or move the whole comparison folder with it." if mode == "sibling"
               else "This page loads plotly.js from ../plotly.min.js, in the comparison "
               "folder above it, which is not there: copy or move that whole folder, or "
               "re-render this run with kvsim report RUN_DIR --out FILE (which puts plotly.js "
               "inside).")
    return (f'<script type="text/javascript" src="{src}"></script>'
            '<script>window.addEventListener("DOMContentLoaded", function () {'
            'if (typeof Plotly !== "undefined") return;'
            'var p = document.createElement("p"); p.className = "note warn";'
            f'p.textContent = {json.dumps(missing)};'
            'document.body.insertBefore(p, document.body.firstChild); });</script>')


def card(label: str, value: str, sub: str = "", status: str | None = None) -> str:
    """One summary card; ``status`` ``'good'``/``'bad'`` colours its edge."""
    cls = f"card {status}" if status else "card"
    sub_html = f'<div class="sub">{esc(sub)}</div>' if sub else ""
    return (f'<div class="{cls}"><div class="label">{esc(label)}</div>'
            f'<div class="value">{esc(value)}</div>{sub_html}</div>')


def cards(items: Iterable[str]) -> str:
    """Wrap card fragments in the responsive grid."""
    return f'<div class="cards">{"".join(items)}</div>'


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """``{'a': {'b': 1}}`` → ``{'a.b': 1}``; non-dicts become ``{prefix: value}``."""
    if not isinstance(d, dict):
        return {prefix or "value": d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def fmt_setting(value: Any) -> str:
    """A setting value for display: numbers with separators, lists joined, None as ``—``."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if is_number(value):
        return fmt_num(value, digits=4) if float(value) != int(value) else f"{int(value)}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt_setting(v) for v in value) or "[]"
    return str(value)


def settings_block(config: dict | None, title: str = "All settings", open_: bool = False) -> str:
    """A collapsible grid of every (flattened) setting."""
    flat = flatten(config or {})
    if not flat:
        return '<p class="note">No settings recorded in summary.json.</p>'
    rows = "".join(f'<div><span class="k">{esc(k)}</span><span class="v">{esc(fmt_setting(v))}'
                   f"</span></div>" for k, v in sorted(flat.items()))
    return (f'<details class="settings"{" open" if open_ else ""}><summary>{esc(title)} '
            f'({len(flat)})</summary><div class="settings-grid">{rows}</div></details>')


def panel(title: str, inner: str, intro: str = "", panel_id: str | None = None) -> str:
    """A titled white section around ``inner`` HTML."""
    pid = f' id="{esc(panel_id)}"' if panel_id else ""
    intro_html = f'<p class="intro">{esc(intro)}</p>' if intro else ""
    return f'<section class="panel"{pid}><h2>{esc(title)}</h2>{intro_html}{inner}</section>'


def render_page(path: str | os.PathLike, *, title: str, header: str, body: str,
                footer: str = "", plotlyjs: str = "inline") -> Path:
    """Fill the page template and write it atomically to ``path``; returns the path."""
    page = Path(path)
    template = Template((ASSETS / "template.html").read_text(encoding="utf-8"))
    text = template.substitute(
        title=esc(title), css=(ASSETS / "report.css").read_text(encoding="utf-8"),
        head_scripts=plotly_head_script(plotlyjs, page), header=header, body=body,
        footer=footer or f"Generated by kvsim {esc(_version())}. Opens offline.",
        version=esc(_version()))
    return write_text_atomic(page, text)
