"""ARC and S3-FIFO on a block pool: textbook stories with exact block ids, and invariants."""

import random

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvsim.cache import BlockPool
from kvsim.cache.queue_pool import QueuePool
from kvsim.cache.eviction import make_policy, make_pool
from pool_stories import put, use


def test_queue_policies_get_a_queue_pool():
    for name in ("arc", "s3fifo"):
        assert type(make_pool(4, policy=make_policy(name))) is QueuePool


# --- ARC ----------------------------------------------------------------------------------

def test_arc_a_hit_promotes_to_t2_and_a_scan_cannot_flush_it():
    pool = make_pool(4, policy=make_policy("arc"))
    arc = pool.policy
    assert put(pool, 100) == 0 and use(pool, 100) == 0       # A: used twice -> T2
    assert (arc.num_t1, arc.num_t2) == (0, 1)
    assert [put(pool, h) for h in (1, 2, 3)] == [1, 2, 3]    # a scan of one-off blocks: T1
    assert [put(pool, h) for h in (4, 5, 6)] == [1, 2, 3]    # each evicts T1's oldest
    assert pool.index.get(100) == 0                          # LRU would have evicted A first
    assert list(arc.b1) == [1, 2, 3] and not arc.b2 and arc.target_t1 == 0


def test_lru_loses_the_reused_block_in_the_same_story():
    pool = BlockPool(4)
    put(pool, 100), use(pool, 100)
    for h in (1, 2, 3, 4):
        put(pool, h)
    assert pool.index.get(100) is None


def test_arc_ghost_hits_move_the_target_both_ways():
    pool = make_pool(4, policy=make_policy("arc"))
    arc = pool.policy
    for h in (1, 2, 3, 4, 5):            # 1 is evicted from T1 into B1
        put(pool, h)
    assert list(arc.b1) == [1]
    assert put(pool, 1) == 1             # B1 hit: T1 was too small, p += max(1, 0 // 1)
    assert arc.target_t1 == 1 and arc.in_t2[1] and 1 not in arc.b1
    # now |T1| = 3 > p = 1: T1's oldest free (hash 3, block 2) goes; block 1 (T2) stays
    assert put(pool, 6) == 2 and list(arc.b1) == [2, 3]
    for h in (7, 8):                     # |T1| = 3, 2 > p still: T1 keeps losing
        put(pool, h)
    assert pool.index.get(1) == 1
    arc.target_t1 = 4                    # with T1 under target the victim comes from T2
    assert not arc.evicts_t1() and put(pool, 9) == 1 and list(arc.b2) == [1]
    assert len(arc.b1) == 4              # B1 is bounded by the pool size
    assert put(pool, 1) == 2 and arc.target_t1 == 0      # B2 hit: p -= max(1, |B1| // |B2|)
    assert arc.in_t2[pool.index.get(1)]


def test_arc_never_evicts_held_blocks_and_counts_them():
    pool = make_pool(3, policy=make_policy("arc"))
    held = pool.get_new_blocks(2)
    pool.cache_blocks(held, [1, 2])
    put(pool, 3)
    assert pool.policy.num_t1 == 3 and pool.num_cached_free_blocks == 1
    assert put(pool, 4) == 2 and pool.index.get(1) == 0 and pool.index.get(3) is None


# --- S3-FIFO --------------------------------------------------------------------------------

def test_s3fifo_one_off_blocks_pass_through_the_small_queue_only():
    pool = make_pool(10, policy=make_policy("s3fifo"))   # small queue: 1 block
    s3 = pool.policy
    assert put(pool, 100) == 0 and use(pool, 100) == 0   # A hit once while in S
    for h in range(1, 10):
        put(pool, h)                                     # fills blocks 1..9, no eviction
    # S is over its share: A (freq 1) moves to M, then the oldest one-off (hash 1) goes
    assert put(pool, 10) == 1 and s3.in_main[0] and list(s3.ghost) == [1]
    for h in range(11, 30):                              # a long scan: S churns, A stays
        put(pool, h)
    assert pool.index.get(100) == 0


def test_s3fifo_a_ghost_comes_back_into_main_and_main_gives_second_chances():
    pool = make_pool(10, policy=make_policy("s3fifo"))
    s3 = pool.policy
    for h in range(12):                  # 0..9 fill, 10 and 11 evict hashes 0, 1 (ghosts)
        put(pool, h)
    assert list(s3.ghost) == [0, 1]
    a = put(pool, 0)                     # back soon: straight into M
    assert s3.in_main[a] and 0 not in s3.ghost and list(s3.main) == [a]
    use(pool, 0)                         # freq 1: survives one pass of M's clock
    b = put(pool, 1)                     # also into M, never hit
    s3.small_capacity = 100              # force evictions from M (S under its share)
    assert put(pool, 20) == b and pool.index.get(1) is None
    assert pool.index.get(0) == a and s3.freq[a] == 0 and list(s3.main) == [a]


def test_s3fifo_skips_held_blocks_at_the_eviction_end():
    pool = make_pool(10, policy=make_policy("s3fifo"))
    held = pool.get_new_blocks(1)
    pool.cache_blocks(held, [50])
    for h in range(1, 10):
        put(pool, h)
    assert put(pool, 10) == 1 and pool.index.get(50) == held[0]


# --- invariants under random operations -------------------------------------------------------

class QueuePoolMachine(RuleBasedStateMachine):
    """Random fills, hits and releases: counts agree, held blocks are never evicted."""

    def __init__(self):
        super().__init__()
        self.pool = None
        self.held: list[int] = []

    @precondition(lambda self: self.pool is None)
    @rule(name=st.sampled_from(["arc", "s3fifo"]), n=st.integers(1, 12))
    def start(self, name, n):
        self.pool = make_pool(n, policy=make_policy(name))

    @precondition(lambda self: self.pool is not None and self.pool.num_free_blocks > 0)
    @rule(block_hash=st.integers(0, 30))
    def fill(self, block_hash):
        if self.pool.index.get(block_hash) is not None:
            return
        block_id = self.pool.get_new_blocks(1)[0]
        assert block_id not in self.held
        self.pool.cache_block(block_id, block_hash)
        self.held.append(block_id)

    @precondition(lambda self: self.pool is not None)
    @rule(block_hash=st.integers(0, 30))
    def hit(self, block_hash):
        block_id = self.pool.index.get(block_hash)
        if block_id is not None:
            self.pool.touch([block_id])
            self.held.append(block_id)

    @precondition(lambda self: self.pool is not None and self.held)
    @rule(data=st.data())
    def release(self, data):
        block_id = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.pool.free_blocks([block_id])

    @invariant()
    def counts_agree(self):
        pool = self.pool
        if pool is None:
            return
        free = [b for b in range(pool.num_blocks) if pool.ref_counts[b] == 0]
        assert sorted(pool.free_queue()) == free
        assert pool.num_cached_free_blocks == sum(pool.is_cached(b) for b in free)
        assert all(pool.ref_counts[b] > 0 for b in self.held)
        for block_hash, block_id in pool.index._map.items():
            assert pool.block_hashes[block_id] == block_hash
        arc = pool.policy
        if arc.name == "arc":
            assert arc.num_t1 + arc.num_t2 == sum(pool.is_cached(b) for b in range(pool.num_blocks))
            assert len(arc.b1) <= pool.num_blocks and len(arc.b2) <= pool.num_blocks
        else:
            assert arc.num_main_free == sum(pool.ref_counts[b] == 0 for b in arc.main)


TestQueuePoolMachine = QueuePoolMachine.TestCase
TestQueuePoolMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@pytest.mark.parametrize("name", ["arc", "s3fifo"])
def test_reset_forgets_everything(name):
    pool = make_pool(5, policy=make_policy(name))
    for h in random.Random(1).sample(range(100), 8):
        put(pool, h)
    assert pool.reset_prefix_cache() and pool.num_cached_free_blocks == 0
    assert sorted(pool.free_queue()) == list(range(5)) and put(pool, 7) in range(5)


def test_s3fifo_finds_the_free_block_in_s_when_every_block_of_m_is_held():
    pool = make_pool(10, policy=make_policy("s3fifo"))
    s3 = pool.policy
    for h in range(12):                  # hashes 0, 1 evicted into the ghost
        put(pool, h)
    back = pool.get_new_blocks(1)        # 0 comes back into M and stays held
    pool.cache_blocks(back, [0])
    assert list(s3.main) == back
    s3.small_capacity = 100              # S under its share: M is asked first, has nothing
    victim = put(pool, 30)
    assert victim != back[0] and pool.index.get(0) == back[0]


@pytest.mark.parametrize("name", ["arc", "s3fifo"])
@pytest.mark.parametrize("seed", range(4))
def test_batched_hooks_evict_as_the_one_at_a_time_policies_did(name, seed):
    """The same requests (hits, new blocks, some held, the rest freed tail first) on the
    batched policy and on its one-call-per-block reference (tests/queue_reference.py): the
    same blocks taken, in the same order, and the same free queue after every request."""
    from queue_reference import RefARCPolicy, RefQueuePool, RefS3FIFOPolicy
    from test_cache_scored_order import serve, story
    reference = {"arc": RefARCPolicy, "s3fifo": RefS3FIFOPolicy}[name]
    pools = make_pool(12, policy=make_policy(name)), RefQueuePool(12, policy=reference())
    held = [], []
    for hashes, keep, priority in story(seed):
        for pool, its_held in zip(pools, held):
            serve(pool, hashes, its_held, keep, priority, lambda p, n: p.get_new_blocks(n))
        assert held[0] == held[1]
        assert pools[0].free_queue() == pools[1].free_queue()
    assert pools[0].num_evictions == pools[1].num_evictions > 100
