"""The planner against the simulator, on small slices of the bundled traces."""

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvsim import pipeline
from kvsim.errors import ConfigError, WorkerLost
from kvsim.sim.plan import planner
from kvsim.sim.config import RunConfig
from kvsim.sim.plan.bounds import latency_floors
from kvsim.sim.plan.spec import DEFAULT_ROUTER, build_slo, build_spec
from kvsim.sim.serving.results import requests_frame
from kvsim.sim.serving.runner import simulate
from kvsim.sim.plan.sweep import SweepOptions, run_tasks
from kvsim.workloads import TraceOptions, load_trace, sample_path

AZURE = sample_path("azure-conv")
MODEL = "llama-3.1-8b"


def make_spec(slo, gpus=("a100-80gb",), tps=(1,), limit=60, rate_scale=16.0, **kw):
    """A plan of the first ``limit`` Azure requests at ``rate_scale``, as one burst (seconds
    of arrivals: the search stories need no sustained load)."""
    kw.setdefault("burst", True)
    return build_spec(AZURE, "sample:azure-conv", TraceOptions(limit=limit,
                      rate_scale=rate_scale), RunConfig(model=MODEL, router=DEFAULT_ROUTER),
                      build_slo(**slo), {"gpu": gpus, "tp": tps}, **kw)


def test_more_replicas_never_raise_p99_latency():
    """With the planner's load-aware router, on 300 Azure requests at 8x: every p99 falls as
    replicas are added. (A p99 of few requests hinges on which replica the longest prompts
    share: round-robin routing breaks this by up to 25% on 60 requests, hence the planner's
    least-outstanding-tokens router. Once nothing queues, a p99 is the slowest prefill alone
    and moves only with the tokens co-batched beside it, which more replicas can reshuffle
    within 0.5%: with GEMMs timed by their tile waves, TTFT p99 is 0.3165 s at 5 replicas and
    0.3173 s at 6.)"""
    spec = make_spec({"ttft_p99_s": 1.0}, limit=300, rate_scale=8.0)
    points = [planner.measure_point(spec, replace(spec.candidates[0], replicas=n), 8.0)
              for n in range(1, 8)]
    for key in ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s"):
        values = [p["latency"][key] for p in points]
        assert all(b <= a * 1.005 for a, b in zip(values, values[1:])), (key, values)
        assert values[-1] < values[0] / 2, (key, values)


def test_a_looser_slo_never_needs_more_gpus():
    tight = planner.plan(make_spec({"ttft_p99_s": 0.4, "tpot_p99_s": 0.04}, tps=(1, 2)))
    loose = planner.plan(make_spec({"ttft_p99_s": 1.2, "tpot_p99_s": 0.2}, tps=(1, 2)))
    by_index = {r["index"]: r for r in loose["candidates"]}
    for row in tight["candidates"]:
        assert row["feasible"]
        assert by_index[row["index"]]["gpus"] <= row["gpus"]
    assert loose["recommended"]["gpus"] <= tight["recommended"]["gpus"]
    assert loose["recommended"]["gpus"] < tight["recommended"]["gpus"]


def test_the_chosen_configuration_rerun_with_kvsim_run_meets_the_slos(tmp_path):
    slo = {"ttft_p99_s": 0.5, "tpot_p99_s": 0.05}
    spec = make_spec(slo)
    best = planner.plan(spec)["recommended"]
    assert best["replicas"] > 1 and best["gpus"] == best["replicas"]
    config = RunConfig.from_dict(best["run_config"])
    summary = pipeline.run_job(pipeline.RunJob(config, Path(AZURE), spec.trace_options,
                                               tmp_path / "run", slo, html=False))
    assert summary["num_completed"] == summary["num_requests"] == 60
    assert summary["ttft_s"]["p99"] <= 0.5 and summary["tpot_s"]["p99"] <= 0.05
    assert summary["ttft_s"]["p99"] == pytest.approx(best["latency"]["ttft_p99_s"], abs=0)
    fewer = pipeline.run_job(pipeline.RunJob(replace(config, replicas=best["replicas"] - 1),
                                             Path(AZURE),
                                             spec.trace_options, tmp_path / "fewer", slo,
                                             html=False))
    assert fewer["ttft_s"]["p99"] > 0.5 or fewer["tpot_s"]["p99"] > 0.05


def test_an_impossible_slo_says_why():
    result = planner.plan(make_spec({"ttft_p99_s": 0.01}, limit=30))
    assert result["recommended"] is None
    row = result["candidates"][0]
    assert not row["feasible"] and row["evaluations"] == []
    assert "TTFT p99 can never meet 10.0 ms" in row["reason"]
    assert "prefill alone" in row["reason"]
    assert row["latency_floor"]["ttft_p99_s"] > 0.01


def test_a_model_that_does_not_fit_says_why():
    spec = build_spec(AZURE, "sample:azure-conv", TraceOptions(limit=20),
                      RunConfig(model="llama-3-70b"), build_slo(ttft_p99_s=5.0),
                      {"gpu": ("l4",), "tp": (1,)}, burst=True)
    row = planner.plan(spec)["candidates"][0]
    assert not row["feasible"]
    assert "does not fit on l4 with tp=1" in row["reason"]


@pytest.mark.parametrize("name,limit", [("azure-conv", 60), ("mooncake", 30)])
def test_latency_floors_bound_every_simulated_request(name, limit):
    config = RunConfig(model=MODEL, gpu="h100-80gb")
    requests = list(load_trace(sample_path(name), TraceOptions(limit=limit)))
    floors = latency_floors(requests, config, 10**9)
    df = requests_frame(simulate(iter(requests), config))
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        sim, low = df[metric].to_numpy(), floors[metric]
        ok = ~np.isnan(low)
        assert np.all(sim[ok] >= low[ok] * (1 - 1e-9)), metric


def test_latency_floors_count_the_replies_a_conversation_resends(tmp_path):
    """A chat turn resends the previous turns' replies: the cache can serve them, so the
    floors count them as cached (they assumed the earlier prompts alone, and the floor of a
    turn then exceeded its simulated TTFT: the cheapest GPU was ruled out)."""
    from kvsim.workloads.generators import GenConfig, write_workload
    path = tmp_path / "chat.jsonl"
    write_workload("chat", path, GenConfig(num_requests=100, seed=1))
    config = RunConfig(model=MODEL, gpu="l4")
    requests = list(load_trace(path, TraceOptions(rate_scale=0.05)))
    floors = latency_floors(requests, config, 10**9)
    df = requests_frame(simulate(iter(requests), config))
    sim, low = df["ttft_s"].to_numpy(), floors["ttft_s"]
    assert np.all(sim >= low * (1 - 1e-9))
    assert (floors["cached_tokens"] > 0).mean() > 0.5


def test_the_sustainable_rate_passes_and_the_next_rate_fails():
    spec = make_spec({"ttft_p99_s": 0.5, "tpot_p99_s": 0.05}, limit=40, rate_iterations=4)
    row = planner.evaluate_task((spec, 0))
    found = row["max_rate"]
    assert found["failing_rate_scale"] / found["rate_scale"] == pytest.approx(2 ** (1 / 16))
    one = spec.candidates[0]
    assert planner.measure_point(spec, one, found["rate_scale"])["meets"]
    assert not planner.measure_point(spec, one, found["failing_rate_scale"])["meets"]
    assert found["request_rate_per_s"] == pytest.approx(
        found["rate_scale"] * spec.native_rate_per_s)


def test_the_process_pool_gives_the_serial_result_in_candidate_order():
    spec = make_spec({"ttft_p99_s": 0.5}, gpus=("h100-80gb", "a100-80gb"), limit=30)
    assert planner.plan(spec, SweepOptions(workers=2)) == planner.plan(spec)


def test_a_worker_that_dies_is_one_error_naming_the_likely_causes():
    """A worker ending without its result (here: ``os._exit``; killed, out of memory, or a
    script without a main guard re-run by spawn) stops the others and says so."""
    with pytest.raises(WorkerLost, match="^a worker process ended without its result "
                                         r"\(killed, or out of memory; a Python script that "
                                         "starts workers must call kvsim under `if __name__") as lost:
        run_tasks(os._exit, [3, 3], SweepOptions(workers=2))
    assert not isinstance(lost.value, ValueError)   # (a caller's `except ValueError` for bad
                                                    # settings does not swallow it)


def write_native(path, n=24, gap=0.5, burst=1):
    """``n`` requests of 2,048 prompt tokens whose first half is a shared system prompt;
    ``burst`` of them per arrival time."""
    lines = [json.dumps({"arrival_s": (i // burst) * gap, "prompt_tokens": 2048,
                         "output_tokens": 64, "hash_block_size": 64,
                         "block_hashes": list(range(16)) + [1000 * (i + 1) + j
                                                            for j in range(16)]})
             for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def native_spec(path, **slo):
    return build_spec(path, str(path), TraceOptions(), RunConfig(model=MODEL,
                      router=DEFAULT_ROUTER), build_slo(**slo), {"gpu": ("h100-80gb",)},
                      burst=True)


def test_a_native_trace_plans_with_prefix_hits_and_a_sustainable_rate(tmp_path):
    spec = native_spec(write_native(tmp_path / "t.jsonl"), ttft_p99_s=0.2, tpot_p99_s=0.05)
    row = planner.plan(spec)["recommended"]
    assert row["replicas"] == 1 and row["hit_rate"] > 0.4
    found = row["max_rate"]
    assert 1 < found["rate_scale"] < found["failing_rate_scale"] and found["note"] is None


def test_simultaneous_arrivals_are_named_when_no_rate_is_sustainable(tmp_path):
    spec = native_spec(write_native(tmp_path / "t.jsonl", n=40, burst=40), ttft_p99_s=0.1)
    row = planner.plan(spec)["candidates"][0]
    assert row["max_rate"]["rate_scale"] is None
    assert "39 of 40 requests arrive together" in row["max_rate"]["note"]


def test_a_sustained_plan_judges_no_rate_its_trace_is_too_short_for():
    """100 requests arrive over 42.7 s at rate scale 1. A 10% overload delays the request at
    the 99th percentile of the span by 0.1 x 0.99 of it, so judging TTFT p99 <= 2 s needs
    20.2 s of arrivals: rate scale 2.11 (4.95 req/s) at most, where one H100 still passes."""
    spec = build_spec(AZURE, "sample:azure-conv", TraceOptions(limit=100),
                      RunConfig(model=MODEL, router=DEFAULT_ROUTER), build_slo(ttft_p99_s=2.0),
                      {"gpu": ("h100-80gb",)}, rate_iterations=1)
    span = spec.num_requests / spec.native_rate_per_s
    assert spec.max_judged_scale == pytest.approx(span / (10 * 2.0 / 0.99))
    found = planner.plan(spec)["candidates"][0]["max_rate"]
    assert found["rate_scale"] == spec.max_judged_scale and found["failing_rate_scale"] is None
    assert found["note"].endswith("its limit lies beyond, where the trace's arrivals are too "
                                  "short for a 10% overload to show against the TTFT/E2E "
                                  "targets (a longer trace can tell)")
    with pytest.raises(ConfigError) as refused:
        build_spec(AZURE, "sample:azure-conv", TraceOptions(limit=100,
                   rate_scale=spec.max_judged_scale * 1.01), RunConfig(model=MODEL),
                   build_slo(ttft_p99_s=2.0), {})
    assert str(refused.value) == (
        "sample:azure-conv: field 'rate_scale': at 5 req/s (rate scale 2.134) the trace's 100 "
        "requests arrive within 20 s, too short for a 10% overload to show against the "
        "TTFT/E2E targets (a burst that ends in time passes): judging TTFT p99 <= 2 s as a "
        "sustained load needs 20.2 s of arrivals. Give at least 102 requests (raise --limit / "
        "limit=, or a longer trace), plan for at most 4.95 req/s (rate scale 2.11), or plan these "
        "arrivals as one burst (--burst; burst=True in Python)")
    as_burst = build_spec(AZURE, "sample:azure-conv", TraceOptions(limit=100, rate_scale=50.0),
                          RunConfig(model=MODEL), build_slo(ttft_p99_s=2.0), {}, burst=True)
    assert as_burst.max_judged_scale == math.inf


def test_the_rate_a_refusal_suggests_is_accepted_and_a_median_target_needs_longer():
    base = dict(trace_path=AZURE, trace_label="sample:azure-conv", base=RunConfig(model=MODEL),
                dims={})
    with pytest.raises(ConfigError, match="plan for at most 42.4 req/s"):
        build_spec(opts=TraceOptions(limit=300), slo=build_slo(ttft_p99_s=0.7),
                   target_rate=500, **base)
    assert build_spec(opts=TraceOptions(limit=300), slo=build_slo(ttft_p99_s=0.7),
                      target_rate=42.4, **base).request_rate_per_s == pytest.approx(42.4)
    p99 = build_spec(opts=TraceOptions(limit=300), slo=build_slo(ttft_p99_s=1.0), **base)
    p50 = build_spec(opts=TraceOptions(limit=300), slo=build_slo(ttft_p50_s=1.0), **base)
    assert p99.max_judged_scale / p50.max_judged_scale == pytest.approx(99 / 50)
    tpot = build_spec(opts=TraceOptions(limit=300), slo=build_slo(tpot_p99_s=0.1), **base)
    assert tpot.max_judged_scale == math.inf        # (a TPOT target sees no queue)
    edge = build_spec(opts=TraceOptions(limit=60), slo=build_slo(ttft_p99_s=2.0),
                      target_rate=2.97, max_replicas=1, rate_iterations=0, **base)
    assert edge.trace_options.rate_scale > edge.max_judged_scale       # (by a rounding)
    row = planner.plan(edge)["candidates"][0]       # (the search starts at the load: no error)
    assert row["max_rate"]["rate_scale"] == edge.trace_options.rate_scale


def test_a_target_rate_sets_the_rate_scale(tmp_path):
    path = write_native(tmp_path / "t.jsonl", n=11, gap=1.0)
    spec = build_spec(path, "t", TraceOptions(), RunConfig(), build_slo(ttft_p99_s=1.0), {},
                      target_rate=5.5, burst=True)
    assert spec.native_rate_per_s == pytest.approx(11 / 10)
    assert spec.trace_options.rate_scale == pytest.approx(5.0)
    assert spec.request_rate_per_s == pytest.approx(5.5)


def test_the_block_size_lines_say_what_was_swept_and_whether_the_l2_rule_binds():
    """One size swept is said as such, with how to sweep more (it read 'best in sweep 16
    (swept 16)'); the L2 rule's bound is said to bind only below a size swept."""
    from kvsim.reports.plan import block_size_lines
    advice = {"gpu": "a100-40gb", "tp": 4, "l2_cache_bytes": 41_943_040,
              "kv_bytes_per_token_per_layer": 1_024, "tokens": 40_960.0,
              "power_of_two": 32_768, "best_block_size": 16, "swept_block_sizes": [16]}
    rule = ("the L2 rule of thumb (not simulated: the tokens whose K and V of one layer fill "
            "the L2 cache at tp 4, 41,943,040 B / 1,024 B) allows up to 32,768 tokens")
    assert block_size_lines({"block_size": [advice]}) == [
        "block size on a100-40gb: 16 tokens, the only size tried (--block-size 16,32 compares "
        f"sizes); {rule}, so it does not bind"]
    advice.update(best_block_size=None, swept_block_sizes=[16, 65_536])
    assert block_size_lines({"block_size": [advice]}) == [
        f"block size on a100-40gb: none meets the SLOs (swept 16, 65536); {rule}, below the "
        "largest size swept (65,536)"]
