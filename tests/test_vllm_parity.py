"""Decision parity with real vLLM 0.32 (CPU), replayed by ``../shared/tools/vllm-oracle``.

Each fixture under ``tests/fixtures/vllm/`` pairs a token-id trace with the oracle's record of
every engine step. kvsim's scheduler and cache manager, with the same settings, must reproduce
the step count, every step's scheduled tokens and preemptions, and each request's cached
tokens. vLLM reserves block 0 as a null block, so ``--num-blocks N`` means N - 1 usable blocks.
"""

from pathlib import Path

import pytest

from kvsim.sim.vllm_fixture import load_fixture, replay_fixture

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
NAMES = sorted(p.name[: -len(".vllm.json")] for p in FIXTURES.glob("*.vllm.json"))


def load(name):
    return load_fixture(FIXTURES / f"{name}.jsonl")


def replay(requests, settings):
    """Step the scheduler with the oracle's arrival clock; record what each step did."""
    steps = []

    def step(sched):
        plan = sched.schedule()
        sched.update_from_output()
        steps.append(({s.request_id: s.num_new_tokens for s in plan.scheduled},
                      list(plan.preempted)))

    return steps, replay_fixture(requests, settings, step)


@pytest.mark.parametrize("name", NAMES)
def test_kvsim_makes_vllms_decisions(name):
    requests, oracle = load(name)
    steps, seqs = replay(requests, oracle["summary"]["settings"])
    expected = [({int(k): v for k, v in s["scheduled"].items()}, s["preempted"])
                for s in oracle["steps"]]
    assert len(steps) == len(expected)
    for i, (got, want) in enumerate(zip(steps, expected)):
        assert got == want, f"step {i}"
    cached = {r["index"]: r["num_cached_tokens"] for r in oracle["requests"]}
    assert {i: max(s.num_cached_tokens, 0) for i, s in seqs.items()} == cached
    preemptions = {r["index"]: r["num_preemptions"] for r in oracle["requests"]}
    assert {i: s.num_preemptions for i, s in seqs.items()} == preemptions


def test_fixtures_cover_the_interesting_cases():
    summaries = {n: load(n)[1]["summary"] for n in NAMES}
    assert {"shared_prefix", "preemption_heavy", "mixed_arrivals"} <= set(summaries)
    assert summaries["preemption_heavy"]["preemptions"] > 0
    assert summaries["shared_prefix"]["cached_tokens"] > 0
    assert summaries["mixed_arrivals"]["cached_tokens"] > 0
