"""The LRU pool counts a take's evictions from its free queue's order (empty blocks ahead of
cached ones) instead of reading each block's mark: random calls, every kind the pool offers,
give exactly the state of a pool that always reads the marks."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.cache.block_pool import BlockPool


class MarkReadingPool(BlockPool):
    """The pool as it was: every take reads the marks of the blocks it takes."""

    @property
    def _empty_first(self):
        return False

    @_empty_first.setter
    def _empty_first(self, value):
        pass


def _state(pool: BlockPool):
    return (pool.free_queue(), pool.num_cached_free_blocks, pool.num_evictions,
            dict(pool.index._map), list(pool.block_hashes), pool.ref_counts.tolist(),
            pool._content.tolist(), list(pool.evicted or ()))


OPERATIONS = ("take", "cache", "unreachable", "free", "touch", "claim", "release", "refresh",
              "put", "reset")


def _apply(pool: BlockPool, op: str, data, holders: list, claimed: list, hashes: list):
    """One call of kind ``op`` on ``pool``, its arguments drawn from ``data`` (the same
    draws for both pools: they are replayed)."""
    held = [b for h in holders for b in h]
    free_cached = [b for b in pool.free_queue() if pool.is_cached(b)]
    if op == "take" and len(pool._free):
        holders.append(pool.get_new_blocks(data.draw(st.integers(1, len(pool._free)))))
    elif op in ("cache", "unreachable") and held:
        blocks = [b for b in dict.fromkeys(data.draw(st.lists(st.sampled_from(held),
                                                             max_size=4)))
                  if not pool.is_cached(b)]
        if op == "cache":
            pool.cache_blocks(blocks, [data.draw(st.integers(0, 30)) for _ in blocks])
        else:
            pool.cache_unreachable(blocks)
    elif op == "free" and holders:
        blocks = holders.pop(data.draw(st.integers(0, len(holders) - 1)))
        pool.free_blocks(data.draw(st.permutations(blocks)))
    elif op == "touch" and (free_cached or held):
        blocks = list(dict.fromkeys(data.draw(st.lists(st.sampled_from(free_cached + held),
                                                       min_size=1, max_size=3))))
        pool.touch(blocks)
        holders.append(blocks)
    elif op == "claim" and len(pool._free):
        free = pool.free_queue()
        blocks = list(dict.fromkeys(data.draw(st.lists(st.sampled_from(free), min_size=1,
                                                       max_size=3))))
        pool.claim(blocks)
        claimed.append(blocks)
    elif op == "release" and claimed:
        pool.release(claimed.pop())
    elif op == "refresh" and free_cached:
        pool.refresh_many(data.draw(st.lists(st.sampled_from(free_cached), max_size=3)))
    elif op == "put" and len(pool._free):
        new = [h for h in range(100 + len(hashes), 100 + len(hashes) + 3)
               if len(pool._free) > 2]
        hashes.extend(new)
        pool.put_cached_run(new[:data.draw(st.integers(0, len(new)))])
    elif op == "reset" and not held and not claimed:
        pool.reset_prefix_cache()


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.booleans(), st.data())
def test_counted_evictions_equal_read_marks(num_blocks, keep_evicted, data):
    pools = [BlockPool(num_blocks), MarkReadingPool(num_blocks)]
    for pool in pools:
        pool.evicted = [] if keep_evicted else None
    ops = data.draw(st.lists(st.sampled_from(OPERATIONS), max_size=40))
    draws = []      # (every draw of the first pool's calls, replayed for the second)

    class Recorded:
        def __init__(self, replay=None):
            self.replay = replay

        def draw(self, strategy):
            if self.replay is not None:
                return self.replay.pop(0)
            value = data.draw(strategy)
            draws.append(value)
            return value

    worlds = [([], [], []), ([], [], [])]
    for op in ops:
        _apply(pools[0], op, Recorded(), *worlds[0])
        _apply(pools[1], op, Recorded(list(draws)), *worlds[1])
        draws.clear()
        assert _state(pools[0]) == _state(pools[1]), op
        fast = pools[0]
        if fast._empty_first:
            cached = [fast.is_cached(b) for b in fast.free_queue()]
            assert cached == sorted(cached)


def test_a_released_block_behind_cached_ones_turns_the_count_off_until_it_holds_again():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)                     # [0, 1]; 2, 3 free and empty
    pool.cache_blocks([a], [7])
    pool.free_blocks([a])                             # queue: 2, 3, 0 (cached)
    (c,) = pool.get_new_blocks(1)
    pool.claim([3])                                   # the hybrid layout's region
    pool.release([3])                                 # 3, empty, behind cached 0
    assert pool.free_queue() == [0, 3] and not pool._empty_first
    assert pool.get_new_blocks(1) == [0] and pool.num_evictions == 1
    assert pool._empty_first                          # (no cached block is free now)
    assert np.count_nonzero(pool._content) == 0
