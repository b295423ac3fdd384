"""Requests that do not fit max_model_len: Vidur's truncation rule, and generated tokens and
finish reasons counted as vLLM reports them."""

import numpy as np
import pytest

from kvsim.pipeline import run_outputs
from kvsim.sim.config import RunConfig
from kvsim.sim.serving.runner import simulate
from kvsim.workloads.request import Request
from kvsim.workloads.truncate import truncate, vidur_lengths


def test_vidur_takes_the_excess_from_prompt_and_output_in_proportion():
    assert vidur_lengths(10_000, 500, 8192) == (7801, 390)   # excess 2,308: 2,199 + 110
    assert vidur_lengths(100, 100, 150) == (75, 75)
    assert vidur_lengths(9000, 1, 8192) == (8191, 1)          # output keeps its one token
    assert vidur_lengths(100, 20, 500) == (100, 20)           # fits: unchanged


def test_truncation_keeps_the_first_tokens_and_their_prefix_ids():
    r = Request(0, 0.0, 1000, 100, prefix_hashes=np.arange(8), hash_block_size=128)
    assert truncate(r, 600)
    assert (r.prompt_tokens, r.output_tokens) == (545, 54)  # cuts ceil(454.5), ceil(45.5)
    assert r.prefix_hashes.tolist() == [0, 1, 2, 3, 4]        # ceil(545 / 128) blocks


def requests():
    return [Request(0, 0.0, 100, 50), Request(1, 0.0, 700, 10), Request(2, 0.0, 300, 400)]


def test_rejected_length_and_stop_are_told_apart_and_only_generated_tokens_count():
    result = simulate(requests(), RunConfig(num_gpu_blocks=64, max_model_len=512))
    summary, df, _ = run_outputs(result)
    assert df["finish_reason"].tolist() == ["stop", "rejected", "length"]
    assert df["generated_tokens"].tolist() == [50, 0, 212]     # 300 + 212 = 512
    assert df["output_tokens"].tolist() == [50, 10, 400]       # as requested
    assert (summary["num_rejected"], summary["num_stopped_by_length"]) == (1, 1)
    assert summary["throughput_output_tokens_per_s"] * summary["duration_s"] == \
        pytest.approx(262)
    tpot = df["finish_s"][2] - df["first_token_s"][2]
    assert df["tpot_s"][2] == pytest.approx(tpot / 211)


def test_truncate_runs_what_reject_refuses():
    result = simulate(requests(), RunConfig(num_gpu_blocks=64, max_model_len=512,
                                            long_prompt="truncate"))
    summary, df, _ = run_outputs(result)
    assert df["truncated"].tolist() == [0, 1, 1]
    assert df["finish_reason"].tolist() == ["stop", "stop", "stop"]
    assert summary["num_rejected"] == 0 and summary["num_truncated"] == 2
