"""Prefill runs: steps where the newest running request prefills a chunk that uses up the
token budget beside requests that only decode, committed at once as a decode run with the
same blocks, counters and step facts as planning them one at a time."""

import pytest

from kvsim.cache.cpu_offload import LRUOffloadingManager
from kvsim.cache.kv_cache_manager import KVCacheManager
from kvsim.cache.offloading import OffloadingKVCacheManager
from kvsim.cache.request_state import RequestState
from kvsim.cache.scheduler import Scheduler, SchedulerConfig
from kvsim.cache.tiered import HostTier, TieredKVCacheManager
from kvsim.workloads import Request


def decodes_and_a_long_prompt(kv=None, **config):
    """Requests 0 and 1 (30-token prompts, prefilled together in blocks 0-1 and 2-3) decode;
    request 2's 400-token prompt was admitted with the 62 tokens the budget of 64 left beside
    them (blocks 4-7)."""
    kv = kv or KVCacheManager(64, 16)
    scheduler = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=64, **config))
    for rid in (0, 1):
        scheduler.add(RequestState(Request(rid, 0.0, 30, 50), 16))
    scheduler.schedule()
    scheduler.update_from_output()
    scheduler.add(RequestState(Request(2, 0.0, 400, 10), 16))
    scheduler.schedule()
    scheduler.update_from_output()
    return scheduler


def test_a_prompt_prefilled_beside_decodes_is_a_run_of_whole_chunks():
    """338 prompt tokens are left: five chunks of 62 each leave some for the next step, so
    none of them emits a token or leaves budget for anyone; the sixth (28 tokens) is a normal
    step.
    In each step the decodes go first: at the second they open their third blocks (12, 13),
    then the chunk takes the next four."""
    scheduler = decodes_and_a_long_prompt()
    run = scheduler.plan_decode_run()
    assert [s.request_id for s in run.requests] == [0, 1]
    assert (run.prefill.seq.request_id, run.prefill.num_new, run.max_steps) == (2, 62, 5)
    facts = scheduler.commit_decode_run(run, 5)
    assert facts.batch_size.tolist() == [3] * 5 and facts.num_prefill_tokens == 62
    assert facts.num_running.tolist() == [3] * 5
    assert facts.kv_used_blocks.tolist() == [12, 18, 22, 26, 30]
    assert facts.internal_slots.tolist() == [4, 36, 36, 36, 36]   # all three last blocks
    assert [scheduler.kv.block_ids(rid) for rid in (0, 1)] == [[0, 1, 12], [2, 3, 13]]
    assert scheduler.kv.block_ids(2) == [*range(4, 12), *range(14, 30)]
    assert [s.num_computed_tokens for s in scheduler.running] == [36, 36, 372]
    assert scheduler.plan_decode_run() is None
    plan = scheduler.schedule()
    assert [(s.request_id, s.num_new_tokens) for s in plan.scheduled] == [(0, 1), (1, 1),
                                                                         (2, 28)]
    assert [s.request_id for s in scheduler.update_from_output().first_tokens] == [2]


def test_a_prefill_run_leaves_the_cache_as_stepping_does():
    ran, stepped = decodes_and_a_long_prompt(), decodes_and_a_long_prompt()
    ran.commit_decode_run(ran.plan_decode_run(), 5)
    for _ in range(5):
        stepped.schedule()
        stepped.update_from_output()
    for rid in (0, 1, 2):
        assert ran.kv.block_ids(rid) == stepped.kv.block_ids(rid)
    assert ran.kv.free_queue() == stepped.kv.free_queue()
    assert len(ran.kv.pool.index) == len(stepped.kv.pool.index) == 2 + 2 + 23   # full blocks


def test_a_request_prefilling_alone_is_a_run_too():
    scheduler = Scheduler(KVCacheManager(64, 16), SchedulerConfig(max_num_batched_tokens=32))
    scheduler.add(RequestState(Request(0, 0.0, 200, 10), 16))
    scheduler.schedule()
    scheduler.update_from_output()
    run = scheduler.plan_decode_run()
    assert (run.requests, run.prefill.num_new, run.max_steps) == ([], 32, 5)
    facts = scheduler.commit_decode_run(run, 3)
    assert facts.batch_size.tolist() == [1] * 3
    assert facts.kv_used_blocks.tolist() == [4, 6, 8]
    assert scheduler.running[0].num_computed_tokens == 128


def test_no_prefill_run_when_the_chunk_leaves_budget_for_an_admission():
    """A long-prefill threshold of 16 caps the chunk below the 62 tokens left (budget is left
    for request 3 waiting): normal steps."""
    capped = decodes_and_a_long_prompt(long_prefill_token_threshold=16)
    capped.add(RequestState(Request(3, 0.0, 17, 5), 16))
    assert capped.plan_decode_run() is None


def _host_used(kv) -> int:
    return kv.host.num_cached_blocks + kv.host.num_pinned_blocks


TIERS = {"write-through": lambda: TieredKVCacheManager(64, 16, host=HostTier(64),
                                                       write="through"),
         "native-offloading": lambda: OffloadingKVCacheManager(
             64, 16, offload=LRUOffloadingManager(64))}


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_a_prefill_run_with_a_host_tier_copies_as_stepping_does(tier):
    """With a host tier the run's steps are committed one by one, each step's copies taken
    after its blocks: the same copies, host usage, blocks and counters as five normal steps.
    Every block filled is copied to the host the step after: at the second step the first
    chunk's four, then each chunk's four; written through, also the decodes' blocks 1 and 3
    (full at 32 tokens), which vLLM's offloading does not store (prompt blocks only)."""
    ran, stepped = decodes_and_a_long_prompt(TIERS[tier]()), decodes_and_a_long_prompt(
        TIERS[tier]())
    run = ran.plan_decode_run()
    assert (run.prefill.seq.request_id, run.max_steps, run.has_transfers) == (2, 5, True)
    facts = ran.commit_decode_run(run, 5)
    copies, host_used = [], []
    for _ in range(5):
        copies.append([(t.kind, t.pairs) for t in stepped.schedule().transfers])
        host_used.append(_host_used(stepped.kv))
        stepped.update_from_output()
    assert [[(t.kind, t.pairs) for t in step] for step in facts.transfers] == copies
    decodes = [1, 3] if tier == "write-through" else []
    assert [[gpu for gpu, _ in pairs] for step in copies for _, pairs in step] == [
        [4, 5, 6], [*decodes, 7, 8, 9, 10], [11, 14, 15, 16], [17, 18, 19, 20],
        [21, 22, 23, 24]]
    assert facts.host_used_blocks.tolist() == host_used
    for rid in (0, 1, 2):
        assert ran.kv.block_ids(rid) == stepped.kv.block_ids(rid)
    assert ran.kv.free_queue() == stepped.kv.free_queue()
    assert [s.num_computed_tokens for s in ran.running] == [
        s.num_computed_tokens for s in stepped.running] == [36, 36, 372]


def alone_after_its_first_chunk(prompt_tokens: int) -> Scheduler:
    scheduler = Scheduler(KVCacheManager(64, 16), SchedulerConfig(max_num_batched_tokens=32))
    scheduler.add(RequestState(Request(0, 0.0, prompt_tokens, 10), 16))
    scheduler.schedule()
    scheduler.update_from_output()
    return scheduler


def test_a_prefill_run_needs_four_chunks_that_leave_more_to_do():
    """After a first chunk of 32, a 161-token prompt has 129 left: four chunks each leave
    some (a run of four steps); a 160-token prompt's fourth chunk would complete it, so three
    steps qualify: too few to pay for a run."""
    assert alone_after_its_first_chunk(161).plan_decode_run().max_steps == 4
    assert alone_after_its_first_chunk(160).plan_decode_run() is None
