"""The FIFO lanes of hybrid and lookahead (:class:`~kvsim.cache.lane_pool.LanePool`,
:class:`~kvsim.cache.lookahead_pool.LookaheadPool`) evict exactly as the scored pool's
definition says: the smallest key among blocks the chain rule allows. Checked against a
reference that keys every released block by the policy's ``key`` and applies the chain rule by
brute force, over random request stories with priorities and with requests queueing and
leaving."""

import random

import pytest
from pool_lockstep import lockstep_pool

from kvsim.cache import eviction
from kvsim.cache.eviction import make_policy, make_pool
from kvsim.cache.lane_pool import LanePool
from kvsim.cache.lookahead_pool import LookaheadPool
from kvsim.cache.scored_pool import ScoredBlockPool
from kvsim.sim.config import RunConfig
from kvsim.sim.serving.runner import simulate
from kvsim.workloads.generators import GenConfig, generate


class Reference:
    """Keys by the definition: given at release (``policy.key`` with the pool's release
    clock), the first part set to 1 when a queued lookup protects a free block."""

    def __init__(self, pool):
        self.pool, self.keys, self.clock, self.num_deferred = pool, {}, 0, 0
        self.parents = {}       # hash -> the hash before it in its chain (None: a first block)

    def cache(self, block_ids, hashes, hit):
        for i in range(len(hit), len(hashes)):
            self.parents[hashes[i]] = hashes[i - 1] if i else None
        self.pool.cache_blocks(block_ids, hashes[len(hit):], len(hit), hit[-1] if hit else None)

    def free(self, block_ids):
        pool = self.pool
        released = [b for b in block_ids if pool.ref_counts[b] == 1 and pool.is_cached(b)]
        for b in released:
            self.clock += 1
            self.keys[b] = pool.policy.key(pool, b, pool.block_hashes[b], self.clock)
        pool.free_blocks(block_ids)

    def touch(self, block_ids):
        for b in block_ids:
            self.keys.pop(b, None)
        self.pool.touch(block_ids)

    def enqueue(self, key, hashes):
        if not hasattr(self.pool.policy, "enqueue"):
            return
        for b in self.pool.index.find_prefix(hashes):
            if b in self.keys:
                self.keys[b] = (1, *self.keys[b][1:])
        self.pool.policy.enqueue(key, hashes)

    def victim(self) -> int:
        """The smallest key among eligible blocks (the scored pool's chain rule: a block waits
        while its content has a cached child and no other copy)."""
        pool, hashes = self.pool, self.pool.block_hashes
        cached = [b for b in range(pool.num_blocks) if hashes[b] is not None]

        def eligible(b):
            return (not any(self.parents[hashes[c]] == hashes[b] for c in cached)
                    or sum(hashes[c] == hashes[b] for c in cached) > 1)
        candidates = [b for b in self.keys if eligible(b)] or list(self.keys)
        victim = min(candidates, key=lambda b: (self.keys[b], b))
        self.num_deferred += victim != min(self.keys, key=lambda b: (self.keys[b], b))
        return victim


def lane_story(seed: int):
    """Requests on a tree of chained hashes; some wait in the queue before they run."""
    rng, ids = random.Random(seed), {}
    for _ in range(500):
        path = [rng.randrange(3)] + [rng.randrange(3) for _ in range(rng.randrange(6))]
        hashes = [ids.setdefault(tuple(path[:i + 1]), len(ids) + 1) for i in range(len(path))]
        yield hashes, rng.random() < 0.3, rng.random() < 0.7, rng.choice([0, 0, -1, 2])


def run_story(name: str, seed: int, one_by_one: bool) -> list[int]:
    pool = make_pool(16, policy=make_policy(name))
    ref, held, queued, victims, protected = Reference(pool), [], [], [], 0
    queueing = hasattr(pool.policy, "enqueue")
    for n, (hashes, keep, wait, priority) in enumerate(lane_story(seed)):
        if wait and queueing:            # queue it; the head of the queue may run now
            ref.enqueue(n, hashes)
            queued.append((n, hashes))
            if len(queued) < 6:
                continue
            n, hashes = queued[0]
        pool.begin(n, priority if name != "lookahead" else 0)
        hit = pool.index.find_prefix(hashes)
        need = len(hashes) - len(hit)
        if need > pool.num_free_blocks - len(hit):
            continue                     # not admitted (a queued one stays queued)
        if queued and queued[0][0] == n:     # admitted: it leaves the queue, hitting its blocks
            queued.pop(0)
            pool.policy.dequeue(n)
        ref.touch(hit)
        new = []
        for _ in range(need if one_by_one else 0):
            expected = ref.victim() if not pool._free else None
            protected += queueing and expected is not None and ref.keys[expected][0]
            new += pool.get_new_blocks(1)
            assert expected is None or new[-1] == expected
            ref.keys.pop(new[-1], None)
        if not one_by_one and need:
            new = pool.get_new_blocks(need)
            for b in new:
                ref.keys.pop(b, None)
        victims += new
        ref.cache(new, hashes, hit)
        held.append(hit + new)
        while len(held) > 2 or (held and not keep):
            ref.free(held.pop(0)[::-1])
        assert {b: pool.key_of(b) for b in ref.keys} == ref.keys
    assert pool.num_evictions > 150
    # the chain rule changes victims (a first block under a credited chain) except without a
    # credit (priority): then the keys keep it everywhere
    assert not one_by_one or ((protected >= 1 or not queueing)
                              and (ref.num_deferred > 10 or not pool.credit))
    return victims


@pytest.mark.parametrize("name", ["hybrid", "lookahead", "priority"])
@pytest.mark.parametrize("seed", range(4))
def test_every_victim_is_the_smallest_eligible_key_one_by_one_and_in_batches(name, seed):
    assert run_story(name, seed, one_by_one=True) == run_story(name, seed, one_by_one=False)


def test_lanes_release_in_order_and_the_credited_lane_counts_a_pool_size_more():
    pool = make_pool(5, policy=make_policy("lookahead"))
    assert type(pool) is LookaheadPool
    a = pool.get_new_blocks(3)
    pool.cache_blocks(a, [1, 2, 3])
    pool.free_blocks(a[::-1])                      # released 3, 2, 1: clocks 1, 2, 3
    pool.touch(pool.index.find_prefix([1, 2, 3]))   # a continued chain: 2 and 3 reused
    b = pool.get_new_blocks(2)
    pool.cache_blocks(b, [4, 5], 3, a[2])          # credited: they continue a reused chain
    pool.free_blocks([*b[::-1], *a[::-1]])         # clocks 4..8, tail first
    assert [pool.key_of(x) for x in (b[1], b[0], a[2], a[1], a[0])] == [
        (0, 4 + 5, 0), (0, 5 + 5, 0), (0, 6 + 5, 0), (0, 7 + 5, 0), (0, 8, 1)]
    assert pool.cached_free_order() == [a[0], b[1], b[0], a[2], a[1]]
    # the first block, uncredited, has the smallest key but waits for its credited child
    assert pool.get_new_blocks(5) == [b[1], b[0], a[2], a[1], a[0]]


def test_a_first_block_waits_for_its_children_only_while_it_is_the_only_copy():
    pool = make_pool(4, policy=make_policy("lookahead"))
    pool.cache_blocks(pool.get_new_blocks(2), [1, 2])           # X: blocks 0, 1
    pool.free_blocks([1, 0])
    pool.touch(pool.index.find_prefix([1, 2]))                  # X2 hits both: 1 reused
    pool.cache_blocks(pool.get_new_blocks(1), [1])              # Y computed 1 again: block 2
    pool.free_blocks([1, 0])                                    # X2: clocks 3 and 4
    pool.free_blocks([2])                                       # Y: clock 5
    assert [pool.key_of(b) for b in (0, 1, 2)] == [(0, 4, 1), (0, 3 + 4, 0), (0, 5, 1)]
    # 3 is unhashed; 0 may go (2 holds its content too); then 2, the last copy, waits for 1
    assert pool.get_new_blocks(4) == [3, 0, 1, 2]


def test_a_block_protected_while_free_keeps_its_clock_and_credit():
    pool = make_pool(6, policy=make_policy("lookahead"))
    a = pool.get_new_blocks(3)
    pool.cache_blocks(a, [1, 2, 3])
    pool.free_blocks(a[::-1])                       # clocks 1, 2, 3 for 3, 2, 1
    pool.policy.enqueue("w", [1, 2])                # protects the blocks of 1 and 2
    assert [pool.key_of(x) for x in a] == [(1, 3, 1), (1, 2, 1), (0, 1, 1)]
    assert pool.get_new_blocks(6)[3:] == [a[2], a[1], a[0]]   # unhashed first, then by key


def test_with_nothing_else_free_a_first_block_goes_and_its_children_count_by_hash():
    pool = make_pool(2, policy=make_policy("lookahead"))
    root, child = pool.get_new_blocks(2)
    pool.cache_blocks([root, child], [10, 11])
    pool.free_blocks([root])                        # its child is still held
    assert pool.get_new_blocks(1) == [root]         # deferred, but nothing else is free
    pool.cache_blocks([root], [10])                 # 10 again: child 11 still counts on it
    pool.free_blocks([root])
    pool.free_blocks([child])
    assert pool.get_new_blocks(1) == [child] and pool.get_new_blocks(1) == [root]


def test_a_deferred_first_block_can_be_protected_and_wakes_into_the_heap():
    pool = make_pool(3, policy=make_policy("lookahead"))
    a = pool.get_new_blocks(2)
    pool.cache_blocks(a, [1, 2])
    pool.cache_blocks(pool.get_new_blocks(1), [7])  # block 2, a first block of its own
    pool.free_blocks([a[0]])                        # clock 1, its child held
    pool.free_blocks([2])                           # clock 2
    assert pool.get_new_blocks(1) == [2]            # a[0] is deferred
    pool.policy.enqueue("w", [1, 2])
    assert pool.key_of(a[0]) == (1, 1, 1)
    pool.free_blocks([a[1]])                        # wanted: protected, clock 3
    assert pool.get_new_blocks(1) == [a[1]] and pool.get_new_blocks(1) == [a[0]]


def test_woken_first_blocks_go_back_in_release_order():
    pool = make_pool(4, policy=make_policy("lookahead"))
    a, b = pool.get_new_blocks(2), pool.get_new_blocks(2)
    pool.cache_blocks(a, [1, 2])
    pool.cache_blocks(b, [5, 6])
    pool.free_blocks([a[0]])                        # clock 1
    pool.free_blocks([b[0]])                        # clock 2
    pool.free_blocks([a[1]])                        # clock 3
    assert pool.get_new_blocks(1) == [a[1]]         # a[0], b[0] deferred; a[0] woken
    pool.cache_blocks([a[1]], [5])                  # a copy of 5: b[0] wakes, after a[0]
    assert pool.get_new_blocks(2) == [a[0], b[0]]


def test_a_released_table_protects_the_head_blocks_a_queued_lookup_reaches():
    pool = make_pool(7, policy=make_policy("lookahead"))
    a = pool.get_new_blocks(5)
    pool.cache_blocks(a, [1, 2, 3, 4, 5])
    pool.policy.enqueue("w", [1, 2, 3, 9])          # held: nothing to protect yet
    pool.touch(a[:1])                               # another request holds the first block
    pool.free_blocks(a[::-1])                       # clocks 1..4 for a[4], a[3], a[2], a[1]
    assert [pool.key_of(x) for x in a[:0:-1]] == [(0, 1, 1), (0, 2, 1), (1, 3, 1), (1, 4, 1)]
    pool.free_blocks(a[:1])                         # clock 5, wanted too
    assert pool.key_of(a[0]) == (1, 5, 1)
    assert pool.get_new_blocks(7)[2:] == [a[4], a[3], a[2], a[1], a[0]]


def test_an_evicted_block_forgets_its_hit():
    pool = make_pool(6, policy=make_policy("lookahead"))
    a = pool.get_new_blocks(3)
    pool.cache_blocks(a, [1, 2, 3])
    pool.free_blocks(a[::-1])
    pool.touch(pool.index.find_prefix([1, 2, 3]))      # hit: a continued chain, 2 and 3 reused
    pool.free_blocks(a[::-1])
    assert list(pool.was_hit) == [1, 1, 1, 0, 0, 0]
    assert pool.get_new_blocks(6) == [3, 4, 5, 2, 1, 0]  # unhashed first, then tail first
    assert list(pool.was_hit) == [0] * 6
    pool.cache_blocks([3, 2], [10, 11])                 # a new chain on the evicted blocks
    pool.cache_blocks([4], [12], 2, 2)                  # continues it from block 2
    assert pool.reused[4] == 0                          # a chain nobody reused


@pytest.mark.parametrize("name", ["priority", "hybrid"])
def test_the_lanes_evict_as_the_scored_pool_in_a_run_that_holds_content_twice(name, monkeypatch):
    """The stories above never hold content twice; a greedy chat run on a small pool does (two
    requests filling the same block at once), with priorities 0-2: every allocation of the
    lanes, run in lockstep with the scored pool, gives its blocks."""
    lanes = lockstep_pool(LanePool, lambda n, caching: ScoredBlockPool(
        n, caching, make_policy(name)), shared=("prio", "reused"))
    monkeypatch.setitem(eviction.POOL_CLASSES, "lanes", lanes)
    requests = generate("chat", GenConfig(num_requests=1500, seed=1))
    for i, request in enumerate(requests):
        request.priority = i % 3
    run = simulate(requests, RunConfig(model="llama-2-7b", num_gpu_blocks=300, eviction=name,
                                       scheduling_policy="priority", sampling="greedy"))
    pool = run.replicas[0].kv.pool
    assert pool.num_checked > 2000 and pool.num_copies > 100
