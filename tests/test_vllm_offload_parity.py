"""kvsim's native CPU tier against real vLLM 0.32's OffloadingConnector (CPU build, its worker
stubbed: see ``tests/fixtures/vllm_offload/README.md``), step by step: each step's scheduled
tokens and preemptions, each request's cached tokens, and what the connector did in the step:
every lookup (request, GPU hit tokens, CPU hit tokens or a wait) and every store (blocks
offered, stored and evicted, or refused)."""

from pathlib import Path

import pytest

from kvsim.sim.serving import vllm_fixture
from kvsim.sim.serving.vllm_fixture import load_fixture, replay_fixture

OFFLOAD = Path(__file__).parent / "fixtures" / "vllm_offload"


def replay(name: str, monkeypatch):
    """vLLM's steps and kvsim's, and each one's cached tokens by request: a step is
    (scheduled tokens by request, preempted, the connector's lookups, its stores)."""
    requests, oracle = load_fixture(OFFLOAD / f"{name}.jsonl")
    summary = oracle["summary"]
    settings = {**summary["settings"], "cpu_chunks": summary["cpu_chunks"]}
    settings["max_model_len"] = settings["max_model_len"] or min(
        8192, (settings["num_blocks"] - 1) * settings["block_size"])      # (vLLM's default)
    lookups, stores, steps = [], [], []
    monkeypatch.setattr(vllm_fixture, "make_scheduler", _observed(
        vllm_fixture.make_scheduler, lookups, stores))

    def step(sched):
        plan = sched.schedule()
        sched.update_from_output()
        steps.append(({s.request_id: s.num_new_tokens for s in plan.scheduled},
                      list(plan.preempted), lookups[:], stores[:]))
        lookups.clear()
        stores.clear()

    seqs = replay_fixture(requests, settings, step, summary.get("model"))
    expected = [({int(k): v for k, v in s["scheduled"].items()}, s["preempted"],
                 [tuple(x[:3]) for x in s.get("lookups", [])],
                 [_store(m) for m in s.get("mgr", []) if m[0] == "prepare_store"])
                for s in oracle["steps"]]
    cached = {r["index"]: r["num_cached_tokens"] for r in oracle["requests"]}
    return expected, steps, cached, {i: max(s.num_cached_tokens, 0) for i, s in seqs.items()}


def _store(call):
    """(blocks offered, stored, evicted) of vLLM's ``prepare_store``; None when refused."""
    _, offered, answer = call
    return None if answer is None else (offered, answer[0], len(answer[1]))


def _observed(make_scheduler, lookups, stores):
    """``make_scheduler`` whose KV manager's lookups and CPU stores are logged as the record
    writes vLLM's."""
    def make(settings, model=None):
        sched = make_scheduler(settings, model)
        kv, offload = sched.kv, sched.kv.offload
        lookup, prepare_store = kv.lookup, offload.prepare_store

        def logged_lookup(seq):
            hit = lookup(seq)
            gpu = len(hit.block_ids) * kv.block_size
            lookups.append((seq.request_id, gpu,
                            None if hit.deferred else hit.num_tokens - gpu))
            return hit

        def logged_store(hashes, *more):
            out = prepare_store(hashes, *more)
            stores.append(None if out is None else (len(hashes), len(out.hashes),
                                                    len(out.evicted)))
            return out
        kv.lookup, offload.prepare_store = logged_lookup, logged_store
        return sched
    return make


@pytest.mark.parametrize("name", [
    "w1",   # a prefix pushed off the GPU, resent: 64 tokens from the CPU on top of GPU hits
    "w2",   # the same trace on a 4-block CPU tier
    "w3",   # a store evicted for another's while its request runs; recency set at finish
    "w4",   # two requests hitting the same CPU blocks: the second waits for the first's load
    "w5",   # decode fills blocks (not stored: prompt blocks only), flush, resend
    "w6",   # three preemptions while stores are in flight, then the prompts resent
    "w7",   # CPU hits loaded with two seats and a full GPU
    "w8",   # shared prefixes among long prompts, four seats: 81 CPU-hit lookups, 2 preemptions
    "w9",   # a loading request takes no seat: the one after it runs first, it waits for one
    "w10",  # a CPU hit refused while a long prompt is prefilled in chunks, admitted after
    "w11",  # a load refused while the blocks a chunked prefill still needs are not left free
    "w12",  # without chunked prefill: a load starts behind a prompt that took the budget
])
def test_kvsim_makes_vllms_decisions_with_a_cpu_tier(name, monkeypatch):
    expected, steps, cached, got = replay(name, monkeypatch)
    assert len(steps) == len(expected)
    for i, (want, have) in enumerate(zip(expected, steps)):
        assert have == want, f"step {i}"
    assert got == cached


def test_the_recordings_have_waits_loads_evictions_and_refusals(monkeypatch):
    """(So that the comparison above can fail.)"""
    names = [f"w{i}" for i in range(1, 13)]
    steps = [s for name in names for s in replay(name, monkeypatch)[0]]
    lookups = [x for s in steps for x in s[2]]
    stores = [x for s in steps for x in s[3]]
    assert any(x[2] is None for x in lookups) and any(x[2] for x in lookups)
    assert any(x is None for x in stores) and any(x and x[2] for x in stores)
