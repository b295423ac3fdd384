"""TorchExecutor: trace requests become tokens, step plans become real forward passes and
block copies, and the SimPy loop runs unchanged on measured time."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvsim.cache.step_plan import SWAP_IN, SWAP_OUT, BlockTransfer, StepPlan  # noqa: E402
from kvsim.errors import ConfigError  # noqa: E402
from kvsim.real_backend.torch_executor import TorchExecutor  # noqa: E402
from shapes import llama  # noqa: E402
from kvsim.real_backend.backend_model import resolve_backend_model  # noqa: E402
from kvsim.real_backend.model_runner import ModelRunner  # noqa: E402
from kvsim.real_backend.tokens import token_ids_for  # noqa: E402
from kvsim.sim.config import RunConfig  # noqa: E402
from kvsim.sim.serving.runner import simulate  # noqa: E402
from kvsim.workloads import Request  # noqa: E402

TINY = resolve_backend_model("tiny-llama")
SMALL = llama(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                    intermediate_size=128, vocab_size=101)


def hashed(rid, hashes, prompt, output=4, arrival=0.0):
    return Request(rid, arrival, prompt, output, prefix_hashes=np.array(hashes, np.int64),
                   hash_block_size=16)


# --- tokens ---------------------------------------------------------------------------------

def test_requests_sharing_a_prefix_share_its_tokens_and_nothing_more():
    a = hashed(0, [11, 12, 13], 40)
    b = hashed(1, [11, 12, 99], 45)
    ta, tb = token_ids_for(a, 16, 1000), token_ids_for(b, 16, 1000)
    assert len(ta) == 40 and len(tb) == 45
    assert np.array_equal(ta[:32], tb[:32])          # two shared 16-token blocks
    assert not np.array_equal(ta[32:40], tb[32:40])  # the third block differs
    assert ta.min() >= 0 and ta.max() < 1000
    assert np.array_equal(ta, token_ids_for(a, 16, 1000))   # deterministic


def test_partial_tail_is_unique_and_token_ids_pass_through():
    a, b = hashed(0, [5], 20), hashed(1, [5], 20)
    ta, tb = token_ids_for(a, 16, 1000), token_ids_for(b, 16, 1000)
    assert np.array_equal(ta[:16], tb[:16]) and not np.array_equal(ta[16:], tb[16:])
    given = Request(2, 0.0, 3, 1, prompt_token_ids=np.array([7, 1005, 3]))
    assert token_ids_for(given, 16, 1000).tolist() == [7, 5, 3]


# --- models ---------------------------------------------------------------------------------

def test_catalog_and_bundled_models_map_to_llama_configs():
    assert TINY.llama_config().hidden_size == 256 and TINY.spec.num_layers == 2
    cfg = resolve_backend_model("llama-3.1-8b").llama_config()
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (32, 32, 8, 128)


@pytest.mark.parametrize("name", ["qwen2.5-7b", "opt-13b"])
def test_non_llama_architectures_are_refused(name):
    with pytest.raises(ConfigError, match="Llama-like"):
        resolve_backend_model(name)


# --- executing plans ------------------------------------------------------------------------

def run_trace(requests, num_blocks, **engine):
    runner = ModelRunner.create(SMALL, num_blocks=num_blocks, block_size=16, seed=3)
    executor = TorchExecutor(runner, requests)
    config = RunConfig(model=TINY.sim_model, block_size=16, num_gpu_blocks=num_blocks,
                       max_num_seqs=8, max_num_batched_tokens=64, **engine)
    return simulate(requests, config, executor=executor, keep_steps=True), executor


def trace(n=6):
    rng = np.random.default_rng(1)
    return [hashed(i, [1, 2, 3 + i % 2], int(rng.integers(20, 60)), int(rng.integers(3, 12)))
            for i in range(n)]


def test_outputs_do_not_depend_on_paging_sharing_or_preemption():
    """The same requests in a roomy pool and in a pool so small that requests are preempted
    and recomputed generate the same tokens: every step read exactly the right KV."""
    reqs = trace()
    roomy, ex_roomy = run_trace(reqs, 64, enable_prefix_caching=False)
    tight, ex_tight = run_trace(reqs, 8)
    assert tight.replicas[0].scheduler.num_preemptions > 0
    assert tight.replicas[0].kv.prefix_stats.num_hit_tokens > 0
    for r in reqs:
        assert len(ex_roomy.generated(r.request_id)) == r.output_tokens
        assert ex_tight.generated(r.request_id) == ex_roomy.generated(r.request_id)


def test_every_step_runs_for_real():
    reqs = trace(3)
    result, executor = run_trace(reqs, 64)
    assert not executor.supports_decode_runs   # no skip-ahead: every step really runs
    assert executor.num_steps == len(result.steps) > 0
    durations = result.steps.columns["duration"]
    assert (durations > 0).all() and result.duration_s == pytest.approx(durations.sum())


def test_transfers_are_real_copies_before_the_forward():
    runner = ModelRunner.create(SMALL, num_blocks=4, block_size=16, num_host_blocks=2)
    runner.kv_store.device_kv[:, :, 1].fill_(2.5)
    ex = TorchExecutor(runner, [], repeats=2)
    ex.step_duration(StepPlan(transfers=[BlockTransfer(SWAP_OUT, [(1, 0)])]))
    assert torch.all(runner.kv_store.host_kv[:, :, 0] == 2.5)
    ex.step_duration(StepPlan(transfers=[BlockTransfer(SWAP_IN, [(0, 3)])]))
    assert torch.all(runner.kv_store.device_kv[:, :, 3] == 2.5)
    assert ex.bytes_copied == 2 * runner.kv_store.bytes_per_block


def test_bad_clock_and_repeats_are_refused():
    runner = ModelRunner.create(SMALL, num_blocks=2, block_size=16)
    with pytest.raises(ValueError, match="clock"):
        TorchExecutor(runner, [], clock="sundial")
    with pytest.raises(ValueError, match="repeats"):
        TorchExecutor(runner, [], repeats=0)

