"""The host tier on real tensors: demotions, promotions and swaps move the right KV, so a tight
GPU pool backed by a host tier generates exactly the tokens a roomy pool does."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvsim.real_backend.torch_executor import TorchExecutor  # noqa: E402
from shapes import llama  # noqa: E402
from kvsim.real_backend.backend_model import resolve_backend_model  # noqa: E402
from kvsim.real_backend.model_runner import ModelRunner  # noqa: E402
from kvsim.sim.serving import results  # noqa: E402
from kvsim.sim.config import RunConfig  # noqa: E402
from kvsim.sim.serving.runner import simulate  # noqa: E402
from kvsim.workloads import Request  # noqa: E402

SMALL = llama(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                    intermediate_size=128, vocab_size=101)
TINY_SIM = resolve_backend_model("tiny-llama").sim_model


def trace():
    """Three documents (3 blocks each) asked about twice, in rounds, with short tails."""
    rng = np.random.default_rng(5)
    out = []
    for i in range(12):
        doc = i % 3
        hashes = [100 * doc + k for k in range(3)] + [1000 + i]
        out.append(Request(i, 0.0, 48 + int(rng.integers(4, 14)), int(rng.integers(10, 40)),
                           prefix_hashes=np.array(hashes, np.int64), hash_block_size=16))
    return out


def run(requests, num_blocks, host_blocks=0, **engine):
    runner = ModelRunner.create(SMALL, num_blocks=num_blocks, block_size=16, seed=3,
                                num_host_blocks=host_blocks)
    executor = TorchExecutor(runner, requests)
    config = RunConfig(model=TINY_SIM, block_size=16, num_gpu_blocks=num_blocks,
                       num_cpu_blocks=host_blocks or None, max_num_seqs=4,
                       max_num_batched_tokens=64, max_model_len=128, **engine)
    result = simulate(requests, config, executor=executor, keep_steps=True)
    return results.steps_frame(result), executor


@pytest.mark.parametrize("engine", [dict(), dict(offload_eviction_policy="arc"),
                                    dict(offload_write="back"),
                                    dict(preemption_mode="swap", offload_write="back"),
                                    dict(offload_write="through", eviction="lfu")],
                         ids=["native", "native-arc", "write-back", "swap",
                              "write-through-lfu"])
def test_a_tight_pool_with_a_host_tier_generates_what_a_roomy_pool_does(engine):
    reqs = trace()
    _, roomy = run(reqs, 128, enable_prefix_caching=False)
    steps, tight = run(reqs, 10, host_blocks=40, **engine)
    assert steps["offload_blocks"].sum() > 0 and steps["promote_blocks"].sum() > 0
    if engine.get("preemption_mode") == "swap":
        assert steps["swap_out_blocks"].sum() > 0 and steps["swap_in_blocks"].sum() > 0
    assert tight.bytes_copied > 0
    for r in reqs:
        assert len(roomy.generated(r.request_id)) == r.output_tokens
        assert tight.generated(r.request_id) == roomy.generated(r.request_id)
