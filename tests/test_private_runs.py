"""A finished request's private chain in the scored pool is released and evicted as one run
(``kvsim.cache.private_runs``): the same victims, in the same order, and the same pool state as
releasing and walking it block by block."""

import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvsim.cache.eviction import make_policy
from kvsim.cache.scored_pool import ScoredBlockPool


class BlockByBlock(ScoredBlockPool):
    """The scored pool without runs: every release and eviction goes block by block."""

    def _split_run(self, block_ids, chain):
        return []


def state(pool) -> tuple:
    """Everything the two paths must agree on (the runs' parked blocks written out first; a
    block no longer cached keeps the entry and links of an older life, which nothing reads)."""
    order = pool.cached_free_order()
    chains = [(pool._entry[b], pool.parent_hashes[b], pool._parent_holder[b]) for b in order]
    return (order, chains, pool.block_hashes, pool.ref_counts,
            pool.hits, pool.num_children, pool._live, sorted(pool._heap),
            pool.num_cached_free_blocks, pool.num_evictions, list(pool._free))


def finish(pool, blocks: list[int], num_shared: int, num_private: int) -> None:
    """As the KV manager frees a finished request: its private blocks cached as unreachable,
    then every block released, tail first."""
    parent = blocks[num_shared - 1] if num_shared else None
    pool.cache_unreachable(blocks[num_shared:num_shared + num_private], parent)
    pool.free_blocks(reversed(blocks))


def test_a_private_run_is_released_parked_and_evicted_in_one_go():
    pools = ScoredBlockPool(16, policy=make_policy("lfu")), BlockByBlock(16, policy=make_policy("lfu"))
    for pool in pools:
        a = pool.get_new_blocks(7)                # two shared blocks, four private, one partial
        pool.cache_blocks(a[:2], [101, 102])
        finish(pool, a, 2, 4)
        b = pool.get_new_blocks(4)                # A's partial block first, four private
        finish(pool, b, 0, 4)
    runs, plain = pools
    assert [blocks for blocks, _, _ in runs._runs.values()] == [[5, 4, 3, 2], [9, 8, 7, 6]]
    assert runs._heap == plain._heap and len(runs._heap) == 2     # the two tails only
    # the unhashed blocks, then A's run from its tail (below B's tail 9): 5 and 4 in one go
    assert [p.get_new_blocks(8) for p in pools] == [[10, 11, 12, 13, 14, 15, 5, 4]] * 2
    assert [blocks[start] for blocks, _, start in runs._runs.values()] == [9, 3]
    # then the rest of A's run, its shared blocks (their only child gone), B's tail
    assert [p.get_new_blocks(5) for p in pools] == [[3, 2, 1, 0, 9]] * 2
    assert state(runs) == state(plain)


def admit(pool, rid, hashes: list[int], num_private: int, partial: int) -> list[int] | None:
    """As the KV manager admits a request: its cached prefix hit, new blocks for the rest (the
    shared ones cached); None, with the hit given back, when the pool is too small."""
    hit = pool.index.find_prefix(hashes)
    pool.begin(rid)
    pool.touch(hit)
    need = len(hashes) - len(hit) + num_private + partial
    if need > pool.num_free_blocks:
        pool.free_blocks(reversed(hit))
        return None
    new = pool.get_new_blocks(need)
    fresh = len(hashes) - len(hit)
    pool.cache_blocks(new[:fresh], hashes[len(hit):], len(hit), hit[-1] if hit else None)
    return hit + new


@pytest.mark.parametrize("seed", range(12))
def test_runs_match_the_block_by_block_walk_on_random_traffic(seed):
    """Requests sharing prefixes of a few families, hitting, caching, finishing and evicting on
    a small pool, now and then the heap rebuilt (which writes the runs out and forgets them) or
    every free block read (which writes them out and keeps them)."""
    rng = random.Random(seed)
    pools = [cls(24, policy=make_policy("lfu")) for cls in (ScoredBlockPool, BlockByBlock)]
    held, logs = {}, ([], [])
    for rid in range(400):
        if rng.random() < 0.03:         # the heap rebuilt (as when stale entries pile up)
            for pool in pools:
                pool._compact()
        if rng.random() < 0.03:         # a reader of every block (the runs written out, kept)
            assert pools[0].cached_free_order() == pools[1].cached_free_order()
        if held and (rng.random() < 0.45 or len(held) > 4):
            blocks, num_shared, num_private = held.pop(rng.choice(sorted(held)))
            for pool in pools:
                finish(pool, blocks, num_shared, num_private)
            continue
        family, num_shared = rng.randrange(3), rng.randrange(5)
        hashes = [family * 100 + i for i in range(num_shared)]
        num_private, partial = rng.randrange(9), rng.randrange(2)
        taken = [admit(pool, rid, hashes, num_private, partial) for pool in pools]
        for log, blocks in zip(logs, taken):
            log.append(blocks)
        assert taken[0] == taken[1]
        if taken[0] is not None:
            held[rid] = (taken[0], num_shared, num_private)
    assert logs[0] == logs[1]
    assert state(pools[0]) == state(pools[1])


class RunsMachine(RuleBasedStateMachine):
    """The same traffic, chosen by hypothesis (which shrinks a failure to its shortest story):
    after every step the pool with runs and the block-by-block one agree on what a run leaves
    as it is, and on everything when the pool is read whole."""

    def __init__(self):
        super().__init__()
        self.pools = [cls(12, policy=make_policy("lfu")) for cls in (ScoredBlockPool, BlockByBlock)]
        self.held: dict[int, tuple] = {}
        self.next_id = 0

    @rule(family=st.integers(0, 2), num_shared=st.integers(0, 4),
          num_private=st.integers(0, 6), partial=st.integers(0, 1))
    def request(self, family, num_shared, num_private, partial):
        hashes = [family * 100 + i for i in range(num_shared)]
        rid, self.next_id = self.next_id, self.next_id + 1
        taken = [admit(pool, rid, hashes, num_private, partial) for pool in self.pools]
        assert taken[0] == taken[1]
        if taken[0] is not None:
            self.held[rid] = (taken[0], num_shared, num_private)

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 10 ** 6))
    def finish(self, pick):
        blocks, num_shared, num_private = self.held.pop(sorted(self.held)[pick % len(self.held)])
        for pool in self.pools:
            finish(pool, blocks, num_shared, num_private)

    @rule()
    def compact(self):
        for pool in self.pools:
            pool._compact()

    @rule()
    def read_whole(self):           # (writes the runs out: everything compared)
        assert state(self.pools[0]) == state(self.pools[1])

    @invariant()
    def agree(self):                # (what needs no writing out: runs stay as they are)
        def seen(pool):
            return (pool.block_hashes, pool.ref_counts, pool.hits, pool._live,
                    sorted(pool._heap), pool.num_cached_free_blocks, list(pool._free))
        assert seen(self.pools[0]) == seen(self.pools[1])


RunsMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_runs_machine = RunsMachine.TestCase
