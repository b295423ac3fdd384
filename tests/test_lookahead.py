"""The lookahead policy: queued lookups are protected, reused chains outlive one-off ones."""

import numpy as np
import pytest

from kvsim.cache.hitrate import ReplayRequest, hitrate_curves, policy_hits
from kvsim.cache.lookahead_pool import LookaheadPool
from kvsim.cache.eviction import make_policy, make_pool
from kvsim.workloads.request import Request
from pool_stories import put


def req(hashes, prompt_tokens, arrival_s):
    return ReplayRequest(np.array(hashes, dtype=np.int64), (prompt_tokens - 1) // 4,
                         prompt_tokens, 0, arrival_s)


def test_a_block_a_queued_request_will_look_up_is_evicted_last():
    pool = make_pool(3, policy=make_policy("lookahead"))
    assert type(pool) is LookaheadPool
    a, b, c = put(pool, 1), put(pool, 2), put(pool, 3)
    pool.policy.enqueue("r", [1, 99])        # a queued request will look up 1 (then 99)
    clock = pool.key_of(a)[1]
    assert pool.key_of(a) == pool.policy.key(pool, a, 1, clock) == (1, clock, 1)
    assert put(pool, 4) == b                 # LRU would take a, the oldest
    assert pool.index.get(1) == a and pool.policy.wanted.counts == {1: 1}   # 99 is not cached
    pool.policy.dequeue("r")
    assert pool.policy.wanted.counts == {}


def test_a_queued_lookup_reaches_blocks_cached_while_it_waits():
    pool = make_pool(4, policy=make_policy("lookahead"))
    a = put(pool, 1)
    pool.policy.enqueue("r", [1, 2, 3, 4])   # its lookup would hit [1] now
    pool.policy.enqueue("s", [1, 2, 5])
    assert pool.policy.wanted.counts == {1: 2}
    b, c = pool.get_new_blocks(2)            # another request fills 2 and 3 after 1
    pool.cache_blocks([b, c], [2, 3], 1, a)
    assert pool.policy.wanted.counts == {1: 2, 2: 2, 3: 1}    # s still stops before 5
    pool.free_blocks([c, b])
    d = put(pool, 9)
    assert put(pool, 10) == d                # 1, 2 and 3 are protected: the unwanted 9 goes
    pool.policy.dequeue("r")
    assert pool.policy.wanted.counts == {1: 1, 2: 1}
    pool.policy.dequeue("s")
    assert pool.policy.wanted.counts == {} and pool.policy._blocked == {}


def test_a_request_is_queued_once_at_a_time():
    policy = make_policy("lookahead")
    policy.enqueue("r", [1])
    with pytest.raises(ValueError, match="queued already"):
        policy.enqueue("r", [1])
    policy.dequeue("r")
    policy.enqueue("r", [1])                 # again after admission (a preemption)
    assert policy.queued == ["r"] and policy.wanted.counts == {1: 1}   # no pool: every hash counts


def test_protection_yields_when_every_free_block_is_protected():
    pool = make_pool(2, policy=make_policy("lookahead"))
    a, b = put(pool, 1), put(pool, 2)
    pool.policy.enqueue("r", [1]), pool.policy.enqueue("s", [2])
    assert put(pool, 3) == a                 # both protected: LRU among them


def test_a_continued_chain_outlives_newer_one_off_prompts():
    # turn 1 [1, 2], turn 2 continues it [1, 2, 3]: reused; then two one-off prompts
    trace = [req([1, 2], 9, 0), req([1, 2, 3], 13, 100), req([7], 5, 200), req([8], 5, 300),
             req([1, 2, 3, 4], 17, 400)]
    assert policy_hits(trace, "lru", 4) == 2 + 2          # LRU drops 3 (released before 7)
    assert policy_hits(trace, "lookahead", 4) == 2 + 3    # 7 goes: 3 has a lifetime's credit


def test_the_reused_mark_skips_a_shared_first_block():
    pool = make_pool(6, policy=make_policy("lookahead"))
    blocks = pool.get_new_blocks(2)
    pool.cache_blocks(blocks, [1, 2])
    pool.free_blocks(reversed(blocks))
    pool.touch(blocks[:1])                                # only the shared first block hit
    new = pool.get_new_blocks(1)
    pool.cache_blocks(new, [5], 1, blocks[0])
    assert not pool.reused[new[0]] and not pool.reused[blocks[0]]
    pool.touch(blocks[1:])                                # now a 2-block prefix: a continuation
    pool.free_blocks(new + blocks)
    pool.touch(blocks)
    more = pool.get_new_blocks(1)
    pool.cache_blocks(more, [3], 2, blocks[1])
    assert pool.reused[blocks[1]] and pool.reused[more[0]] and not pool.reused[blocks[0]]


def test_the_replay_window_stands_in_for_the_waiting_queue():
    trace = [req([1], 5, 0), req([2], 5, 1), req([3], 5, 2), req([1], 5, 3)]
    assert policy_hits(trace, "lru", 2) == 0
    assert policy_hits(trace, "lookahead", 2, lookahead_s=0) == 0
    assert policy_hits(trace, "lookahead", 2, lookahead_s=5) == 1   # 1 queued: B goes


def test_hitrate_reports_each_policys_share_of_beladys_gain():
    requests = [Request(i, float(i), 5, 1, prefix_hashes=np.array(h), hash_block_size=4)
                for i, h in enumerate([[1], [2], [3], [1], [2]])]
    result = hitrate_curves(requests, [2, 3], ["lru", "lookahead", "belady"], 4,
                            lookahead_s=0.0)
    share = {(r["policy"], r["capacity_blocks"]): r["belady_share"] for r in result["rows"]}
    assert share[("lru", 2)] == 0.0 and share[("belady", 2)] == 1.0
    assert share[("lru", 3)] is None          # capacity 3 holds everything: no gain to share
    assert result["lookahead_s"] == 0.0


def test_the_scheduler_tells_lookahead_who_waits_and_who_was_admitted():
    from kvsim.cache.kv_cache_manager import KVCacheManager
    from kvsim.cache.scheduler import Scheduler, SchedulerConfig
    from kvsim.cache.request_state import RequestState
    kv = KVCacheManager(8, 4, policy=make_policy("lookahead"))
    sched = Scheduler(kv, SchedulerConfig(max_model_len=64, max_num_batched_tokens=9))
    first = RequestState(Request(0, 0.0, 9, 1, prompt_token_ids=np.arange(9)), 4)
    second = RequestState(Request(1, 0.0, 9, 1, prompt_token_ids=np.arange(100, 109)), 4)
    sched.add(first)
    sched.add(second)
    policy = kv.pool.policy
    assert policy.queued == [0, 1] and policy.wanted.counts == {}    # nothing cached to reach yet
    sched.schedule()                              # the budget admits the first only
    assert policy.queued == [1]


def test_only_the_head_of_the_queue_is_tracked_and_a_lookup_is_read_when_it_moves_up():
    pool = make_pool(4, policy=make_policy("lookahead"))
    pool.policy.window = 1
    put(pool, 1), put(pool, 2)
    read = []

    def lookup(hashes):
        return lambda: read.append(hashes) or hashes
    pool.policy.enqueue("r", lookup([1]))
    pool.policy.enqueue("s", lookup([2]))                 # behind the window: not read yet
    assert (read, pool.policy.wanted.counts, pool.policy.queued) == ([[1]], {1: 1}, ["r", "s"])
    pool.policy.enqueue("p", [2, 9], front=True)           # preempted: tracked at once
    assert pool.policy.wanted.counts == {1: 1, 2: 1}
    pool.policy.dequeue("r")                               # s still waits: p fills the window
    assert read == [[1]] and pool.policy.wanted.counts == {2: 1}
    pool.policy.dequeue("p")                               # now s moves up
    assert read == [[1], [2]] and pool.policy.wanted.counts == {2: 1}
    pool.policy.enqueue("t", [1])
    pool.policy.dequeue("t")                               # admitted before it moved up
    assert pool.policy.queued == ["s"]


def test_the_scheduler_looks_ahead_as_far_as_one_step_admits():
    from kvsim.cache.kv_cache_manager import KVCacheManager
    from kvsim.cache.scheduler import Scheduler, SchedulerConfig
    kv = KVCacheManager(8, 4, policy=make_policy("lookahead"))
    Scheduler(kv, SchedulerConfig(max_model_len=64, max_num_seqs=3))
    assert kv.pool.policy.window == 3


def test_wanted_hashes_count_like_a_counter_under_random_lookups():
    import random
    from collections import Counter

    from kvsim.cache.lookahead import WantedHashes
    for seed in range(50):
        rng, wanted, ref, live = random.Random(seed), WantedHashes(), Counter(), []
        for _ in range(200):
            if live and rng.random() < 0.45:
                hashes = live.pop(rng.randrange(len(live)))
                wanted.remove(hashes)
                ref.subtract(hashes)
            else:
                hashes = rng.sample(range(30), rng.randint(0, 8))
                live.append(hashes)
                wanted.add(hashes)
                ref.update(hashes)
            expected = {h: c for h, c in ref.items() if c}
            assert wanted.counts == expected and len(wanted) == len(expected)
            assert all((h in wanted) == (h in expected) for h in range(30))
