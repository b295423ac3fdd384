"""A run's frames as named numpy columns: what ``kvsim run`` builds, writes and draws without
pandas, the same bytes and pages as from DataFrames."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from kvsim.reports import io as rio
from kvsim.reports.columns import Columns, as_columns, numbers
from kvsim.reports.downsampling import downsample
from kvsim.reports.html import render_run_report
from synthetic_runs import synthetic_run


def test_columns_read_as_a_frame_does_and_share_their_arrays_with_pandas():
    t = Columns({"time_s": [0.0, 0.5, 1.0], "num_steps": np.array([2, 0, 7])})
    assert (len(t), t.columns, "num_steps" in t, "nope" in t) == (3, ["time_s", "num_steps"],
                                                                  True, False)
    assert t.rows(t["num_steps"] > 0)["time_s"].tolist() == [0.0, 1.0]
    assert t.rows(slice(1, None))["num_steps"].tolist() == [0, 7]
    df = t.to_pandas()
    assert list(df.columns) == ["time_s", "num_steps"] and df["num_steps"].dtype == np.int64
    assert np.shares_memory(df["num_steps"].to_numpy(), t["num_steps"])
    back = as_columns(df)
    assert back.columns == t.columns and back["time_s"].tolist() == [0.0, 0.5, 1.0]
    assert as_columns(t) is t
    with pytest.raises(ValueError, match="different lengths"):
        Columns({"a": [1, 2], "b": [1]})


def test_numbers_read_text_and_missing_values_as_nan():
    assert numbers(np.array([1, 2])).tolist() == [1.0, 2.0]
    read = numbers(np.array(["0.5", None, "x", 3], dtype=object))
    assert read[0] == 0.5 and read[3] == 3.0 and np.isnan(read[1]) and np.isnan(read[2])


def test_the_csv_of_columns_is_pandas_bytes():
    _, requests, timeline = synthetic_run(num_requests=40, timeline_rows=30, seed=5)
    for frame in (requests, timeline):
        expected = frame.to_csv(index=False, lineterminator="\n")
        assert rio.csv_text(as_columns(frame)) == expected


def test_downsampling_columns_gives_the_frames_numbers():
    _, _, timeline = synthetic_run(num_requests=50, timeline_rows=5_001, seed=3)
    from_frame = downsample(timeline, 500)
    from_columns = downsample(as_columns(timeline), 500)
    assert isinstance(from_frame, pd.DataFrame) and isinstance(from_columns, Columns)
    assert from_columns.columns == list(from_frame.columns)
    assert len(from_columns) == len(from_frame) == 455      # (5,001 rows 11 at a time)
    for name in from_columns.columns:
        np.testing.assert_array_equal(from_columns[name], from_frame[name].to_numpy())
    assert from_columns["num_steps"].dtype.kind == "i"      # (counts stay whole numbers)
    assert from_columns["num_steps"].sum() == timeline["num_steps"].sum()


def test_a_report_from_columns_is_the_report_from_dataframes(tmp_path):
    summary, requests, timeline = synthetic_run(num_requests=60, timeline_rows=3_000, seed=2)
    from_frames = render_run_report(summary, requests, timeline, tmp_path / "a.html")
    from_columns = render_run_report(summary, as_columns(requests), as_columns(timeline),
                                     tmp_path / "b.html")
    assert from_frames.read_bytes() == from_columns.read_bytes()


def test_kvsim_run_loads_no_pandas(tmp_path):
    """pandas (with pyarrow beside it, about a fifth of a second) is not what a run needs."""
    code = ("import sys; from kvsim.cli import main; sys.argv = ['kvsim', 'run', '--limit', "
            f"'5', '--out', {str(tmp_path / 'out')!r}, '-q']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(m for m in ('pandas', 'pyarrow') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stderr
    assert (tmp_path / "out" / "report.html").is_file()


def test_the_public_downsample_is_the_function_after_the_report_module_loads():
    code = ("import kvsim.reports.html, kvsim.reports; from kvsim.reports import downsample; "
            "from kvsim.reports.io import downsample as old_home; "
            "print(callable(downsample), old_home is downsample)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["True", "True"], done.stderr


def test_text_given_as_python_strings_is_written_without_pandas():
    t = Columns({"n": [1, 2], "name": ["a,b", "c"]})
    assert t["name"].dtype == object          # (as pandas keeps text)
    assert rio.csv_text(t) == 'n,name\n1,"a,b"\n2,c\n'


def test_a_requests_frame_without_completions_draws_its_empty_panel():
    from kvsim.reports.phases import phase_shares, time_split_figure, time_split_note
    for frame in (Columns({"x": [1, 2]}), Columns({"arrival_s": [2.0, 1.0], "x": [1, 2]})):
        assert phase_shares(frame) == {"queue_s": 0.0, "prefill_s": 0.0, "decode_s": 0.0}
        assert "no completed requests" in str(time_split_figure(frame).to_dict())
        assert "mean —" in time_split_note(frame) or "nan" not in time_split_note(frame)
