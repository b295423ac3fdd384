"""vLLM scheduler options a run can set (issue 16): chunked prefill off, the full-sequence
admission check, prefix statistics with caching off, the sampling mode; and priority
scheduling's step that only preempts."""

import json

import numpy as np
import pytest
from clirun import kvsim

from kvsim.cache import KVCacheManager
from kvsim.cache.scheduler import Scheduler, SchedulerConfig
from kvsim.cache.request_state import RequestState
from kvsim.sim.config import RunConfig
from kvsim.sim.serving import results
from kvsim.sim.serving.runner import simulate
from kvsim.workloads import Request


def first_step(prompts, caching=True, **config):
    sched = Scheduler(KVCacheManager(64, 16, enable_prefix_caching=caching),
                      SchedulerConfig(max_num_batched_tokens=100, max_model_len=1000, **config))
    for i, n in enumerate(prompts):
        ids = np.arange(n, dtype=np.int64) + 1000 * i
        sched.add(RequestState(Request(i, 0.0, n, 4, prompt_token_ids=ids), 16))
    plan = sched.schedule()
    sched.update_from_output()
    return {s.request_id: s.num_new_tokens for s in plan.scheduled}, sched


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room():
    assert first_step([60, 60])[0] == {0: 60, 1: 40}
    assert first_step([60, 60], enable_chunked_prefill=False)[0] == {0: 60}


def test_the_threshold_caps_before_the_no_chunking_check_as_in_vllm():
    got = first_step([60, 60], enable_chunked_prefill=False, long_prefill_token_threshold=30)
    assert got[0] == {0: 30, 1: 30}


def test_no_prefix_statistics_with_caching_off():
    _, on = first_step([40, 40])
    _, off = first_step([40, 40], caching=False)
    assert on.kv.prefix_stats.num_queries_tokens == 80
    assert off.kv.prefix_stats.num_queries_tokens == 0


def run(tmp_path, trace, *args):
    out = tmp_path / f"o{len(list(tmp_path.iterdir()))}"
    done = kvsim("run", trace, "--quiet", "--out", str(out), *args)
    assert done.returncode == 0, done.stderr
    return json.loads((out / "summary.json").read_text())


def test_a_run_without_chunked_prefill_needs_a_budget_for_the_longest_prompt(tmp_path):
    done = kvsim("run", "sample:azure-conv", "--limit", "20", "--no-enable-chunked-prefill",
                 "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "error: field 'max_num_batched_tokens': " in done.stderr    # (not typed)
    assert len(done.stderr.strip().splitlines()) == 1
    # a 4,096-token budget under a burst: with chunking a prompt that does not fit the budget
    # left is split; without it, it waits for a step with room for all of it (more steps,
    # later first tokens)
    busy = ("sample:azure-conv", "--limit", "60", "--max-model-len", "4096",
            "--max-num-batched-tokens", "4096", "--rate-scale", "50")
    on = run(tmp_path, *busy)
    off = run(tmp_path, *busy, "--no-enable-chunked-prefill")
    assert off["config"]["enable_chunked_prefill"] is False
    assert off["num_completed"] == on["num_completed"] == 60
    assert off["num_steps"] > on["num_steps"]
    assert off["ttft_s"]["p50"] > on["ttft_s"]["p50"]


def test_prefix_statistics_are_zero_with_caching_off(tmp_path):
    summary = run(tmp_path, "sample:mooncake", "--limit", "40", "--no-enable-prefix-caching")
    assert summary["prefix_cache"]["queries_tokens"] == 0
    assert summary["prefix_cache"]["hit_tokens"] == 0


def test_chat_hits_the_replies_it_resends(tmp_path):
    trace = tmp_path / "chat.jsonl"
    done = kvsim("gen", "chat", "--out", str(trace), "--num-requests", "150", "--seed", "1")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert any("continues" in x for x in lines)
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({k: v for k, v in x.items() if k != "continues"})
                             + "\n" for x in lines))
    linked = run(tmp_path, str(trace), "--rate-scale", "4")["prefix_cache"]
    unlinked = run(tmp_path, str(plain), "--rate-scale", "4")["prefix_cache"]
    assert linked["queries_tokens"] == unlinked["queries_tokens"]
    assert linked["hit_rate"] > unlinked["hit_rate"] + 0.05


@pytest.mark.parametrize("value", ["greedy", "random"])
def test_sampling_is_a_recorded_setting(tmp_path, value):
    summary = run(tmp_path, "sample:azure-conv", "--limit", "10", "--sampling", value)
    assert summary["config"]["sampling"] == value


def test_an_unknown_sampling_mode_is_one_line(tmp_path):
    done = kvsim("run", "--sampling", "beam", "--out", str(tmp_path / "x"))
    assert done.returncode == 2
    assert "Invalid value for '--sampling': 'beam' is not one of 'random', 'greedy'" in done.stderr


def test_a_step_that_only_preempts_takes_no_time_and_the_run_goes_on():
    """Priority scheduling on 8 blocks: request 0 (priority 1) is the first running request
    when the pool is full, and the victim its growth picks is itself, so the step schedules
    nothing and request 1 waits for the next (as vLLM's scheduler breaks there). That step
    took the run down with "no progress"; it is a step of no time with one preemption."""
    for skip_ahead in (True, False):
        requests = [Request(0, 0.0, 20, 60, priority=1), Request(1, 0.001, 20, 60, priority=0)]
        run = simulate(requests, RunConfig(model="llama-2-7b", num_gpu_blocks=8, block_size=16,
                                           max_model_len=128, scheduling_policy="priority",
                                           skip_ahead=skip_ahead), keep_steps=True)
        steps, done = results.steps_frame(run), results.requests_frame(run)
        only = steps[steps.preemptions > 0]
        assert len(only) == 1
        assert only[["duration", "scheduled_tokens", "num_running", "num_waiting",
                     "kv_used_blocks"]].values.tolist() == [[0.0, 0, 1, 1, 4]]
        assert done.num_preemptions.tolist() == [1, 0] and done.output_tokens.tolist() == [60, 60]
