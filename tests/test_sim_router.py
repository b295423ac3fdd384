"""Routers: where each arriving request goes."""

from types import SimpleNamespace

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


class FakeReplica:
    """What a router reads of a replica: its queues, its cache's hit for the request and
    the blocks its cache holds."""

    def __init__(self, running, waiting, hit, cached_blocks):
        self.scheduler = SimpleNamespace(num_running=running, num_waiting=waiting)
        pool = SimpleNamespace(num_used_blocks=cached_blocks, num_cached_free_blocks=0)
        self.kv = SimpleNamespace(lookup=lambda seq: SimpleNamespace(num_tokens=hit),
                                  pool=pool)


def choose(replicas, prompt=1000):
    from kvsim.sim.serving.router import CacheAwareRouter
    return CacheAwareRouter().choose(replicas, SimpleNamespace(num_prompt_tokens=prompt))


def test_cache_aware_follows_a_hit_over_its_threshold_else_the_emptiest_cache():
    """SGLang's cache_aware: a hit of more than 30% of the prompt wins (the longest; ties to
    the lower load); below that the replica caching least takes the request."""
    assert choose([FakeReplica(5, 0, 200, 900), FakeReplica(1, 0, 301, 900),
                   FakeReplica(0, 0, 0, 10)]) == 1
    assert choose([FakeReplica(5, 0, 400, 900), FakeReplica(2, 1, 400, 900)]) == 1
    assert choose([FakeReplica(5, 0, 300, 900), FakeReplica(0, 0, 0, 800),
                   FakeReplica(3, 0, 100, 50)]) == 2        # (300 is not over 30%)
    assert choose([FakeReplica(4, 0, 0, 0), FakeReplica(3, 0, 0, 0)]) == 1


def test_cache_aware_sends_to_the_least_loaded_replica_when_loads_are_imbalanced():
    """Imbalanced: more than 64 requests apart and more than 1.5x; then load wins over any
    hit (running and waiting both count)."""
    hot, cold = FakeReplica(60, 10, 1000, 900), FakeReplica(5, 0, 0, 0)
    assert choose([hot, cold]) == 1                     # 70 vs 5
    assert choose([FakeReplica(60, 9, 1000, 900), cold]) == 0    # 69 - 5 is not over 64
    assert choose([FakeReplica(200, 0, 1000, 900), FakeReplica(134, 0, 0, 0)]) == 0  # < 1.5x


def test_cache_aware_spreads_what_prefix_affinity_piles_on_one_replica():
    """Every request shares a 64-token system prompt, then 448 tokens of its own (12.5% of
    it in common): prefix affinity sends all of them where the system prompt is cached,
    cache-aware spreads them over the replicas that cache least, each of which then hits
    the system prompt too."""
    rng = np.random.default_rng(11)
    system = rng.integers(0, 5000, 64)
    requests = [Request(i, 0.5 * i, 512, 4, prompt_token_ids=np.concatenate(
        [system, rng.integers(0, 5000, 448)])) for i in range(12)]
    affinity, _ = replicas_of("prefix-affinity", requests)
    aware, _ = replicas_of("cache-aware", requests)
    assert affinity["replica"].tolist() == [0] * 12
    assert sorted(aware["replica"].value_counts().tolist()) == [4, 4, 4]
    assert aware["cached_tokens"].tolist() == [0, 0, 0] + [64] * 9
