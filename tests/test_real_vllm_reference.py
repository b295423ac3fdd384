"""The real backend replays a vllm-oracle fixture step for step and reports its step time next
to vLLM's (the full comparison: ``python -m kvsim.real_backend.vllm_reference``)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from kvsim.real_backend.session import BackendSettings  # noqa: E402
from kvsim.real_backend.vllm_reference import FIXTURES, render, replay  # noqa: E402


def test_shared_prefix_fixture_runs_vllms_steps_on_the_tiny_llama():
    row = replay(FIXTURES / "shared_prefix.jsonl", BackendSettings(clock="cpu"))
    assert row["steps"] == row["vllm_steps"] == 90
    assert 0 < row["kvsim_mean_executor_step_s"] <= row["kvsim_mean_iteration_cpu_s"] * 1.5
    assert "shared_prefix" in render([row])


def test_fixtures_of_other_models_are_not_timed_on_the_tiny_llama():
    from kvsim.real_backend.vllm_reference import on_tiny_llama

    assert on_tiny_llama(FIXTURES / "shared_prefix.jsonl")
    assert not on_tiny_llama(FIXTURES / "sliding_window_hybrid.jsonl")
