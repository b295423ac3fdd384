"""trace-stats: exact numbers on small traces, and the real traces against their READMEs."""

import json
from pathlib import Path

import pytest

from kvsim.workloads import Request, TraceOptions, sample_path
from kvsim.workloads.stats import render_stats, trace_file_stats, trace_stats

SHARED = Path(__file__).resolve().parents[2] / "shared"
MOONCAKE = SHARED / "traces" / "mooncake" / "conversation_trace.jsonl"
AZURE_CONV = SHARED / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"


def native(tmp_path, *records):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_time_span_rate_and_burstiness(tmp_path):
    path = native(tmp_path, *({"arrival_s": t, "prompt_tokens": 10, "output_tokens": 2}
                              for t in (10, 11, 13)))
    stats = trace_file_stats(path)
    assert (stats["num_requests"], stats["time_span_s"], stats["mean_rate_per_s"]) == \
        (3, 3.0, 1.0)
    assert stats["burstiness_cv"] == pytest.approx(1 / 3)   # gaps 1 and 2: std 0.5, mean 1.5
    assert stats["format"] == "native" and stats["trace"] == str(path)


def test_length_summaries():
    requests = [Request(i, float(i), prompt, 1) for i, prompt in enumerate(range(1, 102))]
    stats = trace_stats(requests)
    assert stats["input_tokens"] == {"mean": 51.0, "p50": 51.0, "p90": 91.0, "p99": 100.0,
                                     "max": 101}
    assert stats["output_tokens"]["max"] == 1


def test_ideal_prefix_hit_ratio_counts_full_blocks_seen_before(tmp_path):
    path = native(
        tmp_path,
        {"arrival_s": 0, "prompt_tokens": 32, "output_tokens": 1, "block_hashes": [1, 2],
         "hash_block_size": 16},
        {"arrival_s": 1, "prompt_tokens": 32, "output_tokens": 1, "block_hashes": [1, 3],
         "hash_block_size": 16},
        {"arrival_s": 2, "prompt_tokens": 40, "output_tokens": 1, "block_hashes": [1, 2, 5],
         "hash_block_size": 16})
    stats = trace_file_stats(path, block_size=16)
    # 6 full blocks (the 8-token tail is not counted); ids 1, 1+2, 1+3: 3 distinct, 3 hits
    assert (stats["full_blocks"], stats["distinct_blocks"]) == (6, 3)
    assert stats["ideal_prefix_hit_ratio"] == 0.5
    assert stats["ideal_prefix_hit_tokens_ratio"] == pytest.approx(48 / 104)
    assert trace_file_stats(path, block_size=32)["ideal_prefix_hit_ratio"] == pytest.approx(1 / 3)


def test_traces_without_prefix_information_never_hit():
    stats = trace_file_stats(sample_path("azure-conv"), TraceOptions(limit=50))
    assert stats["ideal_prefix_hit_ratio"] == 0.0
    assert stats["full_blocks"] == stats["distinct_blocks"] > 0


def test_a_single_request_has_no_rate_or_burstiness(tmp_path):
    stats = trace_file_stats(native(tmp_path, {"prompt_tokens": 3, "output_tokens": 1}))
    assert (stats["time_span_s"], stats["mean_rate_per_s"], stats["burstiness_cv"]) == \
        (0.0, None, None)
    assert "mean rate     - req/s" in render_stats(stats)


def test_render_shows_every_number_for_people():
    text = render_stats(trace_file_stats(sample_path("mooncake"), TraceOptions(limit=20)))
    assert "requests      20" in text and "mooncake" in text and "prefix hits" in text


@pytest.mark.skipif(not MOONCAKE.exists(), reason="../shared traces not present")
def test_mooncake_trace_matches_its_readme_and_paper():
    stats = trace_file_stats(MOONCAKE, block_size=512)
    assert stats["num_requests"] == 12031
    assert stats["time_span_s"] == 3536.999
    assert stats["input_tokens"]["mean"] == pytest.approx(12035.1, abs=0.05)
    assert stats["output_tokens"]["mean"] == pytest.approx(342.6, abs=0.05)
    assert stats["input_tokens"]["max"] == 126195
    assert (stats["full_blocks"], stats["distinct_blocks"]) == (276491, 170899)
    assert stats["ideal_prefix_hit_ratio"] == pytest.approx(0.40, abs=0.03)   # paper: ~40%


@pytest.mark.skipif(not AZURE_CONV.exists(), reason="../shared traces not present")
def test_azure_conversation_trace_matches_its_readme():
    stats = trace_file_stats(AZURE_CONV)
    assert stats["num_requests"] == 19366
    assert stats["time_span_s"] == pytest.approx(3501.72, abs=0.01)
    assert stats["input_tokens"]["mean"] == pytest.approx(1154.7, abs=0.05)
    assert (stats["input_tokens"]["p50"], stats["input_tokens"]["max"]) == (1020, 14050)
    assert stats["output_tokens"]["mean"] == pytest.approx(211.1, abs=0.05)
    assert (stats["output_tokens"]["p50"], stats["output_tokens"]["max"]) == (129, 1000)
    assert stats["ideal_prefix_hit_ratio"] == 0.0
