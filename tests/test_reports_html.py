"""Structure of the HTML reports (kvsim.reports.html): offline, expected figures, empty runs."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from plotly.offline import get_plotlyjs

from kvsim.reports import render_compare_report, render_hitrate_report, render_run_report
from kvsim.reports.figures import cdf_points, latency_cdf_figure, parse_slo
from kvsim.reports.html import COMPARE_FIGURE_IDS, HITRATE_FIGURE_IDS, RUN_FIGURE_IDS
from synthetic_runs import empty_run, synthetic_run

PLOTLY_JS = get_plotlyjs()


@pytest.fixture(scope="module")
def run():
    return synthetic_run(num_requests=300, timeline_rows=500, seed=0)


@pytest.fixture(scope="module")
def run_html(run, tmp_path_factory):
    path = tmp_path_factory.mktemp("run") / "report.html"
    render_run_report(*run, path)
    return path.read_text(encoding="utf-8")


def assert_offline(html: str) -> None:
    """No network: no CDN, no remote script/link/img; plotly.js present exactly once."""
    page = html.replace(PLOTLY_JS, "")  # the bundle itself mentions URLs in its own defaults
    assert "cdn.plot.ly" not in page
    assert not re.search(r"""<(script|link|img|iframe)[^>]+(src|href)\s*=\s*["']?(https?:)?//""",
                         page, re.I)


def figure_ids(html: str) -> list[str]:
    return re.findall(r'<div id="([^"]+)" class="plotly-graph-div"', html)


def figure_data(html: str, div_id: str) -> list[dict]:
    """The traces passed to Plotly.newPlot for ``div_id``."""
    m = re.search(r'Plotly\.newPlot\(\s*"' + re.escape(div_id) + r'",\s*(\[.*?\]),\s*\{', html,
                  re.S)
    assert m, div_id
    return json.loads(m.group(1))


def test_run_report_is_self_contained(run_html):
    assert run_html.count(PLOTLY_JS) == 1
    assert_offline(run_html)
    assert run_html.startswith("<!DOCTYPE html>")


def test_run_report_has_every_figure_in_order(run_html):
    assert figure_ids(run_html) == list(RUN_FIGURE_IDS)
    for div_id in RUN_FIGURE_IDS:
        traces = figure_data(run_html, div_id)
        assert traces, div_id


def test_run_report_header_lists_settings_and_cards(run, run_html):
    summary = run[0]
    for key in ("trace", "model", "gpu", "eviction", "scheduler.max_num_seqs",
                "scheduler.chunked_prefill", "kv_offloading_size"):
        assert f'<span class="k">{key}</span>' in run_html
    for label in ("Output throughput", "TTFT p50 / p99", "TPOT p50 / p99", "E2E p50 / p99",
                  "Prefix hit rate", "Preemptions", "Peak KV usage"):
        assert label in run_html
    assert "synthetic.jsonl" in run_html and "llama-3-8b" in run_html
    assert f"{summary['num_completed']} / {summary['num_requests']}" in run_html


def test_slo_lines_drawn_when_targets_given(run, tmp_path):
    path = render_run_report(*run, tmp_path / "r.html", slo={"ttft_p99_s": 0.5})
    # plotly's JSON escapes non-ASCII unless orjson is installed: accept both spellings
    html = path.read_text().replace("\\u2264", "≤")
    assert "SLO p99 ≤ 500.0 ms" in html
    assert "TPOT p99" not in html.split("SLO targets:")[1][:200]
    no_slo = run[0] | {"slo": None}
    html2 = render_run_report(no_slo, run[1], run[2], tmp_path / "n.html").read_text()
    assert "SLO p99" not in html2


def test_host_tier_shown_only_when_used(run, tmp_path):
    summary, requests, timeline = run
    html = render_run_report(summary, requests, timeline, tmp_path / "a.html").read_text()
    assert "host tier used" in html
    no_host = timeline.assign(host_used_blocks=0)
    html = render_run_report(summary, requests, no_host, tmp_path / "b.html").read_text()
    assert "host tier used" not in html


def test_large_timeline_is_downsampled(run, tmp_path):
    summary, requests, _ = run
    _, _, big = synthetic_run(num_requests=20, timeline_rows=20_000, seed=2)
    html = render_run_report(summary, requests, big, tmp_path / "big.html",
                             max_points=1000).read_text()
    assert "downsampled from 20,000 intervals" in html
    assert len(html) < len(PLOTLY_JS) + 3_000_000


def test_sibling_plotlyjs_mode(run, tmp_path):
    path = render_run_report(*run, tmp_path / "report.html", plotlyjs="sibling")
    html = path.read_text()
    assert PLOTLY_JS not in html
    assert '<script type="text/javascript" src="plotly.min.js"></script>' in html
    assert (tmp_path / "plotly.min.js").read_text() == PLOTLY_JS
    assert "cdn.plot.ly" not in html
    with pytest.raises(ValueError):
        render_run_report(*run, tmp_path / "x.html", plotlyjs="cdn")


def test_empty_run_renders(tmp_path):
    summary, requests, timeline = empty_run()
    html = render_run_report(summary, requests, timeline, tmp_path / "e.html").read_text()
    assert figure_ids(html) == list(RUN_FIGURE_IDS)
    assert "no completed requests" in html and "no timeline data" in html
    assert_offline(html)


def test_run_with_no_completed_requests_but_a_timeline(run, tmp_path):
    summary, requests, timeline = run
    none_done = requests.assign(completed=0, ttft_s=np.nan, tpot_s=np.nan, e2e_s=np.nan)
    summary = summary | {"num_completed": 0, "ttft_s": {}, "tpot_s": None}
    html = render_run_report(summary, none_done, timeline, tmp_path / "z.html").read_text()
    assert "no completed requests" in html
    assert figure_data(html, "fig-kv-pool")


def test_text_from_config_is_escaped(run, tmp_path):
    summary = run[0] | {"config": run[0]["config"] | {"trace": "<script>alert(1)</script>"}}
    html = render_run_report(summary, run[1], run[2], tmp_path / "x.html").read_text()
    assert "<script>alert(1)</script>" not in html.replace(PLOTLY_JS, "")


def test_compare_report(tmp_path):
    runs = []
    for i, eviction in enumerate(["lru", "s3fifo", "arc"]):
        s, r, t = synthetic_run(num_requests=120, timeline_rows=200, seed=10 + i)
        s["config"]["eviction"] = eviction
        runs.append((f"cfg-{eviction}", s, r, t))
    empty = empty_run()
    runs.append(("empty", *empty))
    html = render_compare_report(runs, tmp_path / "c.html").read_text()
    assert_offline(html)
    assert figure_ids(html) == list(COMPARE_FIGURE_IDS)
    table = html[html.index('id="ranked-table"'):html.index("</table>")]
    assert table.count("<tr") == 1 + len(runs)
    assert "<th class=\"label\">eviction</th>" in table  # the varying setting is a column
    best = max(runs[:3], key=lambda x: x[1]["throughput_output_tokens_per_s"])[0]
    first_row = table.split("<tbody>")[1].split("</tr>")[0]
    assert best in first_row
    scatter = figure_data(html, "fig-tradeoff")     # points numbered by rank, as the table
    by_rank = sorted(runs[:3], key=lambda x: -x[1]["throughput_output_tokens_per_s"])
    assert {t["name"] for t in scatter} == {f"{i}. {r[0]}" for i, r in enumerate(by_rank, 1)}
    assert {t["text"][0] for t in scatter} == {"1", "2", "3"}
    assert f"1. {best}" in {t["name"] for t in scatter}
    assert "· GPU <b>H100-80GB</b>" in html
    cdf = figure_data(html, "fig-latency-cdf")
    assert {t["name"] for t in cdf} == {r[0] for r in runs[:3]}


def test_hitrate_report(tmp_path):
    rows = [(p, c, 1 - np.exp(-c / (1500 * (k + 1))))
            for k, p in enumerate(["lru", "lfu", "s3fifo"]) for c in (64, 256, 1024, 4096)]
    curves = pd.DataFrame(rows, columns=["policy", "capacity_blocks", "hit_rate"])
    html = render_hitrate_report(curves, tmp_path / "h.html").read_text()
    assert_offline(html)
    assert figure_ids(html) == list(HITRATE_FIGURE_IDS)
    traces = figure_data(html, "fig-miss-ratio")
    assert sorted(t["name"] for t in traces) == ["lfu", "lru", "s3fifo"]
    assert 'id="hitrate-table"' in html
    empty = render_hitrate_report(curves.iloc[:0], tmp_path / "e.html").read_text()
    assert "no hit-rate data" in empty.lower()
    config = {"trace": "sample:mooncake", "num_requests": 300, "block_size": 16}
    html = render_hitrate_report(curves, tmp_path / "c.html", config=config).read_text()
    subtitle = re.sub("<[^>]+>", "", html.split('<p class="subtitle">')[1].split("</p>")[0])
    assert subtitle == ("trace sample:mooncake · 300 requests · 16-token blocks · 3 policies · "
                        "lru, lfu, s3fifo")      # (what ran, and the policies as asked)
    assert "<title>kvsim hit-rate curves · sample:mooncake</title>" in html
    assert 'id="belady-share-table"' not in html
    shares = curves.assign(belady_share=np.where(curves["capacity_blocks"] > 64, 0.5, np.nan))
    html = render_hitrate_report(shares, tmp_path / "b.html").read_text()
    table = html.split('id="belady-share-table"')[1].split("</table>")[0]
    assert re.findall(r"<th>([^<]+)</th>", table) == ["lru", "lfu", "s3fifo"]
    assert len(re.findall("<tr>", table)) == 4 and table.count("50.0%") == 9  # (3 capacities)


def test_cdf_points_and_slo_parsing():
    x, y = cdf_points(np.array([3.0, 1.0, 2.0]))
    assert list(x) == [1.0, 2.0, 3.0] and list(y) == pytest.approx([1 / 3, 2 / 3, 1.0])
    x, y = cdf_points(np.random.default_rng(0).random(100_000), max_points=500)
    assert len(x) == 500 and y[-1] == 1.0 and np.all(np.diff(x) >= 0)
    assert parse_slo({"ttft_p99_s": 0.5, "tpot_p90_s": 0.05, "other": 1, "e2e_p99_s": None}) \
        == [("ttft_s", 99.0, 0.5), ("tpot_s", 90.0, 0.05)]
    assert parse_slo(None) == []


def test_the_slo_line_counts_requests_that_never_completed_as_misses():
    requests = pd.DataFrame({"ttft_s": [0.5, 1.0, 4.0, np.nan], "completed": [1, 1, 1, 0]})
    fig = latency_cdf_figure([("run", requests)], {"ttft_p99_s": 2.0})
    texts = [a["text"] for a in fig.layout["annotations"] if "SLO" in a["text"]]
    assert texts == ["SLO p99 ≤ 2.00 s · 50.0% within (1 not completed count as misses)"]


def test_latency_figure_all_empty_is_a_placeholder():
    fig = latency_cdf_figure([("a", pd.DataFrame({"ttft_s": [np.nan]}))])
    assert len(fig.data) == 0
    assert "no completed requests" in fig.layout["annotations"][0]["text"]


def test_ranking_puts_slo_meeting_runs_first():
    from kvsim.reports.across_runs import rank_runs

    def fake(label, tput, ttft_p99):
        summary = {"throughput_output_tokens_per_s": tput, "ttft_s": {"p99": ttft_p99}}
        return (label, summary, pd.DataFrame(), pd.DataFrame())

    runs = [fake("fast-but-slow-tail", 2000, 2.0), fake("ok", 1000, 0.4),
            fake("better", 1500, 0.45), fake("nothing", None, None)]
    assert rank_runs(runs, {"ttft_p99_s": 0.5}) == [2, 1, 0, 3]
    assert rank_runs(runs) == [0, 2, 1, 3]  # no SLO anywhere: throughput only


def test_the_pool_line_holds_every_replicas_pool_as_the_stacked_areas_do():
    """timeline.csv sums the replicas' blocks; the dashed pool line must too (it drew one
    replica's pool under a stack eight times its height)."""
    import pandas as pd
    from kvsim.reports.figures import kv_pool_figure
    tl = pd.DataFrame({"time_s": [0.0, 1.0], "kv_used_blocks": [10, 20],
                       "kv_cached_idle_blocks": [5, 5], "kv_free_blocks": [185, 175]})
    layout = kv_pool_figure(tl, 50, replicas=4).layout
    assert [s["y0"] for s in layout["shapes"]] == [200.0]
    assert "pool 200 blocks (4 replicas x 50)" in [a.get("text") for a in layout["annotations"]]
    one = kv_pool_figure(tl, 200).layout
    assert "pool 200 blocks" in [a.get("text") for a in one["annotations"]]


def test_the_run_report_says_how_long_an_interval_is_and_mentions_slo_lines_only_with_slos(
        tmp_path):
    import kvsim
    r = kvsim.run("sample:azure-conv", limit=20)
    page = r.report(tmp_path / "r.html").read_text().replace(get_plotlyjs(), "")
    width = r.timeline["interval_s"].iloc[0]
    assert "Counts per interval of " in page and "dashed lines mark SLO" not in page
    assert width > 0
    with_slo = kvsim.run("sample:azure-conv", limit=20, slo={"ttft_p99_s": 1.0})
    page = with_slo.report(tmp_path / "s.html").read_text().replace(get_plotlyjs(), "")
    assert "dashed lines mark SLO targets." in page


def test_a_run_without_prefix_lookups_shows_no_eviction_and_no_hit_rate(tmp_path):
    """A contiguous layout shares no prefixes: its header names no eviction policy and its
    hit-rate card says there were no lookups (it showed 'eviction lru' and '0.0%, 0 of 0');
    the tab names the model and GPU (several open reports told apart)."""
    from synthetic_runs import synthetic_run
    summary, requests, timeline = synthetic_run(num_requests=20, timeline_rows=20)
    summary["config"]["layout"] = "contiguous"
    summary["prefix_cache"] = {"queries_tokens": 0, "hit_tokens": 0, "hit_rate": 0.0}
    summary["model"] = {"name": "llama-3.1-8b"}
    page = render_run_report(summary, requests, timeline, tmp_path / "r.html").read_text()
    header = re.sub("<[^>]+>", "", page[page.index("Trace <b>"):].split("</p>")[0])
    assert "eviction" not in header and header.endswith("layout contiguous")
    assert re.search(r"Prefix hit rate</div>\s*<div[^>]*>—</div>\s*<div[^>]*>no prefix lookups",
                     page)
    title = re.search("<title>([^<]*)</title>", page).group(1)
    assert title == f"kvsim · {summary['config']['trace']} · llama-3.1-8b · " \
                    f"{summary['config']['gpu']}"


def test_a_page_that_loads_plotly_from_its_folder_says_so_when_copied_without_it(tmp_path):
    """A compare's run page loads ../plotly.min.js; copied on its own it drew blank plots
    with no word of why: now a line at its top says what to copy (a script that adds it
    only when plotly.js did not load)."""
    from synthetic_runs import synthetic_run
    page = render_run_report(*synthetic_run(num_requests=20, timeline_rows=20),
                             tmp_path / "run" / "report.html", plotlyjs="parent").read_text()
    assert '<script type="text/javascript" src="../plotly.min.js"></script>' in page
    assert 'if (typeof Plotly !== "undefined") return;' in page
    assert ("This page loads plotly.js from ../plotly.min.js, in the comparison folder above "
            "it, which is not there: copy or move that whole folder, or re-render this run "
            "with kvsim report RUN_DIR --out FILE") in page
    inline = render_run_report(*synthetic_run(num_requests=20, timeline_rows=20),
                               tmp_path / "inline.html").read_text()
    assert "which is not there" not in inline
