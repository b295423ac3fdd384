"""Decision parity with real vLLM 0.32 (CPU), replayed by ``../shared/tools/vllm-oracle``.

Each fixture under ``tests/fixtures/vllm/`` pairs a token-id trace with the oracle's record of
every engine step. kvsim's scheduler and cache manager, with the same settings, must reproduce
the step count, every step's scheduled tokens and preemptions, and each request's cached
tokens. vLLM reserves block 0 as a null block, so ``--num-blocks N`` means N - 1 usable blocks.
"""

from pathlib import Path

import pytest

from kvsim.sim.serving.vllm_fixture import load_fixture, replay_fixture

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
NAMES = sorted(p.name[: -len(".vllm.json")] for p in FIXTURES.glob("*.vllm.json"))


def load(name):
    return load_fixture(FIXTURES / f"{name}.jsonl")


def replay(requests, settings, record=None, model=None):
    """Step the scheduler with the oracle's arrival clock; record what each step did (and,
    into ``record``, the step's counts, usage, prefix stats, first tokens and finishes)."""
    steps = []

    def step(sched):
        stats = sched.kv.prefix_stats
        before = (stats.num_queries_tokens, stats.num_hit_tokens)
        plan = sched.schedule()
        outcome = sched.update_from_output()
        steps.append(({s.request_id: s.num_new_tokens for s in plan.scheduled},
                      list(plan.preempted)))
        if record is not None:
            record.append(dict(
                running=sched.num_running, waiting=sched.num_waiting,
                kv_usage=1 - sched.kv.num_free_blocks / sched.kv.num_blocks,
                prefix_queries=stats.num_queries_tokens - before[0],
                prefix_hits=stats.num_hit_tokens - before[1],
                first=[s.request_id for s in outcome.first_tokens],
                finished=[s.request_id for s in outcome.finished]))

    return steps, replay_fixture(requests, settings, step, model)


@pytest.mark.parametrize("name", NAMES)
def test_kvsim_makes_vllms_decisions(name):
    requests, oracle = load(name)
    steps, seqs = replay(requests, oracle["summary"]["settings"],
                         model=oracle["summary"].get("model"))
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


@pytest.mark.parametrize("name", NAMES)
def test_kvsim_matches_vllms_step_stats_and_request_timeline(name):
    requests, oracle = load(name)
    record = []
    replay(requests, oracle["summary"]["settings"], record, oracle["summary"].get("model"))
    for i, (got, want) in enumerate(zip(record, oracle["steps"])):
        for key in ("running", "waiting", "prefix_queries", "prefix_hits"):
            assert got[key] == want[key], f"step {i}: {key}"
        assert got["kv_usage"] == pytest.approx(want["kv_usage"], abs=1e-9), f"step {i}"
    first = {r: i for i, s in enumerate(record) for r in s["first"]}
    finish = {r: i for i, s in enumerate(record) for r in s["finished"]}
    for r in oracle["requests"]:
        assert (first[r["index"]], finish[r["index"]]) == \
            (r["first_token_step"], r["finish_step"]), f"request {r['index']}"


def test_the_issue_16_fixtures_exercise_what_they_are_named_for():
    summaries = {n: load(n)[1]["summary"] for n in NAMES}
    assert summaries["identical_prompts"]["preemptions"] > 0
    assert summaries["priority_ties"]["preemptions"] > 0
    assert summaries["priority_ties"]["settings"]["priority"]
    assert summaries["long_prefill"]["settings"]["long_prefill_token_threshold"] > 0
    assert summaries["no_chunked_prefill"]["settings"]["no_enable_chunked_prefill"]
    assert summaries["no_reserve_full_isl"]["settings"]["no_scheduler_reserve_full_isl"]
    assert summaries["odd_max_model_len"]["settings"]["max_model_len"] % 32
    assert summaries["multi_turn"]["prefix_hits"] > 0


ISSUE_19 = {
    # fixture: (model folder, KV group kinds kvsim forms, as vLLM's log showed them)
    "sliding_window_hybrid": ("tiny-mistral-hybrid", ("sliding", "full")),
    "sliding_window_all": ("tiny-mistral-swa", ("sliding",)),
    "gemma3_local_global": ("tiny-gemma3", ("sliding",) * 5 + ("full",)),
    "gpt_oss_alternating": ("tiny-gpt-oss", ("sliding", "full")),
    "llama4_chunked_local": ("tiny-llama4", ("chunked", "full")),
    "moe_qwen3": ("tiny-qwen3-moe", ("full",)),
    "moe_mixtral": ("tiny-mixtral", ("full",)),
    "mla_deepseek": ("tiny-deepseek-v3", ("full",)),
}


@pytest.mark.parametrize("name", sorted(n for n in ISSUE_19 if n in NAMES))
def test_the_issue_19_fixtures_replay_their_model_configs(name):
    from kvsim.sim.serving.vllm_fixture import MODELS, fixture_layout

    model, kinds = ISSUE_19[name]
    summary = load(name)[1]["summary"]
    assert summary["model"] == model
    assert (MODELS / model / "config.json").is_file()
    layout = fixture_layout(model, summary["settings"]["block_size"])
    assert tuple(g.kind for g in layout.groups) == kinds
    assert layout.is_hybrid == (kinds != ("full",))


def test_the_issue_19_fixtures_exercise_windows_preemption_and_hits():
    summaries = {n: load(n)[1]["summary"] for n in ISSUE_19 if n in NAMES}
    assert {"sliding_window_hybrid", "mla_deepseek"} <= set(summaries)
    hybrid = summaries["sliding_window_hybrid"]
    assert hybrid["preemptions"] > 0 and hybrid["prefix_hits"] > 0
    assert summaries["mla_deepseek"]["settings"]["block_size"] == 16
    assert summaries["mla_deepseek"]["preemptions"] > 0
