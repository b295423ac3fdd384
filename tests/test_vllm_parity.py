"""Decision parity with real vLLM 0.32 (CPU), replayed by ``../shared/tools/vllm-oracle``.

Each fixture under ``tests/fixtures/vllm/`` pairs a token-id trace with the oracle's record of
every engine step. kvsim's scheduler and cache manager, with the same settings, must reproduce
the step count, every step's scheduled tokens and preemptions, and each request's cached
tokens. vLLM reserves block 0 as a null block, so ``--num-blocks N`` means N - 1 usable blocks.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from kvsim.cache import KVCacheManager
from kvsim.cache.scheduler import Scheduler, SchedulerConfig
from kvsim.cache.sequence import Sequence
from kvsim.workloads import Request

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
NAMES = sorted(p.name[: -len(".vllm.json")] for p in FIXTURES.glob("*.vllm.json"))


def load(name):
    lines = (FIXTURES / f"{name}.jsonl").read_text().splitlines()
    requests = []
    for i, line in enumerate(l for l in lines if l.strip()):
        r = json.loads(line)
        ids = np.array(r["prompt_token_ids"], dtype=np.int64)
        requests.append((r.get("arrival_step", 0), Request(
            i, 0.0, len(ids), r["output_tokens"], prompt_token_ids=ids,
            priority=r.get("priority", 0))))
    return requests, json.loads((FIXTURES / f"{name}.vllm.json").read_text())


def make_scheduler(settings):
    bs = settings["block_size"]
    kv = KVCacheManager(settings["num_blocks"] - 1, bs,
                        enable_prefix_caching=not settings["no_prefix_caching"],
                        max_model_len=settings["max_model_len"])
    return Scheduler(kv, SchedulerConfig(
        max_num_seqs=settings["max_num_seqs"],
        max_num_batched_tokens=settings["max_num_batched_tokens"],
        max_model_len=settings["max_model_len"],
        policy="priority" if settings["priority"] else "fcfs"))


def replay(requests, settings):
    """Step the scheduler with the oracle's arrival clock; record what each step did."""
    sched = make_scheduler(settings)
    pending, clock, steps, seqs = list(requests), 0, [], {}
    while pending or sched.has_unfinished():
        while pending and pending[0][0] <= clock:
            seq = Sequence(pending.pop(0)[1], settings["block_size"])
            seqs[seq.request_id] = seq
            sched.add(seq)
        if not sched.has_unfinished():
            clock = pending[0][0]
            continue
        plan = sched.schedule()
        sched.update_from_output()
        steps.append(({s.request_id: s.num_new_tokens for s in plan.scheduled},
                      list(plan.preempted)))
        clock += 1
    return steps, seqs


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
