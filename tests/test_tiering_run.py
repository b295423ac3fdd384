"""The host tier in whole simulations: what it changes, what it reports, and the CLI."""

import json

import numpy as np
import pytest

from kvsim.reports.grid_table import bytes_moved
from kvsim.sim.serving import results
from kvsim.sim.config import RunConfig
from kvsim.sim.perf.models import resolve_model
from kvsim.sim.serving.runner import simulate
from kvsim.workloads import Request
from clirun import kvsim


def sessions(num_sessions=12, turns=4, context=1500, gap=0.5, output=32, seed=3):
    """Conversations that come back: each turn re-sends the session's whole history, and the
    sessions take turns, so a session's prefix has left a small GPU pool by its next turn."""
    rng = np.random.default_rng(seed)
    history = [list(rng.integers(0, 30000, context)) for _ in range(num_sessions)]
    out, t, rid = [], 0.0, 0
    for turn in range(turns):
        for s in range(num_sessions):
            history[s] += list(rng.integers(0, 30000, 40))
            ids = np.array(history[s])
            out.append(Request(rid, t, len(ids), output, prompt_token_ids=ids))
            rid, t = rid + 1, t + gap
    return out


def run(workload=None, **kw):
    config = RunConfig(model="llama-3.1-8b", num_gpu_blocks=600, max_model_len=8192, **kw)
    r = simulate(workload or sessions(), config, keep_steps=True)
    requests, steps = results.requests_frame(r), results.steps_frame(r)
    return results.build_summary(r, requests), steps, r


def test_a_host_tier_turns_returning_sessions_into_host_hits():
    base, _, _ = run()
    tier, steps, _ = run(num_cpu_blocks=20000)
    t = tier["tiering"]
    assert base["prefix_cache"]["host_hit_tokens"] == 0
    assert tier["prefix_cache"]["hit_rate"] > base["prefix_cache"]["hit_rate"] + 0.3
    host_hits = tier["prefix_cache"]["host_hit_tokens"]
    assert host_hits > 0 and host_hits % 16 == 0
    per_block = resolve_model("llama-3.1-8b").kv_bytes_per_token("bf16") * 16
    assert t["promoted_blocks"] * 16 >= host_hits      # resumes promote too
    assert t["bytes_to_device"] == t["promoted_blocks"] * per_block
    assert t["bytes_to_host"] == t["offloaded_blocks"] * per_block > 0
    assert t["transfer_time_s"] == pytest.approx(steps["transfer_s"].sum()) and \
        t["transfer_time_s"] > 0
    assert tier["kv"]["num_cpu_blocks"] == 20000 and 0 < t["peak_host_usage"] <= 1
    assert tier["ttft_s"]["p50"] < base["ttft_s"]["p50"]
    assert tier["num_completed"] == base["num_completed"] == 48
    assert bytes_moved(tier) == t["bytes_to_host"] + t["bytes_to_device"]   # compare's column


def test_write_through_copies_more_but_finds_the_same_hits():
    back, _, _ = run(num_cpu_blocks=20000, offload_write="back")
    through, _, _ = run(num_cpu_blocks=20000, offload_write="through")
    assert through["tiering"]["offloaded_blocks"] > back["tiering"]["offloaded_blocks"]
    assert through["prefix_cache"]["hit_tokens"] >= back["prefix_cache"]["hit_tokens"]


def test_swap_preemption_moves_blocks_and_computes_fewer_tokens_than_recompute():
    kw = dict(num_cpu_blocks=4000, max_num_seqs=64, enable_prefix_caching=False,
              offload_write="back")
    busy = sessions(gap=0.01, output=300)
    recompute, rsteps, _ = run(busy, **kw)
    swap, ssteps, _ = run(busy, preemption_mode="swap", **kw)
    assert recompute["preemptions"] > 0 and swap["preemptions"] > 0
    assert recompute["swapped_out_blocks"] == 0
    assert swap["swapped_out_blocks"] > 0 and swap["swapped_in_blocks"] > 0
    assert swap["num_completed"] == 48
    assert ssteps["scheduled_tokens"].sum() < rsteps["scheduled_tokens"].sum()


def test_same_inputs_same_summary():
    kw = dict(num_cpu_blocks=3000, preemption_mode="swap", eviction="lfu", offload_write="back")
    a, _, _ = run(**kw)
    b, _, _ = run(**kw)
    a.pop("wall_time_s"), b.pop("wall_time_s")
    assert a == b


def test_cli_run_with_a_host_tier(tmp_path):
    out = tmp_path / "out"
    done = kvsim("run", "--num-gpu-blocks", "3000", "--kv-offloading-size", "16",
                 "--preemption-mode", "swap", "--offload-write", "through",
                 "--limit", "40", "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    blocks = 16 * 2 ** 30 // (16 * resolve_model("llama-3.1-8b").kv_bytes_per_token("bf16"))
    assert summary["kv"]["num_cpu_blocks"] == summary["tiering"]["num_cpu_blocks"] == blocks
    assert summary["config"]["preemption_mode"] == "swap"
    timeline = (out / "timeline.csv").read_text().splitlines()
    assert "host_used_blocks" in timeline[0] and "transfer_s" in timeline[0]


def test_cli_refuses_bad_tier_settings_in_one_line(tmp_path):
    done = kvsim("run", "--offload-write", "sideways", "--out", str(tmp_path / "o"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "kvsim: error: Invalid value for '--offload-write': 'sideways' is not one of 'native', "
        "'back', 'through'."]
    assert not (tmp_path / "o").exists()


def test_compare_grids_over_the_host_tier(tmp_path):
    done = kvsim("compare", "--kv-offloading-size", "0,4", "--num-gpu-blocks", "2000",
                 "--limit", "30", "--out", str(tmp_path / "cmp"))
    assert done.returncode == 0, done.stderr
    runs = json.loads((tmp_path / "cmp" / "compare.json").read_text())["runs"]
    tiers = [r["summary"]["kv"]["num_cpu_blocks"] for r in runs]
    assert tiers[0] == 0 and tiers[1] > 0
    assert "kv_offloading_size=4.0" in done.stdout


def test_the_timeline_keeps_cached_and_host_blocks_through_idle_gaps():
    """Two requests 100 s apart: between them nothing runs, yet the first one's blocks stay
    cached on the GPU and (after the second evicts them) on the host."""
    ids = np.arange(4000)
    reqs = [Request(0, 0.0, 4000, 8, prompt_token_ids=ids),
            Request(1, 100.0, 4000, 8, prompt_token_ids=ids + 5000),
            Request(2, 200.0, 16, 8, prompt_token_ids=ids[:16] + 9000)]
    r = simulate(reqs, RunConfig(model="llama-3.1-8b", num_gpu_blocks=300,
                                 max_model_len=4096, num_cpu_blocks=1000,
                                 offload_write="back"))
    tl = results.timeline_frame(r.steps.timeline, 300, 16)
    first_gap = tl[(tl["time_s"] > 10) & (tl["time_s"] + tl["interval_s"] < 95)]
    second_gap = tl[(tl["time_s"] > 110) & (tl["time_s"] + tl["interval_s"] < 195)]
    assert len(first_gap) and np.allclose(first_gap["kv_cached_idle_blocks"], 250)
    assert np.allclose(first_gap["host_used_blocks"], 0)
    # the second request took 251 blocks: the 50 never used, then 201 of the first's
    assert len(second_gap) and np.allclose(second_gap["host_used_blocks"], 201)
    assert np.allclose(second_gap["num_running"], 0)


def test_native_offloading_stores_prompt_blocks_and_loads_hits_a_step_early():
    """vLLM's connector stores each prompt block once computed, never one decoding fills
    (``offload_prompt_only``), where kvsim's write-through stores every block computed, so
    it copies fewer to the host (1,236 blocks against 1,332); CPU hits load in a step of
    their own."""
    native, steps, _ = run(num_cpu_blocks=20000)
    through, _, _ = run(num_cpu_blocks=20000, offload_write="through")
    assert native["config"]["offload_write"] == "native"
    assert (native["tiering"]["offloaded_blocks"], through["tiering"]["offloaded_blocks"]) \
        == (1236, 1332)
    assert native["prefix_cache"]["host_hit_tokens"] > 0
    loads = steps[steps["promote_blocks"] > 0]
    assert len(loads) and native["num_completed"] == 48
    arc, _, _ = run(num_cpu_blocks=20000, offload_eviction_policy="arc")
    gated, _, _ = run(num_cpu_blocks=20000, offload_store_threshold=2)
    assert arc["prefix_cache"]["host_hit_tokens"] > 0
    assert gated["tiering"]["offloaded_blocks"] < native["tiering"]["offloaded_blocks"]


def test_kv_offloading_size_is_the_whole_replica_s_host_memory():
    from kvsim.sim.perf.memory import kv_offloading_blocks
    one = kv_offloading_blocks("llama-3.1-8b", 16, tp=1)
    assert kv_offloading_blocks("llama-3.1-8b", 16, tp=2) == one     # split over the ranks
    assert one == 16 * 2 ** 30 // (16 * resolve_model("llama-3.1-8b").kv_bytes_per_token("bf16"))


def test_cpu_offload_gb_is_refused_in_one_line_pointing_to_kv_offloading_size(tmp_path):
    done = kvsim("run", "--cpu-offload-gb", "16", "--out", str(tmp_path / "o"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "kvsim: error: --cpu-offload-gb is vLLM's "
        "weight offload, which kvsim does not model; a CPU tier for the KV cache is "
        "--kv-offloading-size GIB (or --num-cpu-blocks N)"]
    with pytest.raises(Exception, match="--kv-offloading-size"):
        RunConfig(cpu_offload_gb=4.0)


def test_swap_preemption_is_a_kvsim_extension_that_needs_a_kvsim_write_mode():
    with pytest.raises(Exception, match="kvsim extension"):
        RunConfig(num_cpu_blocks=8, preemption_mode="swap").validate()
