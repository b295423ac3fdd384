"""Layouts end to end: the hybrid manager's stories, then simulated runs (the vLLM paper's
7-request cap of Orca (Max), the fragmentation breakdown, compaction in the step plan)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.cache.hybrid import HybridKVManager, free_runs
from kvsim.cache.scheduler import Scheduler
from kvsim.cache.request_state import RequestState
from kvsim.errors import ConfigError
from kvsim.sim.serving import results
from kvsim.sim.config import RunConfig
from kvsim.sim.serving.runner import simulate
from kvsim.workloads import Request
from kvsim.workloads.generators.build import GenConfig, generate, preset_named

OPT_A100 = dict(model="opt-13b", gpu="a100-40gb", num_gpu_blocks=982, max_model_len=2048)


def seq(rid, prompt, output):
    return RequestState(Request(rid, 0.0, prompt, output), 16)


# --- hybrid manager ------------------------------------------------------------------------

def test_free_runs():
    assert free_runs([0, 0, 1, 0, 0, 0, 1, 0], 1) == [(0, 2), (3, 3), (7, 1)]
    assert free_runs([1, 1], 1) == []


def test_hybrid_places_short_requests_at_the_top_and_pages_long_ones_from_the_bottom():
    m = HybridKVManager(10, 16, 320, threshold=160, reserve="oracle")
    assert m.allocate("long", seq(1, 40, 200), 40) == [0, 1, 2]        # final 240: paged
    assert m.allocate("short", seq(2, 20, 20), 20) == [7, 8, 9]        # 40 -> 3 blocks, top
    assert (m.region("short").offset, m.region("short").size) == (112, 48)
    assert m.block_ids_ref("short") == [7, 8, 9]
    assert m.pool.num_free_blocks == 4
    running = [seq(1, 40, 200), seq(2, 20, 20)]
    running[0].request_id, running[1].request_id = "long", "short"
    running[0].num_computed_tokens, running[1].num_computed_tokens = 40, 20
    # tokens 40 + 20; reservation 40 - 20; internal 8 (paged tail) + 48 - 40 (region tail);
    # a short request of 5 blocks (80 tokens) finds no run of 5 among the 4 free blocks
    # [3, 7): all 64 free slots are external; one of 4 blocks (64 tokens) fits: none are
    assert m.fragmentation(running, seq(3, 40, 40)) == (60, 20, 16, 64)
    assert m.fragmentation(running, seq(3, 40, 24)) == (60, 20, 16, 0)
    assert m.fragmentation(running, seq(3, 40, 400)) == (60, 20, 16, 0)     # paged next
    m.free("short")
    assert m.pool.num_free_blocks == 7 and m.region("short") is None


def test_hybrid_short_admission_fails_without_a_free_run():
    m = HybridKVManager(4, 16, 320, threshold=100, reserve="oracle")
    assert m.allocate("a", seq(1, 16, 16), 16) == [2, 3]
    assert m.allocate("p", seq(2, 16, 200), 16) == [0]
    assert m.allocate("b", seq(3, 20, 12), 20) is None                 # needs 2, run of 1
    assert not m.has_request("b") and m.pool.num_free_blocks == 1


# --- configuration -------------------------------------------------------------------------

def test_layout_settings_are_validated():
    for bad in (dict(layout="buddy"), dict(layout="contiguous", reserve="half"),
                dict(layout="paged", compaction_threshold=0.1),
                dict(layout="contiguous", compaction_threshold=1.5),
                dict(layout="hybrid", eviction="lfu"), dict(hybrid_threshold=0)):
        with pytest.raises(ConfigError):
            RunConfig(**bad).validate()


# --- simulated runs ------------------------------------------------------------------------

def burst(n=40, prompt=161, output=338):
    return [Request(i, 0.0, prompt, output) for i in range(n)]


def run(requests, **settings):
    r = simulate(requests, RunConfig(**OPT_A100, **settings), keep_steps=True)
    steps, reqs = results.steps_frame(r), results.requests_frame(r)
    return r, steps, results.build_summary(r, reqs)


def test_contiguous_max_never_batches_more_than_seven_requests():
    """15,712 slots // 2,048 reserved per request = 7 (the vLLM paper, §6)."""
    _, steps, summary = run(burst(), layout="contiguous", reserve="max")
    assert steps["batch_size"].max() == 7 and steps["num_running"].max() == 7
    assert summary["num_completed"] == 40 and summary["preemptions"] == 0
    _, paged_steps, _ = run(burst(), layout="paged")
    assert paged_steps["batch_size"].max() == 40


def test_fragmentation_breakdown_small_scale():
    """ShareGPT-like lengths, loaded: paged keeps > 90% of the pool as token states while
    requests wait; contiguous max loses most of it to over-reservation; every breakdown sums
    to 1 and only contiguous layouts have external fragmentation."""
    reqs = generate(preset_named("sharegpt-like"), GenConfig(num_requests=200, rate=20, seed=0))
    shares = {}
    for name, lay in {"paged": dict(layout="paged"),
                      "max": dict(layout="contiguous", reserve="max"),
                      "oracle": dict(layout="contiguous", reserve="oracle"),
                      "hybrid": dict(layout="hybrid")}.items():
        _, steps, summary = run(reqs, **lay)
        for key in ("fragmentation", "fragmentation_under_load"):
            assert sum(summary[key].values()) == pytest.approx(1.0)
        shares[name] = summary["fragmentation_under_load"]
        shares[name]["batch"] = summary["kv"]["mean_batch_size"]
    assert shares["paged"]["token_states"] > 0.9
    assert shares["paged"]["reservation"] == shares["paged"]["external"] == 0
    assert shares["max"]["internal"] > 0.4 and shares["max"]["external"] > 0.05
    assert shares["oracle"]["internal"] == 0 and shares["oracle"]["reservation"] > 0.2
    assert shares["paged"]["batch"] > shares["oracle"]["batch"] > shares["max"]["batch"]


def test_compaction_moves_are_in_the_step_plan_and_charged():
    reqs = generate(preset_named("sharegpt-like"), GenConfig(num_requests=150, rate=20, seed=1))
    r, steps, summary = run(reqs, layout="contiguous", reserve="oracle",
                            compaction_threshold=0.02)
    c = summary["compaction"]
    assert c["num_compactions"] > 0 and c["moved_tokens"] > 0
    assert steps["compact_blocks"].sum() == c["moved_blocks"]
    assert c["compaction_bytes_moved"] == c["moved_tokens"] * 2 * 40 * 5120 * 2
    assert c["external_before"] > 0.02 and c["external_after"] == 0
    _, _, plain = run(reqs, layout="contiguous", reserve="oracle")
    assert plain["compaction"]["num_compactions"] == 0


def test_scheduler_puts_compaction_copies_in_the_plan():
    from kvsim.cache.contiguous import ContiguousKVManager
    kv = ContiguousKVManager(10, 16, 160, reserve="oracle", compaction_threshold=0.2)
    sched = Scheduler(kv)
    for i, (p, o) in enumerate([(30, 10), (30, 10), (30, 10), (30, 10)]):
        sched.add(seq(i, p, o))
    sched.schedule()
    sched.update_from_output()
    kv.free(0)
    kv.free(2)
    sched.running = [s for s in sched.running if s.request_id in (1, 3)]
    sched.add(seq(9, 60, 20))
    plan = sched.schedule()
    assert 9 in plan.admitted
    assert [(t.kind, t.pairs) for t in plan.transfers] == [
        ("compact", [(40, 0), (56, 16), (120, 40), (136, 56)])]


def test_cli_run_with_a_contiguous_layout_writes_the_breakdown(tmp_path):
    import json
    import subprocess
    import sys
    import pandas as pd
    done = subprocess.run(
        [sys.executable, "-m", "kvsim.cli", "run", "sample:azure-conv", "--model", "opt-13b",
         "--gpu", "a100-40gb", "--num-gpu-blocks", "982", "--max-model-len", "2048",
         "--limit", "60", "--layout", "contiguous", "--reserve", "pow2",
         "--compaction-threshold", "0.1", "--out", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["config"]["layout"] == "contiguous" and summary["config"]["reserve"] == "pow2"
    assert set(summary["compaction"]) >= {"num_compactions", "compaction_bytes_moved",
                                          "external_before", "external_after"}
    timeline = pd.read_csv(tmp_path / "timeline.csv")
    frag = timeline[[c for c in timeline.columns if c.startswith("frag_")]]
    assert (frag.sum(axis=1) - 1).abs().max() < 1e-9
    assert timeline["frag_internal"].max() > 0


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 120), st.integers(1, 120)),
                max_size=40))
def test_hybrid_regions_and_paged_blocks_never_overlap(ops):
    """Random admissions (short ones get regions, long ones blocks) and frees: a block belongs
    to at most one request, and held + free blocks = the pool."""
    m = HybridKVManager(24, 16, 400, threshold=100, reserve="pow2")
    live = []
    for i, (admit, prompt, output) in enumerate(ops):
        if admit or not live:
            s = seq(i, prompt, output)
            if m.allocate(i, s, prompt) is not None:
                live.append(i)
        else:
            m.free(live.pop(prompt % len(live)))
        held = [b for rid in live for b in m.block_ids_ref(rid)]
        assert len(held) == len(set(held))
        assert len(held) + m.pool.num_free_blocks == 24
        assert all(m.pool.ref_counts[b] == 1 for b in held)
