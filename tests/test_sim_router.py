"""Routers: where each arriving request goes."""

import numpy as np

from kvsim.sim.serving import results
from kvsim.sim.config import RunConfig
from executors import FixedExecutor
from kvsim.sim.serving.runner import simulate
from kvsim.workloads import Request


def sessions(n_sessions=3, turns=4, gap=5.0):
    """Each session's turns share a 256-token prefix; sessions interleave in time."""
    rng = np.random.default_rng(7)
    prefixes = [rng.integers(0, 5000, 256) for _ in range(n_sessions)]
    out, t = [], 0.0
    for turn in range(turns):
        for s in range(n_sessions):
            ids = np.concatenate([prefixes[s], rng.integers(0, 5000, 20 + turn)])
            out.append(Request(len(out), t, len(ids), 4, prompt_token_ids=ids))
            t += gap
    return out


def replicas_of(router, requests, n=3):
    config = RunConfig(model="llama-2-7b", num_gpu_blocks=400, replicas=n, router=router)
    result = simulate(requests, config, executor=FixedExecutor(0.01))
    return results.requests_frame(result), result


def test_round_robin_takes_replicas_in_turn():
    frame, _ = replicas_of("round-robin", sessions())
    assert frame["replica"].tolist() == [0, 1, 2] * 4


def test_prefix_affinity_keeps_a_session_on_the_replica_that_caches_it():
    requests = sessions()
    frame, result = replicas_of("prefix-affinity", requests)
    # first turns spread by load (ties -> lowest index, so an idle replica); later turns follow
    # their prefix (four requests on every replica, each session on one).
    by_session = frame.groupby(frame["request_id"] % 3)["replica"].nunique()
    assert by_session.tolist() == [1, 1, 1]
    assert frame["cached_tokens"].tolist()[3:] == [256] * 9


def test_round_robin_over_two_replicas_loses_half_of_those_hits():
    rr, _ = replicas_of("round-robin", sessions(), n=2)
    affinity, _ = replicas_of("prefix-affinity", sessions(), n=2)
    # a session alternates replicas under round-robin, so its second turn always misses
    assert rr["cached_tokens"].tolist()[3:6] == [0, 0, 0]
    assert rr["cached_tokens"].sum() < affinity["cached_tokens"].sum() == 9 * 256


def test_least_outstanding_prefers_the_idle_replica():
    requests = [Request(0, 0.0, 2000, 500), Request(1, 0.0, 10, 5), Request(2, 0.0, 10, 5)]
    frame, _ = replicas_of("least-outstanding-tokens", requests, n=2)
    assert frame["replica"].tolist() == [0, 1, 1]
