"""No command writes over a file it reads: an output path that is one of the command's inputs
(a run's own summary.json, a real recording, the trace being replayed or resampled) is bad
input, refused in one line before anything is written."""

import shutil
from pathlib import Path

import pytest

import kvsim as api
from clirun import kvsim

TIMED = Path(__file__).resolve().parent / "fixtures" / "vllm_timed"
REFUSED = "field '{field}': this command reads that file, and writing there would replace it: " \
          "give another path\n"


def refused(done, path, field="out"):
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"kvsim: error: {path}: " + REFUSED.format(field=field)


def test_report_does_not_write_over_the_run_it_renders(tmp_path):
    assert kvsim("run", "--limit", "3", "--out", "r", "-q", cwd=tmp_path).returncode == 0
    before = (tmp_path / "r" / "summary.json").read_text()
    refused(kvsim("report", "r", "--out", "r/summary.json", cwd=tmp_path), "r/summary.json")
    refused(kvsim("report", "r", "--out", "r/requests.csv", cwd=tmp_path), "r/requests.csv")
    assert (tmp_path / "r" / "summary.json").read_text() == before
    assert kvsim("report", "r", "--out", "r/report.html", cwd=tmp_path).returncode == 0


def test_a_fit_does_not_write_over_the_recording_or_its_trace(tmp_path):
    for name in ("timed_chat.vllm.json", "timed_chat.jsonl"):
        shutil.copy(TIMED / name, tmp_path / name)
        done = kvsim("validate-real", "timed_chat.vllm.json", "--fit", name, cwd=tmp_path)
        refused(done, name, "fit")
        assert (tmp_path / name).read_bytes() == (TIMED / name).read_bytes()


def test_gen_does_not_write_over_the_trace_it_resamples(tmp_path):
    assert kvsim("gen", "chat", "-n", "5", "--out", "g.jsonl", cwd=tmp_path).returncode == 0
    before = (tmp_path / "g.jsonl").read_text()
    for args in (("--arrival", "trace", "--arrival-trace", "g.jsonl"),
                 ("--input-len", "trace:g.jsonl"), ("--output-len", "trace:./g.jsonl")):
        refused(kvsim("gen", "chat", "-n", "5", *args, "--out", "g.jsonl", cwd=tmp_path),
                "g.jsonl")
    assert (tmp_path / "g.jsonl").read_text() == before


def test_a_run_does_not_replace_its_trace_with_its_requests(tmp_path):
    """A compare writes no requests.csv beside its compare.json (its runs have their own
    folders): the same trace there is left alone, and a second compare may follow."""
    assert kvsim("gen", "chat", "-n", "5", "--out", "d/requests.csv", cwd=tmp_path).returncode == 0
    before = (tmp_path / "d" / "requests.csv").read_text()
    refused(kvsim("run", "d/requests.csv", "--out", "d", "-q", cwd=tmp_path), "d/requests.csv")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["requests.csv"]
    for _ in range(2):
        done = kvsim("compare", "d/requests.csv", "--max-num-seqs", "4,8", "--out", "d", "-q",
                     cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "d" / "requests.csv").read_text() == before
    done = kvsim("run", "d/requests.csv", "--no-html", "--out", "r", "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (tmp_path / "r" / "report.html").mkdir()        # (a run that writes none: not in its way)
    done = kvsim("run", "d/requests.csv", "--no-html", "--out", "r", "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_the_python_api_does_not_write_a_result_over_its_trace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert kvsim("gen", "chat", "-n", "5", "--out", "d/requests.csv").returncode == 0
    before = (tmp_path / "d" / "requests.csv").read_text()
    result = api.run("d/requests.csv")
    with pytest.raises(api.KvsimError, match="^d/requests.csv: field 'out_dir': this "):
        result.write("d")
    with pytest.raises(api.KvsimError, match="^d/requests.csv: field 'path': this "):
        result.report("d/requests.csv")
    assert (tmp_path / "d" / "requests.csv").read_text() == before
