"""Atomic writers, run output files and downsampling (kvsim.reports.io)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsim.errors import KvsimError
from kvsim.reports import frames
from kvsim.reports import io as rio
from kvsim.reports.downsampling import downsample
from kvsim.reports import run_outputs
from synthetic_runs import synthetic_run


@pytest.fixture(scope="module")
def run():
    return synthetic_run(num_requests=300, timeline_rows=500, seed=1)


def _leftovers(d):
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".tmp"))


# --- atomic writers ----------------------------------------------------------------------------

def test_write_text_atomic_creates_and_replaces(tmp_path):
    target = tmp_path / "sub" / "a.txt"
    rio.write_text_atomic(target, "one")
    rio.write_text_atomic(target, "two")
    assert target.read_text() == "two"
    assert _leftovers(target.parent) == []


def test_exception_while_writing_leaves_no_target_and_no_temp(tmp_path):
    target = tmp_path / "out.txt"

    def boom(fh):
        fh.write("half of it")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        rio._atomic_write(target, boom, binary=False)
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_exception_keeps_previous_complete_file(tmp_path, monkeypatch):
    target = tmp_path / "data.csv"
    rio.write_csv_atomic(target, pd.DataFrame({"a": [1, 2]}))
    before = target.read_text()

    def failing_to_csv(self, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_csv", failing_to_csv)
    with pytest.raises(OSError):
        rio.write_csv_atomic(target, pd.DataFrame({"a": [3]}))
    assert target.read_text() == before
    assert _leftovers(tmp_path) == []


def test_failed_rename_removes_temp(tmp_path, monkeypatch):
    def no_replace(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(rio.os, "replace", no_replace)
    with pytest.raises(OSError):
        rio.write_text_atomic(tmp_path / "x.txt", "data")
    assert list(tmp_path.iterdir()) == []


def test_written_file_mode_honours_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = rio.write_text_atomic(tmp_path / "m.txt", "x")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_json_is_sorted_stable_and_nan_free(tmp_path):
    obj = {"b": np.float64(0.1) + np.float64(0.2), "a": {"z": np.int64(3), "y": float("nan")},
           "c": np.array([1.5, np.inf]), "d": (True, None)}
    path = rio.write_json_atomic(tmp_path / "s.json", obj)
    text = path.read_text()
    assert text == rio.dumps_json(obj)
    assert text.index('"a"') < text.index('"b"') < text.index('"c"')
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert data == {"a": {"y": None, "z": 3}, "b": 0.30000000000000004, "c": [1.5, None],
                    "d": [True, None]}


def test_unserialisable_json_writes_nothing(tmp_path):
    with pytest.raises(TypeError):
        rio.write_json_atomic(tmp_path / "s.json", {"x": object()})
    assert list(tmp_path.iterdir()) == []


# --- run outputs ---------------------------------------------------------------------------------

def test_csv_is_written_byte_for_byte_as_pandas_writes_it(tmp_path):
    """The column-by-column writer gives pandas' bytes (floats by repr, missing values empty,
    text quoted only where the csv module quotes it) and hands other frames to pandas."""
    df = pd.DataFrame({
        "x": [0.1, np.nan, 1e-05, 1e16, -0.0, np.inf, 2.5e-300],
        "n": np.arange(7, dtype=np.int64), "small": np.arange(7, dtype=np.uint8),
        "ok": [True, False, True, False, True, False, True],
        "text": ["plain", "a,b", 'say "hi"', None, "two\nlines", "", "cr\rstays"],
        "s": pd.array(["a", None, "b", "c", None, "d", "e"], dtype="string"),
    })
    expected = df.to_csv(index=False, lineterminator="\n")
    assert rio.csv_text(df) == expected
    assert rio.write_csv_atomic(tmp_path / "f.csv", df).read_bytes().decode() == expected
    narrow = df.assign(x=df["x"].astype(np.float32))
    assert rio.csv_text(narrow) is None          # numpy prints float32 its own way
    assert rio.csv_text(df.assign(n=pd.array([1, None] * 3 + [2], dtype="Int64"))) is None
    assert rio.csv_text(df.assign(text=[1, "a", 2, "b", 3, "c", 4])) is None
    assert rio.csv_text(df[["x"]]) is None
    written = rio.write_csv_atomic(tmp_path / "g.csv", narrow).read_bytes().decode()
    assert written == narrow.to_csv(index=False, lineterminator="\n")


def test_a_long_frame_is_written_a_chunk_of_rows_at_a_time_with_pandas_bytes(tmp_path,
                                                                            monkeypatch):
    """Three rows at a time: the same bytes; a text column that holds a number only in its
    third chunk sends the whole file to pandas, nothing of the first chunks left over."""
    monkeypatch.setattr(rio, "CSV_CHUNK_ROWS", 3)
    df = pd.DataFrame({"t": np.arange(8) / 3, "name": [f"r{i}" for i in range(8)]})
    expected = df.to_csv(index=False, lineterminator="\n")
    assert list(rio.csv_chunks(df))[1] == "0.0,r0\n0.3333333333333333,r1\n0.6666666666666666,r2\n"
    assert rio.write_csv_atomic(tmp_path / "a.csv", df).read_text() == expected
    mixed = df.assign(name=[f"r{i}" for i in range(7)] + [7])
    written = rio.write_csv_atomic(tmp_path / "b.csv", mixed).read_text()
    assert written == mixed.to_csv(index=False, lineterminator="\n")
    assert rio.csv_text(mixed) is None


def test_write_and_read_run_outputs_round_trip(tmp_path, run):
    summary, requests, timeline = run
    written = run_outputs.write_run_outputs(tmp_path, summary, requests, timeline, html=False)
    assert set(written) == {"summary", "requests", "timeline"}
    s2, r2, t2 = rio.read_run_outputs(tmp_path)
    assert s2["num_requests"] == summary["num_requests"]
    assert s2["config"] == summary["config"]
    assert list(r2.columns) == list(frames.REQUEST_COLUMNS)
    assert list(t2.columns) == list(frames.TIMELINE_COLUMNS)
    assert len(r2) == 300 and len(t2) == 500
    np.testing.assert_allclose(r2["ttft_s"], requests["ttft_s"], equal_nan=True)
    assert _leftovers(tmp_path) == []


def test_summary_is_written_last_and_stale_one_removed(tmp_path, run, monkeypatch):
    summary, requests, timeline = run
    (tmp_path / "summary.json").write_text('{"old": true}')
    order = []
    real = rio._atomic_write

    def spy(path, write, *, binary):
        order.append(os.path.basename(path))
        if os.path.basename(path) == "timeline.csv":
            raise KeyboardInterrupt  # the run is interrupted mid-way
        return real(path, write, binary=binary)

    monkeypatch.setattr(rio, "_atomic_write", spy)
    with pytest.raises(KeyboardInterrupt):
        run_outputs.write_run_outputs(tmp_path, summary, requests, timeline, html=False)
    assert not (tmp_path / "summary.json").exists()  # no stale marker of completeness
    assert order == ["requests.csv", "timeline.csv"]
    monkeypatch.setattr(rio, "_atomic_write", real)
    order.clear()
    run_outputs.write_run_outputs(tmp_path, summary, requests, timeline, html=True)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["report.html", "requests.csv", "summary.json", "timeline.csv"]


@pytest.mark.parametrize("missing", ["summary.json", "requests.csv", "timeline.csv"])
def test_read_names_the_missing_file(tmp_path, run, missing):
    run_outputs.write_run_outputs(tmp_path, *run, html=False)
    (tmp_path / missing).unlink()
    with pytest.raises(KvsimError, match=missing.replace(".", r"\.")):
        rio.read_run_outputs(tmp_path)


def test_read_reports_bad_files(tmp_path, run):
    run_outputs.write_run_outputs(tmp_path, *run, html=False)
    (tmp_path / "summary.json").write_text("{not json")
    with pytest.raises(KvsimError, match="summary.json.*not valid JSON"):
        rio.read_run_outputs(tmp_path)
    (tmp_path / "summary.json").write_text("[1, 2]")
    with pytest.raises(KvsimError, match="JSON object"):
        rio.read_run_outputs(tmp_path)
    rio.write_json_atomic(tmp_path / "summary.json", run[0])
    (tmp_path / "timeline.csv").write_text("")
    with pytest.raises(KvsimError, match="timeline.csv.*empty"):
        rio.read_run_outputs(tmp_path)
    (tmp_path / "timeline.csv").write_text("time_s,kv_usage\n0,0.5\n")
    with pytest.raises(KvsimError, match="timeline.csv.*missing columns: interval_s"):
        rio.read_run_outputs(tmp_path)
    with pytest.raises(KvsimError, match="no such run directory"):
        rio.read_run_outputs(tmp_path / "nope")


# --- downsampling --------------------------------------------------------------------------------

def test_downsample_keeps_small_frames(run):
    timeline = run[2]
    assert downsample(timeline, 1000) is timeline


def test_downsample_preserves_totals_and_recomputes_rates():
    _, _, timeline = synthetic_run(num_requests=50, timeline_rows=10_001, seed=3)
    small = downsample(timeline, 2000)
    assert len(small) <= 2000
    assert list(small.columns) == list(timeline.columns)
    for col in ("output_tokens", "preemptions", "swap_out_blocks", "num_steps",
                "prefix_hit_tokens", "prefix_queries_tokens"):
        assert small[col].sum() == pytest.approx(timeline[col].sum())
    assert small["interval_s"].sum() == pytest.approx(timeline["interval_s"].sum())
    assert small["time_s"].iloc[0] == timeline["time_s"].iloc[0]
    assert small["time_s"].is_monotonic_increasing
    np.testing.assert_allclose(small["throughput_tokens_per_s"],
                               small["output_tokens"] / small["interval_s"])
    # shares stay shares: time-weighted means of rows summing to 1 still sum to 1
    frag = small[[c for c in small.columns if c.startswith("frag_")]].sum(axis=1)
    np.testing.assert_allclose(frag, 1.0, rtol=1e-9)
    assert small["kv_usage"].max() <= timeline["kv_usage"].max() + 1e-12
    hit = small["prefix_hit_rate"].dropna()
    assert ((hit >= 0) & (hit <= 1)).all()


def test_downsample_handles_nan_and_rejects_bad_max():
    df = pd.DataFrame({"time_s": np.arange(10.0), "interval_s": 1.0,
                       "kv_usage": [np.nan] * 5 + [0.5] * 5, "preemptions": 1})
    small = downsample(df, 2)
    assert len(small) == 2
    assert np.isnan(small["kv_usage"].iloc[0]) and small["kv_usage"].iloc[1] == 0.5
    assert list(small["preemptions"]) == [5, 5]
    with pytest.raises(ValueError):
        downsample(df, 0)


def test_empty_run_round_trips_and_renders(tmp_path):
    from kvsim.reports.rerender import rerender_report
    from synthetic_runs import empty_run

    run_outputs.write_run_outputs(tmp_path, *empty_run(), html=True)
    summary, requests, timeline = rio.read_run_outputs(tmp_path)
    assert len(requests) == 0 and len(timeline) == 0 and summary["num_completed"] == 0
    result = rerender_report(tmp_path, tmp_path / "again.html")
    assert result["num_requests"] == 0 and (tmp_path / "again.html").stat().st_size > 0


def test_docs_list_exactly_the_request_columns():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "frames.md").read_text()
    section = doc.split("## requests.csv")[1].split("`")[1]
    assert [c.strip() for c in section.split(",")] == list(frames.REQUEST_COLUMNS)


def test_docs_list_exactly_the_timeline_columns_in_order():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "frames.md").read_text()
    section = doc.split("## timeline.csv")[1].split("\n## ")[0]
    named = [c for c in section.split("`")[1::2] if c.isidentifier()]
    assert list(dict.fromkeys(named)) == list(frames.TIMELINE_COLUMNS)


def test_the_request_log_holds_the_logged_columns_of_the_contract():
    from kvsim.sim.serving.recorder import REQUEST_COLUMNS as LOG_COLUMNS
    assert tuple(LOG_COLUMNS) == frames.LOGGED_REQUEST_COLUMNS
    assert set(frames.LOGGED_REQUEST_COLUMNS) | set(frames.DERIVED_REQUEST_COLUMNS) == \
        set(frames.REQUEST_COLUMNS)


def test_docs_name_every_summary_key_a_run_writes():
    import kvsim.api as api
    doc = (Path(__file__).resolve().parents[1] / "docs" / "frames.md").read_text()
    section = doc.split("## summary.json")[1].split("\n## ")[0]
    named = set(section.split("`")[1::2])
    summary = api.run("sample:mooncake", limit=5, kv_offloading_size=1).summary

    def keys(d, depth):     # (config's settings and the model's moe shape are named by kind)
        for key, value in d.items():
            yield key
            if isinstance(value, dict) and depth and key not in ("config", "moe"):
                yield from keys(value, depth - 1)
    assert sorted(set(keys(summary, 1)) - named) == []


def test_a_folder_without_a_summary_is_named_once(tmp_path):
    """`kvsim report` on an empty folder: the missing file is the location, said once (it
    read 'empty/summary.json: missing summary.json')."""
    from kvsim.errors import KvsimError
    from kvsim.reports.io import read_run_outputs, read_summary
    with pytest.raises(KvsimError) as err:
        read_summary(tmp_path / "summary.json")
    assert err.value.one_line() == (f"{tmp_path / 'summary.json'}: no such file: the run is "
                                    "incomplete or this is not a kvsim run directory")
    import kvsim
    kvsim.run(limit=3).write(tmp_path / "run")
    (tmp_path / "run" / "requests.csv").unlink()
    with pytest.raises(KvsimError) as err:
        read_run_outputs(tmp_path / "run")
    assert err.value.one_line() == (f"{tmp_path / 'run' / 'requests.csv'}: no such file: is "
                                    "this a kvsim run directory?")
