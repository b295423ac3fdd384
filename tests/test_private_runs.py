"""A finished request's private chain in the scored pool is released and evicted as one run
(``kvsim.cache.private_runs``): the same victims, in the same order, and the same pool state as
releasing and walking it block by block."""

import random

import pytest

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
        taken = []
        for pool, log in zip(pools, logs):
            hit = pool.index.find_prefix(hashes)
            pool.begin(rid)
            pool.touch(hit)
            need = num_shared - len(hit) + num_private + partial
            if need > pool.num_free_blocks:
                pool.free_blocks(reversed(hit))
                taken.append(None)
                continue
            new = pool.get_new_blocks(need)
            log.append(new)
            fresh = num_shared - len(hit)
            pool.cache_blocks(new[:fresh], hashes[len(hit):], len(hit), hit[-1] if hit else None)
            taken.append(hit + new)
        assert taken[0] == taken[1]
        if taken[0] is not None:
            held[rid] = (taken[0], num_shared, num_private)
    assert logs[0] == logs[1]
    assert state(pools[0]) == state(pools[1])
