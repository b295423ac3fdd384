"""LFU's pool (:class:`~kvsim.cache.lfu_pool.LFUPool`): an LRU free queue per hit count, with
the victims of the scored pool's definition (:class:`~kvsim.cache.scored_pool.ScoredBlockPool`
keyed by ``(hits, release clock)`` under the chain rule), but for content held twice."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvsim.cache.eviction import make_policy
from kvsim.cache.kv_cache_manager import KVCacheManager
from kvsim.cache.lfu_pool import LFUPool
from kvsim.cache.scored_pool import ScoredBlockPool


class Prompt:
    """Tokens known by block hashes (four tokens a block)."""

    def __init__(self, hashes, num_tokens):
        self.hashes, self.n = list(hashes), num_tokens

    def __len__(self):
        return self.n

    def block_hashes(self, start, end):
        return self.hashes[start:end]


def serve(kv: KVCacheManager, rid, hashes, keep=False):
    """Look up and allocate ``hashes`` plus one token (its last block stays uncached); free
    it unless ``keep``. Returns its blocks."""
    prompt = Prompt(hashes, len(hashes) * 4 + 1)
    hit = kv.lookup(prompt)
    assert kv.allocate(rid, prompt, len(prompt) - hit.num_tokens, hit) is not None
    blocks = kv.block_ids(rid)
    if not keep:
        kv.free(rid)
    return blocks


def test_hit_counts_are_queues_and_the_lowest_goes_first():
    kv = KVCacheManager(8, 4, policy=make_policy("lfu"))
    assert serve(kv, "a", [1, 2]) == [0, 1, 2]   # 0, 1 cached (clocks 2, 1); 2 uncached
    assert serve(kv, "b", [1, 2, 3]) == [0, 1, 2, 3]    # a hit on 0 and 1; 2 now holds 3
    assert serve(kv, "c", [4]) == [3, 4]        # the head of count 0's queue
    pool = kv.pool
    assert pool.free_queue() == [4, 5, 6, 7, 2, 3, 1, 0]   # uncached, then by (hits, clock)
    assert [pool.key_of(b) for b in (2, 3, 1, 0)] == [(0, 3), (0, 6), (1, 4), (1, 5)]
    assert pool.cached_free_order() == [2, 3, 1, 0]
    assert pool.get_new_blocks(6) == [4, 5, 6, 7, 2, 3]    # count 0's queue: a run
    assert pool.get_new_blocks(1) == [1]        # then count 1's, a request's tail first
    assert pool.num_evictions == 3 and pool.index.get(1) == 0 and pool.index.get(2) is None


def test_a_hit_takes_a_free_block_out_of_its_queue_and_counts_once_more():
    kv = KVCacheManager(6, 4, policy=make_policy("lfu"))
    serve(kv, "a", [1])
    serve(kv, "b", [1])                     # block 0: one hit, in count 1's queue
    serve(kv, "c", [1], keep=True)          # a second hit, held
    assert kv.pool.hits[0] == 2 and 0 not in kv.pool.free_queue()
    kv.free("c")
    assert kv.pool.free_queue()[-1] == 0 and kv.pool.key_of(0)[0] == 2
    assert sorted(kv.pool._queues) == [0, 2]    # count 1's queue, left empty, is gone


def test_a_reset_forgets_content_and_keeps_the_order():
    kv = KVCacheManager(6, 4, policy=make_policy("lfu"))
    serve(kv, "a", [1, 2])
    serve(kv, "b", [1, 3])
    order = kv.pool.free_queue()
    assert kv.reset_prefix_cache()
    assert kv.pool.free_queue() == order and kv.pool.num_cached_free_blocks == 0
    assert kv.pool.get_new_blocks(6) == order and kv.pool.num_evictions == 0


def test_a_younger_copy_whose_child_was_hit_through_the_older_one_can_go_first():
    """The case the keys miss (cache/lfu_pool.py): X fills hash 100 first, then Y a copy and
    C a child (200) after it; a request hits both through X. X goes (a copy may), then Y and C
    are freed: Y has no hit, C one, so Y goes first and C is left unreachable, where the
    scored pool keeps Y until C goes."""
    found = {}
    for pool in (LFUPool(3, policy=make_policy("lfu")),
                 ScoredBlockPool(3, policy=make_policy("lfu"))):
        x, = pool.get_new_blocks(1)
        pool.cache_blocks([x], [100])
        y, c = pool.get_new_blocks(2)
        pool.cache_blocks([y, c], [100, 200])
        pool.free_blocks([x])
        pool.touch([x, c])
        pool.free_blocks([c, x])
        first = pool.get_new_blocks(1)
        pool.free_blocks([c, y])
        found[type(pool).__name__] = (first, pool.get_new_blocks(1), pool.index.get(200))
    assert found == {"LFUPool": ([0], [1], 2), "ScoredBlockPool": ([0], [2], None)}


class LFUAgainstScored(RuleBasedStateMachine):
    """Requests on a small tree of chained hashes run on LFU's queues and on the scored pool
    side by side: every block id, free order and count agrees. (Each is allocated whole, so
    no chain continues from a copy.)"""

    @initialize(num_blocks=st.integers(4, 24))
    def setup(self, num_blocks):
        self.kvs = [KVCacheManager(num_blocks, 4, policy=make_policy("lfu")) for _ in range(2)]
        self.kvs[1].pool = ScoredBlockPool(num_blocks, policy=make_policy("lfu"))
        assert type(self.kvs[0].pool) is LFUPool
        self.running, self.next_id = [], 0

    @rule(path=st.lists(st.integers(0, 2), min_size=1, max_size=6), extra=st.integers(0, 3))
    def admit(self, path, extra):
        hashes = [hash(tuple(path[:i + 1])) for i in range(len(path))]
        prompt = Prompt(hashes, len(hashes) * 4 + extra)
        got = []
        for kv in self.kvs:
            hit = kv.lookup(prompt)
            got.append((hit.block_ids, kv.allocate(self.next_id, prompt,
                                                   len(prompt) - hit.num_tokens, hit)))
        assert got[0] == got[1]
        if got[0][1] is not None:
            self.running.append(self.next_id)
        self.next_id += 1

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 99))
    def finish(self, i):
        rid = self.running.pop(i % len(self.running))
        for kv in self.kvs:
            kv.free(rid)

    @precondition(lambda self: not self.running)
    @rule()
    def reset(self):
        assert self.kvs[0].reset_prefix_cache() == self.kvs[1].reset_prefix_cache()

    @invariant()
    def same_pools(self):
        if not hasattr(self, "kvs"):
            return
        queues, scored = (kv.pool for kv in self.kvs)
        assert queues.free_queue() == scored.free_queue()
        assert queues.num_cached_free_blocks == scored.num_cached_free_blocks
        assert queues.num_evictions == scored.num_evictions
        assert len(queues.index) == len(scored.index)
        assert [queues.key_of(b) for b in queues.cached_free_order()] == \
            [scored.key_of(b) for b in scored.cached_free_order()]


TestLFUAgainstScored = LFUAgainstScored.TestCase
TestLFUAgainstScored.settings = settings(max_examples=150, stateful_step_count=40,
                                         deadline=None)
