"""bench.json (vllm bench serve's result shape), the request phases of requests.csv, Parquet."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from clirun import kvsim

from kvsim.reports import frames
from kvsim.reports import io as rio
from kvsim.reports import run_outputs
from kvsim.reports.bench import ITL_NOTE, bench_result

NAN = float("nan")


def three_requests() -> pd.DataFrame:
    """A: 5 tokens generated; B: one token (no TPOT); C: rejected."""
    df = pd.DataFrame({
        "request_id": [0, 1, 2], "trace_line": [2, 3, 4], "arrival_s": [0.0, 0.5, 1.0],
        "prompt_tokens": [10, 20, 9000], "output_tokens": [5, 1, 7],
        "generated_tokens": [5, 1, 0], "finish_reason": ["stop", "stop", "rejected"],
        "priority": 0, "replica": 0, "first_scheduled_s": [0.05, 0.6, NAN],
        "first_token_s": [0.1, 0.8, NAN], "finish_s": [0.18, 0.8, NAN],
        "ttft_s": [0.1, 0.3, NAN], "tpot_s": [0.02, NAN, NAN], "e2e_s": [0.18, 0.3, NAN],
        "cached_tokens": 0, "num_preemptions": 0, "completed": [1, 1, 0],
        "rejected": [0, 0, 1], "truncated": 0})
    return frames.add_phase_columns(df)[list(frames.REQUEST_COLUMNS)]


def test_bench_fields_carry_vllms_names_and_units():
    summary = {"duration_s": 2.0, "config": {"model": "llama-2-7b", "trace": "t.jsonl"}}
    b = bench_result(summary, three_requests(), date="20260101-000000")
    assert (b["backend"], b["model_id"], b["num_prompts"]) == ("kvsim", "llama-2-7b", 3)
    assert (b["completed"], b["failed"]) == (2, 1)
    assert (b["total_input_tokens"], b["total_output_tokens"]) == (30, 6)
    assert b["request_throughput"] == 1.0 and b["output_throughput"] == 3.0
    assert b["total_token_throughput"] == 18.0
    assert b["request_rate"] == 2.0                      # 2 gaps over 1 s of arrivals
    assert b["mean_ttft_ms"] == pytest.approx(200.0)     # (100 + 300) / 2, in ms
    assert b["median_tpot_ms"] == pytest.approx(20.0)    # B has no TPOT (one token)
    assert b["mean_e2el_ms"] == pytest.approx(240.0)
    assert b["p99_itl_ms"] == pytest.approx(20.0) and b["std_itl_ms"] == pytest.approx(0.0)
    assert b["ttfts"] == [0.1, 0.3, 0.0] and b["start_times"] == [0.0, 0.5, 1.0]
    assert b["itls"] == [[0.02] * 4, [], []]
    assert b["input_lens"] == [10, 20, 9000] and b["output_lens"] == [5, 1, 0]
    assert b["errors"] == ["", "", "rejected: the prompt does not fit max_model_len"]
    assert b["kvsim"]["itls"] == ITL_NOTE and b["kvsim"]["stopped_by_length"] is None


def test_bench_json_says_how_many_completed_requests_a_real_server_would_refuse():
    """Prompt plus output past max_model_len: stopped by length in the engine, refused with
    HTTP 400 by vLLM's server; `completed` counts them, and the note says so."""
    summary = {"duration_s": 2.0, "num_stopped_by_length": 11, "config": {}}
    note = bench_result(summary, three_requests())["kvsim"]["stopped_by_length"]
    assert note == ("11 completed requests asked for more tokens than max_model_len holds "
                    "(prompt + output): stopped by length here, as in vLLM's engine, but "
                    "vLLM's server refuses such a request (HTTP 400), so a real vllm bench "
                    "serve counts it failed")


def test_phases_split_e2e_into_queue_prefill_and_decode():
    df = three_requests()
    assert df["queue_s"].tolist()[:2] == pytest.approx([0.05, 0.1])
    assert df["prefill_s"].tolist()[:2] == pytest.approx([0.05, 0.2])
    assert df["decode_s"].tolist()[:2] == pytest.approx([0.08, 0.0])
    assert np.isnan(df["queue_s"][2])                    # never scheduled


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    done = kvsim("run", "sample:azure-conv", "--model", "llama-2-7b", "--limit", "30",
                 "--out", out, "--bench-json", "-q")
    assert done.returncode == 0, done.stderr
    return out


def test_kvsim_run_bench_json_agrees_with_the_summary(bench_run):
    summary = json.loads((bench_run / "summary.json").read_text())
    bench = json.loads((bench_run / "bench.json").read_text())
    assert bench["request_throughput"] == pytest.approx(summary["request_throughput_per_s"])
    assert bench["output_throughput"] == pytest.approx(
        summary["throughput_output_tokens_per_s"])
    assert bench["median_ttft_ms"] == pytest.approx(summary["ttft_s"]["p50"] * 1000)
    assert bench["p99_e2el_ms"] == pytest.approx(summary["e2e_s"]["p99"] * 1000)
    assert len(bench["ttfts"]) == len(bench["itls"]) == 30
    assert [len(g) for g in bench["itls"]] == [max(n - 1, 0) for n in bench["output_lens"]]


def test_phases_of_a_simulated_run_sum_to_e2e(bench_run):
    df = pd.read_csv(bench_run / "requests.csv")
    assert list(df.columns) == list(frames.REQUEST_COLUMNS)
    assert (df["queue_s"] + df["prefill_s"] + df["decode_s"]).to_numpy() == pytest.approx(
        df["e2e_s"].to_numpy())
    assert (df["queue_s"] >= 0).all() and (df["prefill_s"] > 0).all()


def test_a_run_directory_from_before_the_phases_is_still_read(bench_run, tmp_path):
    for name in ("summary.json", "timeline.csv"):
        (tmp_path / name).write_bytes((bench_run / name).read_bytes())
    old = pd.read_csv(bench_run / "requests.csv").drop(columns=["queue_s", "prefill_s",
                                                                 "decode_s"])
    old.to_csv(tmp_path / "requests.csv", index=False)
    _, requests, _ = rio.read_run_outputs(tmp_path)
    assert requests["decode_s"].tolist() == pytest.approx(
        (requests["finish_s"] - requests["first_token_s"]).tolist())


def test_parquet_output_has_the_csv_columns_and_values(bench_run, tmp_path):
    pytest.importorskip("pyarrow")
    done = kvsim("run", "sample:azure-conv", "--model", "llama-2-7b", "--limit", "30",
                 "--out", tmp_path, "--output-format", "parquet", "--no-html")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "requests.parquet", "summary.json", "timeline.parquet"]
    assert done.stdout.strip().splitlines()[-1] == (
        f"wrote {tmp_path}/summary.json, requests.parquet, timeline.parquet")
    for name in ("requests", "timeline"):
        csv = pd.read_csv(bench_run / f"{name}.csv")
        parquet = pd.read_parquet(tmp_path / f"{name}.parquet")
        assert list(parquet.columns) == list(csv.columns)
        pd.testing.assert_frame_equal(parquet.drop(columns="finish_reason", errors="ignore"),
                                      csv.drop(columns="finish_reason", errors="ignore"),
                                      check_dtype=False)
    assert kvsim("report", tmp_path).returncode == 0          # re-renders from Parquet


def test_parquet_without_pyarrow_is_one_line_and_writes_nothing(tmp_path):
    code = ("import sys; sys.modules['pyarrow'] = None; sys.argv = ['kvsim', 'run', "
            f"'--limit', '5', '--out', {str(tmp_path / 'o')!r}, '--output-format', "
            "'parquet']; from kvsim.cli import main; main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == ("kvsim: error: --output-format: Parquet output needs "
                           "pyarrow: pip install 'kvsim[parquet]' (or pip install pyarrow)\n")
    assert not (tmp_path / "o").exists()


def test_where_time_goes_splits_the_completed_requests_time():
    from kvsim.reports.phases import phase_shares, time_split_figure, time_split_note
    df = three_requests()
    shares = phase_shares(df)           # queue 0.15 s, prefill 0.25 s, decode 0.08 s of 0.48 s
    assert shares == pytest.approx({"queue_s": 0.15 / 0.48, "prefill_s": 0.25 / 0.48,
                                    "decode_s": 0.08 / 0.48})
    fig = time_split_figure(df)
    assert [t["name"] for t in fig.data] == ["queueing", "prefill", "decode"]
    assert fig.layout["barmode"] == "stack"
    assert fig.layout["yaxis"]["title"]["text"].endswith("(s)")
    assert len(fig.data[0]["x"]) == len(set(fig.data[0]["x"]))    # one bar per bin


def test_where_time_goes_bins_by_arrival_time_so_bars_never_pile_up():
    from kvsim.reports.phases import arrival_bins
    bins, centres = arrival_bins(np.array([0.0, 0.0, 0.0, 1.0, 10.0]))
    assert bins.tolist() == [0, 0, 0, 0, 4]          # five bins of 2 s: [0, 2) ... [8, 10]
    assert centres.tolist() == [1.0, 3.0, 5.0, 7.0, 9.0]
    bins, centres = arrival_bins(np.array([5.0, 5.0]))   # all at once: one bin
    assert bins.tolist() == [0, 0] and centres.tolist() == [5.0]


def test_where_time_goes_note_states_the_shares():
    from kvsim.reports.phases import time_split_note
    df = three_requests()
    assert time_split_note(df).startswith(
        "Of all completed requests' end-to-end time (mean 240.0 ms): queueing 31.2%, "
        "prefill 52.1%, decode 16.7%.")


def vllm_peaks(start, ttft, itls, latency):
    """vLLM's calculate_metrics loop for max_output_tokens_per_s / max_concurrent_requests."""
    origin = min(start)
    n = int(np.ceil(max(s + e for s, e in zip(start, latency)) - origin)) + 1
    tokens, concurrent = np.zeros(n), np.zeros(n)
    for s, t, gaps, e in zip(start, ttft, itls, latency):
        times = [s + t]
        for gap in gaps:
            times.append(times[-1] + gap)
        for x in times:
            if 0 <= int(x - origin) < n:
                tokens[int(x - origin)] += 1
        for second in range(int(s - origin), int(s + e - origin) + 1):
            concurrent[second] += 1
    return float(tokens.max()), int(concurrent.max())


@pytest.mark.parametrize("seed", range(5))
def test_peak_rates_are_vllms_one_second_buckets(seed):
    from kvsim.reports.bench import itl_lists, peak_rates
    rng = np.random.default_rng(seed)
    n = 40
    arrival = np.sort(rng.integers(0, 64 * 20, n)) / 64       # (binary fractions: exact sums)
    ttft = rng.integers(1, 64 * 3, n) / 64
    out = rng.integers(1, 30, n)
    tpot = rng.integers(1, 16, n) / 64
    done = pd.DataFrame({"arrival_s": arrival, "ttft_s": ttft, "generated_tokens": out,
                         "tpot_s": np.where(out > 1, tpot, np.nan),
                         "e2e_s": ttft + (out - 1) * tpot})
    gaps, mean_gap = itl_lists(done)
    expected = vllm_peaks(arrival, ttft, [[g] * int(k) for g, k in zip(mean_gap, gaps)],
                          done["e2e_s"])
    for chunk in (1 << 22, 7):      # (one chunk, and many)
        got = peak_rates(done, gaps, mean_gap, chunk_tokens=chunk)
        assert (got["max_output_tokens_per_s"], got["max_concurrent_requests"]) == expected
