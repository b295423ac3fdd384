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
