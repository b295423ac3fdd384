"""The planner's pruning (issue 15 point 6): the replica search guided by the sustainable
rate, and the same plan with and without pruning."""

from dataclasses import replace

import pytest

from kvsim.sim.plan import planner
from kvsim.sim.config import RunConfig
from kvsim.sim.plan.search import Boundary, fewest_passing
from kvsim.sim.plan.spec import DEFAULT_ROUTER, build_slo, build_spec
from kvsim.workloads import TraceOptions, sample_path


def counting(threshold):
    calls = []

    def ok(n):
        calls.append(n)
        return n >= threshold
    return ok, calls


def test_a_guess_from_above_replaces_the_first_power_of_two_beyond_it():
    """Five replicas needed, one replica sustains a fifth of the load... almost: guess 7.
    Without it the search tries 8 and 6 (two slow passing runs) before 5."""
    ok, calls = counting(5)
    assert fewest_passing(ok, 32, guess=7) == 5 and calls == [1, 2, 4, 7, 5]
    ok, calls = counting(5)
    assert fewest_passing(ok, 32) == 5 and calls == [1, 2, 4, 8, 6, 5]


def test_a_guess_from_below_costs_one_call_more_and_the_limit_still_holds():
    ok, calls = counting(5)
    assert fewest_passing(ok, 32, guess=3) == 5 and calls == [1, 2, 3, 6, 4, 5]
    ok, calls = counting(40)
    assert fewest_passing(ok, 12, guess=7) is None and calls == [1, 2, 4, 7, 12]


@pytest.mark.parametrize("guess", [None, 1, 2, 3, 5, 9, 17, 40, 99])
def test_every_guess_finds_every_threshold_with_a_failing_neighbour(guess):
    for threshold in range(1, 34):
        ok, calls = counting(threshold)
        found = fewest_passing(ok, 32, guess=guess)
        assert found == (threshold if threshold <= 32 else None)
        assert len(set(calls)) == len(calls) and all(1 <= n <= 32 for n in calls)
        if found and found > 1:
            assert found - 1 in calls


def test_replica_guess_is_the_load_over_one_replicas_sustainable_rate():
    assert planner.replica_guess(1.0, Boundary(0.25, 0.26)) == 4
    assert planner.replica_guess(1.0, Boundary(0.3, 0.31)) == 4
    assert planner.replica_guess(2.0, Boundary(4.0, 4.1)) == 1
    assert planner.replica_guess(1.0, Boundary(None, 0.01)) is None
    assert planner.replica_guess(1.0, Boundary(8.0, None)) is None


def small_spec(**kw):
    return build_spec(sample_path("azure-conv"), "sample:azure-conv",
                      TraceOptions(limit=80, rate_scale=16.0),
                      RunConfig(model="llama-3.1-8b", router=DEFAULT_ROUTER),
                      build_slo(ttft_p99_s=0.5, tpot_p99_s=0.05),
                      {"gpu": ("a100-80gb", "h100-80gb"), "tp": (1, 2)}, rate_iterations=4,
                      burst=True, **kw)


def test_pruning_gives_the_same_plan_with_fewer_engine_steps():
    """Four candidates on 80 Azure requests at 16x: with and without pruning, the same
    recommendation, replica counts, chosen points and sustainable rates; pruned, some runs
    stop early (their latencies unknown) and the candidates simulate fewer engine steps."""
    pruned = planner.plan(small_spec())
    plain = planner.plan(small_spec(prune=False))
    assert pruned["recommended"]["label"] == plain["recommended"]["label"]
    for a, b in zip(pruned["candidates"], plain["candidates"]):
        assert a["label"] == b["label"] and a["feasible"] == b["feasible"]
        assert (a["replicas"], a["latency"], a["hit_rate"]) == \
            (b["replicas"], b["latency"], b["hit_rate"])
        assert a["max_rate"] == b["max_rate"]
        assert b["num_stopped_early"] == 0
    assert sum(r["num_steps"] for r in pruned["candidates"]) < \
        sum(r["num_steps"] for r in plain["candidates"])
    stopped = [p for r in pruned["candidates"] for p in r["evaluations"] if p["stopped"]]
    assert stopped and all(not p["meets"] and p["latency"]["ttft_p99_s"] is None
                           for p in stopped)
    assert all("for certain" in p["stopped"] for p in stopped)


def test_an_infeasible_candidate_says_which_target_it_certainly_missed():
    spec = replace(small_spec(), max_replicas=1)
    row = planner.evaluate_task((spec, 0))
    assert not row["feasible"]
    assert row["reason"].startswith("SLO not met with 1 replica (--max-replicas): ")
    assert "above 500.0 ms for certain" in row["reason"] or \
        "above 50.0 ms for certain" in row["reason"]


def test_a_miss_at_the_most_replicas_names_the_counts_the_search_skipped():
    """1, 2 and 4 simulated: 3 was not (the search takes more replicas never to hurt, which
    a small trace need not obey), and the reason says so rather than 'none up to 4'."""
    point = {"replicas": 4, "stopped": "TTFT p99 above 1 s for certain"}
    assert planner._not_met(small_spec(), point, [1, 2, 4]) == (
        "SLO not met with 4 replicas (--max-replicas; also tried 1, 2; 1 count between not "
        "simulated): TTFT p99 above 1 s for certain")


def test_a_wide_rate_bracket_is_reported_as_a_range():
    from types import SimpleNamespace
    from kvsim.reports.plan_figures import max_rate_text as shown
    spec = SimpleNamespace(native_rate_per_s=4.0, num_requests=100, max_judged_scale=50.0)
    coarse = planner._max_rate(spec, Boundary(2.0, 4.0), 0)     # --rate-iterations 0
    assert coarse["note"] == ("one replica's limit lies between rate scales 2 and 4 (8.00 and "
                              "16.00 req/s): more --rate-iterations narrow it")
    assert shown({"max_rate": coarse}) == "8.00-16.00"
    fine = planner._max_rate(spec, Boundary(2.0, 2.01), 0)
    assert fine["note"] is None and shown({"max_rate": fine}) == "8.00"
