"""kvsim's native CPU tier against real vLLM 0.32's OffloadingConnector (CPU build, its worker
stubbed: see ``tests/fixtures/vllm_offload/README.md``), compared by schedule (each step's
scheduled tokens and preemptions) and each request's cached tokens; the stores themselves are
not compared (w5's differ: kvsim offers decode-filled blocks, 0.32 does not). The three
recordings where kvsim makes vLLM's decisions must stay so; the two where it does not are
expected failures pinned to their first differing step and cached tokens, each naming the
rule kvsim models differently (it follows the connector of vLLM 0.11-0.12), so that mending a
rule fails the test and asks for the recording to move up."""

from pathlib import Path

import pytest

from kvsim.sim.serving.vllm_fixture import load_fixture, replay_fixture

OFFLOAD = Path(__file__).parent / "fixtures" / "vllm_offload"


def replay(name: str):
    """(vLLM's steps, kvsim's steps, vLLM's cached tokens, kvsim's) of recording ``name``:
    each step's scheduled tokens and preemptions, each request's cached tokens."""
    requests, oracle = load_fixture(OFFLOAD / f"{name}.jsonl")
    summary = oracle["summary"]
    settings = {**summary["settings"], "cpu_chunks": summary["cpu_chunks"]}
    settings["max_model_len"] = settings["max_model_len"] or min(
        8192, (settings["num_blocks"] - 1) * settings["block_size"])      # (vLLM's default)
    steps = []

    def step(sched):
        plan = sched.schedule()
        sched.update_from_output()
        steps.append(({s.request_id: s.num_new_tokens for s in plan.scheduled},
                      list(plan.preempted)))

    seqs = replay_fixture(requests, settings, step, summary.get("model"))
    expected = [({int(k): v for k, v in s["scheduled"].items()}, s["preempted"])
                for s in oracle["steps"]]
    cached = {r["index"]: r["num_cached_tokens"] for r in oracle["requests"]}
    return expected, steps, cached, {i: max(s.num_cached_tokens, 0) for i, s in seqs.items()}


@pytest.mark.parametrize("name", [
    "w1",       # a prefix pushed off the GPU, resent: 64 tokens from the CPU on top of GPU hits
    "w2",       # the same trace on a 4-block CPU tier
    "w5",       # decode fills blocks, flush, resend (the schedule matches; the stores do not:
])              # vLLM 0.32 offers prompt blocks only, offload_prompt_only)
def test_kvsim_makes_vllms_decisions_with_a_cpu_tier(name):
    expected, steps, cached, got = replay(name)
    assert steps == expected and got == cached


@pytest.mark.parametrize("name, first, cached_differ, rule", [
    ("w3", 31, {3: (32, 160)},
     "vLLM 0.32 completes a store per job, not per request, and refreshes CPU recency only "
     "when a request finishes"),
    ("w4", 4, {5: (128, 96), 6: (320, 288)},
     "vLLM 0.32 defers a request whose CPU hit another request is loading, and looks up the "
     "prompt's last full block"),
])
def test_known_differences_from_vllm_0_32s_connector(name, first, cached_differ, rule):
    expected, steps, cached, got = replay(name)
    if steps == expected and got == cached:
        pytest.fail(f"{name} now matches vLLM 0.32 ({rule}): move it to the test above, "
                    "unless the CPU tier is off (the test above fails then too)")
    # (the difference known, and no other: the first differing step, the cached tokens)
    assert next(i for i, pair in enumerate(zip(expected, steps)) if pair[0] != pair[1]) == first
    assert {i: (cached[i], got[i]) for i in cached if cached[i] != got[i]} == cached_differ
    pytest.xfail(rule)
