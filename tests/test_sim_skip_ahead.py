"""Skipping ahead over decode-only steps must change nothing but speed."""

import numpy as np
import pytest

from kvsim.sim import results
from kvsim.sim.config import RunConfig
from kvsim.sim.runner import simulate
from kvsim.workloads import Request


def workload(n=400, seed=1, shared=True):
    """Requests with shared 64-token prefixes, varied lengths and bursty arrivals."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 1000, 64) for _ in range(4)]
    t, out = 0.0, []
    for i in range(n):
        t += float(rng.exponential(0.08))
        own = rng.integers(0, 1000, int(rng.integers(1, 600)))
        ids = np.concatenate([prefixes[i % 4], own]) if shared else own
        out.append(Request(i, t, len(ids), int(rng.integers(1, 300)), prompt_token_ids=ids,
                           priority=int(rng.integers(0, 3))))
    return out


def outputs(config, executor=None):
    r = simulate(workload(), config, executor=executor, keep_steps=True)
    steps = results.steps_frame(r)
    return r, results.requests_frame(r), steps, [kv.pool.free_queue() for kv in
                                                 (rep.kv for rep in r.replicas)]


CASES = {
    "cost-model": dict(num_gpu_blocks=900, max_num_seqs=48),
    "tight-pool-priority": dict(num_gpu_blocks=260, max_num_seqs=64,
                                scheduling_policy="priority", block_size=8),
    "two-replicas-affinity": dict(num_gpu_blocks=500, replicas=2, router="prefix-affinity"),
    "no-prefix-caching": dict(num_gpu_blocks=700, enable_prefix_caching=False, block_size=32),
    "hybrid-eviction": dict(num_gpu_blocks=300, max_num_seqs=64, eviction="hybrid"),
    "host-tier-swap": dict(num_gpu_blocks=260, max_num_seqs=64, num_cpu_blocks=400,
                           preemption_mode="swap", block_size=8),
    "host-tier-lfu": dict(num_gpu_blocks=300, max_num_seqs=64, num_cpu_blocks=200,
                          eviction="lfu"),
    "host-tier-write-through": dict(num_gpu_blocks=400, max_num_seqs=48, num_cpu_blocks=300,
                                    offload_write="through"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_skip_ahead_gives_identical_results(case):
    base = dict(model="llama-2-7b", max_num_batched_tokens=1024, **CASES[case])
    fast = outputs(RunConfig(skip_ahead=True, **base))
    slow = outputs(RunConfig(skip_ahead=False, **base))
    assert fast[0].duration_s == slow[0].duration_s
    assert fast[1].equals(slow[1])
    assert fast[2].equals(slow[2])
    assert fast[3] == slow[3]


def test_skip_ahead_actually_skips_work():
    """With a cost model the decode-only stretches are long; the lazy path must be taken."""
    config = RunConfig(model="llama-2-7b", num_gpu_blocks=2000, skip_ahead=True)
    r = simulate(workload(150), config)
    replica = r.replicas[0]
    assert replica.num_skipped_steps > len(r.steps) // 4
