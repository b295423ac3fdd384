"""Reports people can share: plotly.js once per compare directory, --no-html wherever a report
is written, input and total token throughput beside output throughput."""

import json

import pandas as pd
import pytest
from clirun import kvsim
from plotly.offline import get_plotlyjs

GRID = ("compare", "sample:azure-conv", "--model", "llama-2-7b", "--limit", "15",
        "--eviction", "lru,lfu", "--max-num-seqs", "4,64")


def test_compare_run_pages_share_one_plotly_js(tmp_path):
    done = kvsim(*GRID, "--out", tmp_path, "-q")
    assert done.returncode == 0, done.stderr
    js = get_plotlyjs()
    assert (tmp_path / "plotly.min.js").read_text(encoding="utf-8") == js
    pages = sorted(tmp_path.glob("*/report.html"))
    assert len(pages) == 4
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert js not in text and '<script type="text/javascript" src="../plotly.min.js">' in text
    compare_page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert js not in compare_page
    assert '<script type="text/javascript" src="plotly.min.js">' in compare_page
    total = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert total < len(js.encode()) + 3_000_000        # one copy (was 5, about 25 MB)
    again = kvsim("report", pages[0].parent)          # re-rendered: shares it still
    assert again.returncode == 0, again.stderr
    text = pages[0].read_text(encoding="utf-8")
    assert js not in text and 'src="../plotly.min.js"' in text


def test_compare_no_html_writes_no_page(tmp_path):
    done = kvsim(*GRID, "--out", tmp_path, "--no-html")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == (
        f"wrote {tmp_path}/compare.json and 4 run directories")
    assert not list(tmp_path.rglob("*.html")) and not (tmp_path / "plotly.min.js").exists()


def test_compare_flags_identical_runs_instead_of_ranking_them_silently(tmp_path):
    done = kvsim(*GRID, "--out", tmp_path)
    lines = done.stdout.splitlines()
    lines = lines[lines.index("") + 1:]          # (after what every configuration shares)
    assert lines[0].split()[-2:] == ["identical", "to"]
    assert lines[4].endswith("eviction=lru max_num_seqs=4")     # lfu changed nothing
    result = json.loads((tmp_path / "compare.json").read_text())
    assert [r["identical_to"] for r in result["runs"]] == [
        None, None, "eviction=lru max_num_seqs=4", "eviction=lru max_num_seqs=64"]
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "<th class=\"label\">Identical to</th>" in page and "<td>=1</td>" in page


def test_plan_and_hitrate_take_no_html(tmp_path):
    done = kvsim("plan", "sample:azure-conv", "--model", "llama-2-7b", "--limit", "15", "--burst",
                 "--slo-ttft-p99", "5", "--max-replicas", "1", "--rate-iterations", "0",
                 "--workers", "1", "--out", tmp_path / "plan", "--no-html")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "plan").iterdir()) == ["plan.csv", "plan.json"]
    assert done.stdout.strip().splitlines()[-1] == f"wrote {tmp_path / 'plan'}/plan.json, plan.csv"
    done = kvsim("hitrate", "sample:azure-conv", "--capacity", "100", "--limit", "20",
                 "--out", tmp_path / "hr", "--no-html")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "hr").iterdir()) == ["hitrate.json"]


def test_input_and_total_token_throughput_beside_output(tmp_path):
    done = kvsim("run", "sample:azure-conv", "--model", "llama-2-7b", "--limit", "20",
                 "--out", tmp_path, "--json")
    s = json.loads(done.stdout)
    assert s["throughput_total_tokens_per_s"] == pytest.approx(
        s["throughput_input_tokens_per_s"] + s["throughput_output_tokens_per_s"])
    requests = pd.read_csv(tmp_path / "requests.csv")
    done_prompts = requests.loc[requests["completed"] == 1, "prompt_tokens"].sum()
    assert s["throughput_input_tokens_per_s"] == pytest.approx(done_prompts / s["duration_s"])
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert f"input {s['throughput_input_tokens_per_s']:,.1f} · total" in page
