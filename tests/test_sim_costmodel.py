"""The cost model: monotone, TP helps big batches, transfers by bandwidth, and the decode fast
path equal bit for bit to stepping one plan at a time."""

import json
import math
import re

import numpy as np
import pytest

from kvsim.cache.step_plan import BlockTransfer, ScheduledRequest, StepPlan
from kvsim.errors import ConfigError
from kvsim.sim.perf.cost_model import CostModel


def decode_plan(contexts):
    return StepPlan([ScheduledRequest(i, 1, c) for i, c in enumerate(contexts)])


def prefill_plan(q, computed=0):
    return StepPlan([ScheduledRequest(0, q, computed)])


@pytest.fixture(scope="module")
def a100():
    return CostModel("llama-2-7b", "a100-80gb", tp=1, block_size=16)


def test_more_prefill_tokens_never_faster(a100):
    times = [a100.step_duration(prefill_plan(q, 100)) for q in range(1, 4097, 7)]
    assert all(b >= a for a, b in zip(times, times[1:]))
    assert times[-1] > 10 * times[0]


def test_more_sequences_and_longer_context_never_faster(a100):
    by_batch = [a100.step_duration(decode_plan([500] * n)) for n in range(1, 300, 3)]
    by_ctx = [a100.step_duration(decode_plan([c] * 8)) for c in range(0, 4000, 37)]
    for seq in (by_batch, by_ctx):
        assert all(b >= a for a, b in zip(seq, seq[1:]))


def test_chunk_of_two_tokens_is_not_cheaper_than_decode_of_one(a100):
    # attention is a roofline over the batch: a 2-token chunk still reads the whole context.
    assert a100.step_duration(prefill_plan(2, 3000)) >= a100.step_duration(prefill_plan(1, 3000))


def test_adding_a_request_never_makes_a_step_faster(a100):
    rng = np.random.default_rng(0)
    for _ in range(200):
        reqs = [ScheduledRequest(i, int(rng.integers(1, 300)), int(rng.integers(0, 3000)))
                for i in range(int(rng.integers(1, 20)))]
        extra = ScheduledRequest(99, int(rng.integers(1, 300)), int(rng.integers(0, 3000)))
        assert a100.step_duration(StepPlan(reqs + [extra])) >= a100.step_duration(StepPlan(reqs))


def test_single_decode_step_of_llama_2_7b_is_bound_by_weight_reads(a100):
    # 13.5 GB of weights at 2.039 TB/s * 0.80 is 8.2 ms; with per-kernel latencies and step
    # overhead a batch-1 decode lands between 8 and 14 ms (vLLM measures ~7-12 ms).
    assert 0.008 < a100.step_duration(decode_plan([100])) < 0.014


def test_tensor_parallelism_shortens_big_steps():
    big_prefill, big_decode = prefill_plan(4096), decode_plan([2000] * 128)
    for plan in (big_prefill, big_decode):
        times = [CostModel("llama-3-70b", "h100-80gb", tp=tp).step_duration(plan)
                 for tp in (2, 4, 8)]
        assert times[0] > times[1] > times[2]
    t1 = CostModel("llama-2-7b", "a100-80gb", tp=1).step_duration(big_prefill)
    t2 = CostModel("llama-2-7b", "a100-80gb", tp=2).step_duration(big_prefill)
    assert t2 < 0.6 * t1


def test_all_reduce_costs_appear_only_with_tp(a100):
    tp2 = CostModel("llama-2-7b", "a100-80gb", tp=2)
    # tp=2 measured: 45 us latency, 172 GB/s bus bandwidth; 2 all-reduces per layer, 32 layers
    # of 4096 tokens * 4096 hidden * 2 bytes each: ring factor 2(2-1)/2 = 1.
    per_token = 2 * 32 * 4096 * 2 * 1.0 / 1.72e11
    assert tp2._c.ar_tok_s == pytest.approx(per_token)
    assert a100._c.ar_tok_s == 0.0


def test_swap_time_is_blocks_over_pcie(a100):
    # 100 blocks of 16 tokens * 524,288 B = 838,860,800 B over 32 GB/s * 0.8 = 32.77 ms,
    # plus the 1 ms step overhead (no forward pass in this step).
    plan = StepPlan([], transfers=[BlockTransfer("swap_out", [(i, i) for i in range(60)]),
                                   BlockTransfer("promote", [(i, i) for i in range(40)])])
    assert a100.step_duration(plan) == pytest.approx(0.001 + 838_860_800 / 25.6e9)
    compact = StepPlan([], transfers=[BlockTransfer("compact", [(1, 2)] * 10)])
    # read + write of 10 blocks at 2.039 TB/s * 0.8
    assert a100.transfer_time(compact) == pytest.approx(2 * 10 * 8_388_608 / (2.039e12 * 0.8))
    assert a100.step_duration(StepPlan()) == 0.0


def test_transfers_add_to_a_forward_pass(a100):
    plan = decode_plan([100] * 4)
    with_swap = decode_plan([100] * 4)
    with_swap.transfers.append(BlockTransfer("swap_in", [(0, 0)] * 8))
    assert a100.step_duration(with_swap) == pytest.approx(
        a100.step_duration(plan) + a100.transfer_time(with_swap))


@pytest.mark.parametrize("model, gpu, tp", [("llama-2-7b", "a100-80gb", 1),
                                            ("llama-3-70b", "h100-80gb", 4),
                                            ("qwen2.5-7b", "l4", 1), ("opt-13b", "a100-40gb", 2)])
def test_decode_durations_equal_step_duration_exactly(model, gpu, tp):
    cm = CostModel(model, gpu, tp=tp)
    rng = np.random.default_rng(1)
    for num_seqs in (1, 3, 64, 257):
        contexts = rng.integers(0, 5000, num_seqs)      # only the sum matters
        fast = cm.decode_durations(num_seqs, int(contexts.sum()), 40)
        slow = [cm.step_duration(decode_plan((contexts + k).tolist())) for k in range(40)]
        assert fast.dtype == np.float64 and fast.shape == (40,)
        assert fast.tolist() == slow                      # bit for bit, not approx


@pytest.mark.parametrize("model, gpu, tp", [("llama-2-7b", "a100-80gb", 1),
                                            ("llama-3-70b", "h100-80gb", 4)])
def test_decode_durations_beside_a_prefill_equal_step_duration_exactly(model, gpu, tp):
    """A run's steps where one more request prefills ``new`` tokens a step on top of its
    ``computed`` (growing by ``new``): the same durations as planning each step."""
    cm = CostModel(model, gpu, tp=tp)
    rng = np.random.default_rng(2)
    for num_seqs, computed, new in ((0, 0, 512), (3, 4096, 2045), (64, 100_000, 8128)):
        contexts = rng.integers(0, 5000, num_seqs)
        fast = cm.decode_durations(num_seqs, int(contexts.sum()), 12, prefill=(computed, new))
        slow = []
        for k in range(12):
            plan = decode_plan((contexts + k).tolist())
            plan.scheduled.append(ScheduledRequest(99, new, computed + k * new))
            slow.append(cm.step_duration(plan))
        assert fast.tolist() == slow                      # bit for bit, not approx


@pytest.mark.parametrize("model, gpu, tp", [("llama-2-7b", "a100-80gb", 1),
                                            ("llama-3-70b", "h100-80gb", 4)])
def test_steps_until_are_the_decode_durations_of_each_stretch_in_turn(model, gpu, tp):
    """The run's steps one python float at a time until the horizon: the values, the sums
    and the crossing that decode_durations gives stretch by stretch (the protocol's own
    steps_until), bit for bit, for a prompt beside the decodes and for a horizon met
    anywhere or never."""
    from kvsim.sim.serving.executor import Executor
    cm, rng = CostModel(model, gpu, tp=tp), np.random.default_rng(3)
    assert cm._decode_slope > 0.0          # (the fast path is the one under test)
    for _ in range(60):
        stretches = [(int(rng.choice([1, 2, 31, 32, 33, 287, 288, 289, 600])),
                      int(rng.integers(1, 200)), int(rng.integers(0, 300_000)), 0)
                     for _ in range(rng.integers(1, 5))]
        if rng.random() < 0.5:      # (an admitting step: one step, its prompt beside)
            stretches.insert(0, (1, int(rng.integers(0, 200)), int(rng.integers(0, 10**5)),
                                 int(rng.integers(1, 8000))))
        now = float(rng.uniform(0, 1000))
        horizon = now + float(rng.choice([0.0, 1e-3, 0.05, 0.5, 5.0, math.inf]))
        ours = cm.steps_until(iter(stretches), now, horizon)
        theirs = Executor.steps_until(cm, iter(stretches), now, horizon)
        assert ours == theirs
        durations, before, end, crossed = ours
        assert crossed == (end >= horizon) and (before < horizon or len(durations) == 1)
        assert crossed or len(durations) == sum(stretch[0] for stretch in stretches)


def test_decode_durations_edge_cases(a100):
    assert a100.decode_durations(5, 0, 0).shape == (0,)
    assert a100.decode_durations(1, 0, 1)[0] == a100.step_duration(decode_plan([0]))
    with pytest.raises(ValueError):
        a100.decode_durations(0, 0, 3)


def test_profile_overrides_from_dict_and_file(tmp_path, a100):
    plan = decode_plan([100] * 4)
    slower = CostModel("llama-2-7b", "a100-80gb", profile={"overhead": {"step_s": 0.011}})
    assert slower.step_duration(plan) == pytest.approx(a100.step_duration(plan) + 0.010)
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"gemm": {"memory_efficiency": 0.4}}))
    assert CostModel("llama-2-7b", "a100-80gb", profile=path).step_duration(plan) > \
        a100.step_duration(plan)
    path.write_text(json.dumps({"gemm": {"memory_efficiency": "fast"}}))
    with pytest.raises(ConfigError, match="profile"):
        CostModel("llama-2-7b", "a100-80gb", profile=path)
    with pytest.raises(ConfigError, match="no such calibration profile file"):
        CostModel("llama-2-7b", "a100-80gb", profile=tmp_path / "missing.json")


@pytest.mark.parametrize("profile, field, message", [
    ({"gemmm": {"memory_efficiency": 0.4}}, "gemmm", "unknown section; did you mean 'gemm'?"),
    ({"kind": "weird"}, "kind", "unknown profile kind 'weird'; expected 'fitted'"),
    ({"gemm": {"compute_efficiancy": 0.01}}, "gemm.compute_efficiancy",
     "unknown key; did you mean 'compute_efficiency'?"),
    ({"elementwise": {"mlp_act": {"min_time": 1e-6}}}, "elementwise.mlp_act.min_time",
     "unknown key; did you mean 'min_time_s'?"),
    ({"all_reduce": {"measured": {"2": {"latency_s": 1e-5, "bus_bw": 1e11}}}},
     "all_reduce.measured.2.bus_bw", "unknown key; known: latency_s, bus_bandwidth_bytes_per_s"),
    ({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}, "profile",
     "holds no calibration: none of the sections gemm, elementwise"),
])
def test_a_misspelt_profile_is_refused_not_ignored(tmp_path, profile, field, message):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**profile, "notes": {"by": "hand"}}))   # (notes are kept)
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        CostModel("llama-2-7b", "a100-80gb", profile=path)
    assert (err.value.location, err.value.field) == (str(path), field)


def test_every_catalog_gpu_has_a_default_profile():
    for gpu in ("a100-40gb", "a100-80gb", "h100-80gb", "h200", "l4", "l40s"):
        cm = CostModel("llama-3-8b", gpu)
        assert cm.profile.raw["gpu"] == gpu
        assert cm.step_duration(decode_plan([1000] * 16)) > 0
    h100 = CostModel("llama-3-8b", "h100-80gb").step_duration(prefill_plan(2048))
    a100 = CostModel("llama-3-8b", "a100-80gb").step_duration(prefill_plan(2048))
    assert h100 < a100
