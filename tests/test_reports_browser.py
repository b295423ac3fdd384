"""The reports in a real browser: headless Chromium loads them offline, without console errors,
draws every expected plot with data, and paints a screenshot that is not blank.

Chromium is driven from its command line only (``--dump-dom``, ``--screenshot``): a small
script injected into a test copy of the page records errors and what each plot drew into a
``<pre id="kvsim-check">`` element, which the dumped DOM carries back. Skipped when no
Chromium is installed (``apt-get install -y chromium``).
"""

from __future__ import annotations

import html as htmllib
import json
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from kvsim.reports import render_compare_report, render_run_report
from browser import dump_dom, find_chromium, screenshot
from kvsim.reports.html import COMPARE_FIGURE_IDS, RUN_FIGURE_IDS
from synthetic_runs import synthetic_run

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="headless Chromium not installed (apt-get install -y chromium)")

PROBE = """<script>
window.__kvsimErrors = [];
window.addEventListener("error", function (e) {
  var t = e.target || {};
  window.__kvsimErrors.push("error: " + (e.message || t.src || t.href || "resource failed"));
}, true);
window.addEventListener("unhandledrejection", function (e) {
  window.__kvsimErrors.push("unhandledrejection: " + e.reason);
});
(function () {
  var orig = console.error;
  console.error = function () {
    window.__kvsimErrors.push("console.error: " + Array.prototype.join.call(arguments, " "));
    return orig.apply(console, arguments);
  };
})();
function __kvsimLen(a) { return a && typeof a.length === "number" ? a.length : 0; }
window.addEventListener("load", function () { setTimeout(function () {
  var plots = [];
  document.querySelectorAll(".plotly-graph-div").forEach(function (div) {
    var full = div._fullData || [];
    var paths = Array.prototype.filter.call(
      div.querySelectorAll("g.trace path, g.trace rect"),
      function (p) { return (p.getAttribute("d") || "").length > 4 || p.tagName === "rect"; });
    plots.push({
      id: div.id, plotted: div.classList.contains("js-plotly-plot"),
      traces: full.map(function (t) {
        return {type: t.type, x: __kvsimLen(t.x), y: __kvsimLen(t.y), visible: t.visible};
      }),
      traceGroups: div.querySelectorAll("g.trace").length, drawnPaths: paths.length
    });
  });
  var pre = document.createElement("pre");
  pre.id = "kvsim-check";
  pre.textContent = JSON.stringify({errors: window.__kvsimErrors, plots: plots,
                                    plotly: typeof window.Plotly});
  document.body.appendChild(pre);
}, 500); });
</script>"""


def probe(page: Path) -> dict:
    """Open a probed copy of ``page`` in Chromium; return what the probe recorded."""
    text = page.read_text(encoding="utf-8")
    copy = page.with_name(page.stem + ".probe.html")
    copy.write_text(text.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    dom = dump_dom(copy)
    m = re.search(r'<pre id="kvsim-check">(.*?)</pre>', dom, re.S)
    assert m, "probe did not run: page failed to load?\n" + dom[-2000:]
    return json.loads(htmllib.unescape(m.group(1)))


def assert_all_plots_drawn(result: dict, expected_ids) -> None:
    assert result["errors"] == [], result["errors"]
    assert result["plotly"] == "object"
    plots = {p["id"]: p for p in result["plots"]}
    assert list(plots) == list(expected_ids)
    for div_id, plot in plots.items():
        assert plot["plotted"], f"{div_id}: Plotly did not render"
        assert plot["traces"], f"{div_id}: no traces"
        for t in plot["traces"]:
            assert t["x"] > 0 and t["y"] > 0, f"{div_id}: empty trace {t}"
        assert plot["traceGroups"] >= len(plot["traces"]), div_id
        assert plot["drawnPaths"] > 0, f"{div_id}: nothing painted"


# --- PNG decoding (8-bit RGB/RGBA, non-interlaced: what Chromium writes), pure python ----------

def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def _unfilter_slow(ftype: int, line: bytearray, prev: bytes, bpp: int) -> None:
    for i in range(len(line)):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
        line[i] = (line[i] + ((a + b) // 2 if ftype == 3 else _paeth(a, b, c))) & 0xFF


def read_png(path: Path) -> tuple[int, int, int, list[bytes]]:
    """``(width, height, bytes_per_pixel, rows)`` of unfiltered scanlines."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    bpp = 3 if color == 2 else 4
    raw, stride, rows = zlib.decompress(idat), width * bpp, []
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        start = y * (stride + 1)
        ftype = raw[start]
        line = np.frombuffer(raw, dtype=np.uint8, count=stride, offset=start + 1).copy()
        if ftype == 1:  # Sub: running sum per channel
            line = (np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.uint64) & 0xFF)
            line = line.astype(np.uint8).ravel()
        elif ftype == 2:  # Up
            line = line + prev
        elif ftype in (3, 4):  # Average, Paeth: sequential
            buf = bytearray(line.tobytes())
            _unfilter_slow(ftype, buf, prev.tobytes(), bpp)
            line = np.frombuffer(bytes(buf), dtype=np.uint8)
        rows.append(line.tobytes())
        prev = line
    return width, height, bpp, rows


def colour_counts(path: Path) -> dict[tuple[int, int, int], int]:
    """How many sampled pixels (every 4th row and column) have each RGB colour."""
    width, height, bpp, rows = read_png(path)
    counts: dict[bytes, int] = {}
    for y in range(0, height, 4):
        row = rows[y]
        for x in range(0, width, 4):
            px = row[x * bpp:x * bpp + 3]
            counts[px] = counts.get(px, 0) + 1
    return {tuple(k): v for k, v in counts.items()}


# --- tests ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run_page(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("browser") / "report.html"
    render_run_report(*synthetic_run(num_requests=300, timeline_rows=500), path)
    return path


def test_run_report_loads_and_draws_every_plot(run_page):
    assert_all_plots_drawn(probe(run_page), RUN_FIGURE_IDS)


def test_run_report_screenshot_is_not_blank(run_page):
    png = screenshot(run_page, run_page.with_suffix(".png"), width=1400, height=2600)
    width, height, _, _ = read_png(png)
    assert (width, height) == (1400, 2600)
    counts = colour_counts(png)
    top_share = max(counts.values()) / sum(counts.values())
    assert len(counts) > 50, f"only {len(counts)} colours: blank page?"
    assert top_share < 0.9, f"one colour covers {top_share:.0%}: blank page?"
    assert counts.get((245, 247, 250), 0) > 0, "page background (CSS) not painted"
    assert counts.get((37, 99, 235), 0) > 1000, "no plot fill (#2563eb) painted"


def test_compare_report_with_sibling_plotlyjs(tmp_path):
    runs = [(f"cfg{i}", *synthetic_run(num_requests=100, timeline_rows=200, seed=i))
            for i in range(3)]
    page = render_compare_report(runs, tmp_path / "compare.html", plotlyjs="sibling")
    assert (tmp_path / "plotly.min.js").is_file()
    assert_all_plots_drawn(probe(page), COMPARE_FIGURE_IDS)


def test_probe_catches_errors(tmp_path):
    """The probe itself works: a broken page reports its error."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><head></head><body>"
                    "<script>console.error('boom'); undefinedFn();</script></body></html>")
    errors = probe(page)["errors"]
    assert any("boom" in e for e in errors) and any("undefinedFn" in e for e in errors)
