"""``kvsim report DIR``: re-render report.html from a run's files, through the real CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from kvsim.reports.io import read_run_outputs
from kvsim.reports.run_outputs import write_run_outputs
from synthetic_runs import synthetic_run


def kvsim(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("kvsim")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "kvsim.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture
def run_dir(tmp_path):
    write_run_outputs(tmp_path / "run", *synthetic_run(num_requests=200, timeline_rows=300),
                      html=False)
    return tmp_path / "run"


def test_report_round_trip(run_dir):
    before = read_run_outputs(run_dir)
    proc = kvsim("report", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    report = run_dir / "report.html"
    assert proc.stdout.strip() == f"wrote {report}"
    html = report.read_text()
    assert 'id="fig-kv-pool"' in html and "synthetic.jsonl" in html
    after = read_run_outputs(run_dir)  # inputs untouched
    assert after[0] == before[0] and after[1].equals(before[1])
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]


def test_report_out_and_json(run_dir, tmp_path):
    target = tmp_path / "elsewhere" / "r.html"
    proc = kvsim("report", str(run_dir), "--out", str(target), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result == {"report": str(target), "run_dir": str(run_dir), "num_requests": 200,
                      "num_completed": 195, "timeline_rows": 300}
    assert target.is_file() and not (run_dir / "report.html").exists()


def test_report_errors_are_one_line_exit_2(run_dir, tmp_path):
    (run_dir / "timeline.csv").unlink()
    proc = kvsim("report", str(run_dir))
    assert proc.returncode == 2
    assert proc.stderr.startswith("kvsim: error: ") and "timeline.csv" in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""
    proc = kvsim("report", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "no such run directory" in proc.stderr


def _edit_summary(run_dir, **changes) -> None:
    """Set (or, with None as the value, remove) top-level keys of run_dir's summary.json."""
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            summary.pop(key)
        else:
            summary[key] = value
    path.write_text(json.dumps(summary))


def _refused(proc, line: str) -> None:
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"kvsim: error: {line}\n")


@pytest.mark.parametrize("changes, error", [
    ({"config": 5}, "field 'config': expected an object, got 5"),
    ({"config": {}}, "field 'config.trace': missing, expected a string"),
    ({"config": {"trace": "t.jsonl", "model": "m", "gpu": 80}},
     "field 'config.gpu': expected a string, got 80"),
    ({"ttft_s": "x"}, "field 'ttft_s': expected an object, got \"x\""),
    ({"ttft_s": {"mean": 0.1, "p50": "fast", "p90": 0.2, "p99": 0.3}},
     "field 'ttft_s.p50': expected a number or null, got \"fast\""),
    ({"kv": 3}, "field 'kv': expected an object, got 3"),
    ({"kv": {"num_gpu_blocks": 64}}, "field 'kv.block_size': missing, expected an integer"),
    ({"num_requests": None}, "field 'num_requests': missing, expected an integer"),
    ({"preemptions": True}, "field 'preemptions': expected an integer, got true"),
    ({"slo": [0.5]}, "field 'slo': expected an object, got [0.5]"),
])
def test_report_refuses_a_summary_of_another_shape(run_dir, changes, error):
    _edit_summary(run_dir, **changes)
    proc = kvsim("report", str(run_dir))
    _refused(proc, f"{run_dir / 'summary.json'}: {error}")
    assert not (run_dir / "report.html").exists()


def test_report_renders_a_summary_without_its_optional_parts(run_dir):
    # as an older kvsim wrote it (no rejections, input throughput, host tier, slo), with only
    # the three settings the page names the run by, and no latencies (nothing completed)
    nulls = {"mean": None, "p50": None, "p90": None, "p99": None}
    _edit_summary(run_dir, slo=None, config={"trace": "old.jsonl", "model": "m", "gpu": "g"},
                  ttft_s=nulls, tpot_s=nulls, e2e_s=nulls)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert not {"num_rejected", "throughput_input_tokens_per_s", "tiering"} & set(summary)
    proc = kvsim("report", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "old.jsonl" in (run_dir / "report.html").read_text()


def test_report_refuses_text_in_a_column_of_numbers(run_dir):
    timeline = (run_dir / "timeline.csv").read_text().splitlines()
    header = timeline[0].split(",")
    row = timeline[3].split(",")
    row[header.index("kv_usage")] = "high"
    timeline[3] = ",".join(row)
    (run_dir / "timeline.csv").write_text("\n".join(timeline) + "\n")
    proc = kvsim("report", str(run_dir))
    _refused(proc, f"{run_dir / 'timeline.csv'}: field 'kv_usage': expected a number, "
             "got \"high\" in row 3")
    assert not (run_dir / "report.html").exists()


def test_report_of_a_file_says_it_is_not_a_directory(tmp_path):
    (tmp_path / "afile").write_text("x")
    proc = kvsim("report", str(tmp_path / "afile"))
    _refused(proc, f"{tmp_path / 'afile'}: not a directory; expected a kvsim run directory "
             "(kvsim run --out)")


def test_report_of_a_compare_directory_points_at_its_runs(tmp_path):
    (tmp_path / "compare.json").write_text('{"runs": []}')
    proc = kvsim("report", str(tmp_path))
    _refused(proc, f"{tmp_path}: holds a kvsim compare result (compare.json), not a run's: its "
             "report.html is the report; kvsim report takes one of its run directories")


def test_report_refuses_frames_cut_short(tmp_path):
    run_dir = tmp_path / "r"
    assert kvsim("run", "--limit", "3", "--out", str(run_dir), "-q").returncode == 0
    timeline = (run_dir / "timeline.csv").read_bytes()
    (run_dir / "timeline.csv").write_bytes(timeline[:-20])
    _refused(kvsim("report", str(run_dir)), f"{run_dir / 'timeline.csv'}: ends in the middle of "
             "a row: the file was cut short")
    lines = timeline.decode().splitlines(keepends=True)
    (run_dir / "timeline.csv").write_text("".join(lines[:-1]))    # (cut at a line end)
    proc = kvsim("report", str(run_dir))
    assert proc.returncode == 2 and "steps in all; summary.json counts" in proc.stderr
    (run_dir / "timeline.csv").write_bytes(timeline)
    requests = (run_dir / "requests.csv").read_text().splitlines(keepends=True)
    (run_dir / "requests.csv").write_text("".join(requests[:2]))
    _refused(kvsim("report", str(run_dir)), f"{run_dir / 'requests.csv'}: holds 1 requests; "
             "summary.json counts 3 (a file cut short, or of another run)")
