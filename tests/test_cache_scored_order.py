"""The scored pool's fast paths (packed heap entries, parked non-leaves, the woken parent taken
without heap work, evictions in one batch) pick exactly the victim the definition names: the
smallest ``(key, block id)`` among free cached blocks that are chain leaves or one of several
copies of their content."""

import random

import pytest

from kvsim.cache.eviction import make_policy
from kvsim.cache.policies import unpack_key
from kvsim.cache.scored_pool import ScoredBlockPool, heap_entry


def test_a_packed_entry_orders_as_the_key_tuple_with_the_block_id():
    keys = [(-3, 5), (-3, 6), (0, 0), (0, 2 ** 47), (1, 0), (7, 1)]
    entries = [heap_entry(k, b, 4) for k in keys for b in (0, 9)]
    assert entries == sorted(entries)
    assert [e & 15 for e in entries[:2]] == [0, 9]


def test_a_three_part_key_packs_in_order():
    bits = (48, 1)
    assert (heap_entry((0, 5, 1), 3, 2, bits) < heap_entry((0, 6, 0), 0, 2, bits)
            < heap_entry((1, 0, 0), 0, 2, bits))
    assert unpack_key(heap_entry((1, 7, 1), 3, 2, bits), 2, bits) == (1, 7, 1)
    with pytest.raises(ValueError, match="3 parts"):
        heap_entry((0, 5), 3, 2, bits)


def expected_victim(pool) -> int:
    """The definition, by brute force (no unhashed block is free)."""
    cached = [b for b in range(pool.num_blocks) if pool.block_hashes[b] is not None]

    def eligible(b):
        h = pool.block_hashes[b]
        has_child = any(pool.parent_hashes[c] == h for c in cached)
        return not has_child or sum(pool.block_hashes[c] == h for c in cached) > 1
    free = pool.cached_free_blocks()
    leaves = [b for b in free if eligible(b)] or free
    return min(leaves, key=lambda b: (pool.key_of(b), b))


def story(seed: int):
    """Requests on a tree of chained hashes: hit, take the rest, hold some, free others."""
    rng, ids = random.Random(seed), {}
    for _ in range(400):
        path = [rng.randrange(3)] + [rng.randrange(2) for _ in range(rng.randrange(6))]
        yield [ids.setdefault(tuple(path[:i + 1]), len(ids) + 1) for i in range(len(path))], \
            rng.random() < 0.3, rng.randrange(3)


def serve(pool, hashes, held, keep, priority, take):
    pool.begin(None, -priority)
    hit = pool.index.find_prefix(hashes)
    need = len(hashes) - len(hit)
    if need > pool.num_free_blocks - len(hit):
        return
    pool.touch(hit)
    new = take(pool, need)
    pool.cache_blocks(new, hashes[len(hit):], len(hit), hit[-1] if hit else None)
    held.append(hit + new)
    while len(held) > 3 or (held and not keep):
        pool.free_blocks(reversed(held.pop(0)))


def take_checked(pool, n):
    taken = []
    for _ in range(n):
        expected = None if pool._free else expected_victim(pool)
        block = pool.get_new_blocks(1)[0]
        assert expected is None or block == expected
        taken.append(block)
    return taken


@pytest.mark.parametrize("name", ["lfu", "priority"])
@pytest.mark.parametrize("seed", range(3))
def test_every_victim_is_the_smallest_eligible_entry_one_by_one_and_in_batches(name, seed):
    one, batch = (ScoredBlockPool(12, policy=make_policy(name)) for _ in range(2))
    held_one, held_batch = [], []
    for hashes, keep, priority in story(seed):
        serve(one, hashes, held_one, keep, priority, take_checked)
        serve(batch, hashes, held_batch, keep, priority, lambda p, n: p.get_new_blocks(n))
        assert held_one == held_batch
    assert one.num_evictions == batch.num_evictions > 100


@pytest.mark.parametrize("name", ["lfu", "priority"])
def test_a_policys_bulk_entries_pack_its_key(name):
    """``entries`` (one pass per release, the hot path) equals ``heap_entry`` of ``key`` for
    every block, whatever its hits, priority (clamped or not) and reuse."""
    pool = ScoredBlockPool(8, policy=make_policy(name))
    pool.begin("r", priority=-70)
    blocks = pool.get_new_blocks(6)
    pool.cache_blocks(blocks, [11, 12, 13, 14, 15, 16])
    pool.hits[blocks[1]], pool.prio[blocks[2]], pool.prio[blocks[3]] = 5, 3, 90
    if hasattr(pool, "reused"):
        pool.reused[blocks[4]] = True
    policy, hashes = pool.policy, pool.block_hashes
    for order in (blocks, blocks[::-1]):       # a release lists a chain tail first
        expected = [heap_entry(policy.key(pool, b, hashes[b], c), b, pool._id_bits,
                               policy.key_part_bits)
                    for c, b in enumerate(order, 40)]
        assert policy.entries(pool, order, 40, pool._id_bits) == expected


def test_a_copys_children_count_on_the_older_copy_and_keep_it_until_they_go():
    """Y recomputes hash 10 (a copy in block 1) and caches child 11 after it; the children
    count on the holder, block 0. W's lookup hits the holder, so block 0 has the worse LFU key
    but must wait for its child once its copy is gone."""
    pool = ScoredBlockPool(3, policy=make_policy("lfu"))
    pool.cache_blocks(pool.get_new_blocks(1), [10])                  # X: block 0
    pool.cache_blocks(pool.get_new_blocks(2), [10, 11])              # Y: blocks 1, 2
    assert (pool.holder(10), pool.num_children[:3]) == (0, [1, 0, 0])
    pool.touch(pool.index.find_prefix([10, 11]))                     # W hits blocks 0 and 2
    pool.free_blocks([2, 0])                                         # W
    pool.free_blocks([0])                                            # X
    pool.free_blocks([2, 1])                                         # Y
    assert [pool.get_new_blocks(1)[0] for _ in range(3)] == [1, 2, 0]   # key order: 1, 0, 2


def test_after_a_reset_a_parent_woken_by_its_childs_eviction_is_queued():
    """Block 1 was queued before the reset; after it, it is a parent, parked behind block 0,
    and queued when block 0 goes (no entry of its earlier life may stand in)."""
    pool = ScoredBlockPool(4, policy=make_policy("lfu"))
    pool.cache_blocks(pool.get_new_blocks(2), [10, 11])      # blocks 0, 1
    pool.free_blocks([1, 0])                                 # 1 queued, 0 parked
    assert pool.reset_prefix_cache() and pool.free_queue() == [2, 3, 1, 0]
    assert pool.get_new_blocks(4) == [2, 3, 1, 0]
    pool.cache_blocks([1, 0], [20, 21])                      # A: 1 the parent this time
    pool.cache_blocks([2], [30])                             # B: 2, and 3 uncached
    pool.free_blocks([0, 1])
    pool.free_blocks([3, 2])
    assert [pool.get_new_blocks(1)[0] for _ in range(4)] == [3, 0, 1, 2]


def test_evicting_the_holder_copy_moves_its_children_to_the_next_copy():
    pool = ScoredBlockPool(3, policy=make_policy("lfu"))
    pool.cache_blocks(pool.get_new_blocks(1), [10])                  # X: block 0, the holder
    pool.cache_blocks(pool.get_new_blocks(2), [10, 11])              # Y: copy 1, child 2
    pool.free_blocks([0])
    pool.free_blocks([2, 1])
    assert pool.get_new_blocks(1) == [0]
    assert (pool.holder(10), pool.num_children[1], pool.index._map[10]) == (1, 1, 1)
    assert [pool.get_new_blocks(1)[0] for _ in range(2)] == [2, 1]


def test_children_of_a_hash_evicted_against_the_chain_rule_wait_for_it_by_hash():
    """Hashes freed root first while the child is held: no block is eligible, the root goes
    anyway and its child is counted by hash; caching the hash again gives the count back."""
    pool = ScoredBlockPool(2, policy=make_policy("lfu"))
    root, child = pool.get_new_blocks(2)
    pool.cache_blocks([root, child], [10, 11])
    pool.free_blocks([root])
    assert pool.get_new_blocks(1) == [root]          # the fallback: nothing else was free
    pool.cache_blocks([root], [10])
    assert pool.num_children[root] == 1
    pool.free_blocks([root])
    pool.free_blocks([child])
    assert pool.get_new_blocks(1) == [child]         # the root has the smaller key
    assert pool.num_children[root] == 0


@pytest.mark.parametrize("name", ["lfu", "priority"])
def test_bulk_entries_pack_the_key_while_every_priority_is_zero(name):
    pool = ScoredBlockPool(8, policy=make_policy(name))
    pool.begin("r")
    blocks = pool.get_new_blocks(6)
    pool.cache_blocks(blocks, [11, 12, 13, 14, 15, 16])
    pool.hits[blocks[1]] = 5
    if hasattr(pool, "reused"):
        pool.reused[blocks[4]] = True
    assert not pool.priorities_seen
    policy, hashes = pool.policy, pool.block_hashes
    expected = [heap_entry(policy.key(pool, b, hashes[b], c), b, pool._id_bits,
                           policy.key_part_bits)
                for c, b in enumerate(blocks, 40)]
    assert policy.entries(pool, blocks, 40, pool._id_bits) == expected


def test_the_prefix_index_stores_a_last_copy_alone_again():
    from kvsim.cache import PrefixIndex
    index = PrefixIndex()
    for block_id in (4, 7, 9):
        index.insert(10, block_id)
    index.remove(10, 4)
    assert (index._map[10], index.get(10)) == ({7: None, 9: None}, 7)
    index.remove(10, 7)
    assert index._map[10] == 9
    index.remove(10, 9)
    assert index.get(10) is None and len(index) == 0


@pytest.mark.parametrize("parent", [None, "cached", "copied"])
def test_a_long_chain_of_new_hashes_is_registered_as_block_by_block(parent, monkeypatch):
    """A prefill registers hundreds of new blocks at once: one pass leaves the hashes, chain
    parents, holders, child counts and index the block-by-block loop leaves."""
    from kvsim.cache import scored_pool

    def registered(min_bulk):
        monkeypatch.setattr(scored_pool, "MIN_BULK_CHAIN", min_bulk)
        pool = ScoredBlockPool(64, policy=make_policy("lfu"))
        first = pool.get_new_blocks(3)
        pool.cache_blocks(first[:2], [101, 102])
        if parent == "copied":
            pool.cache_blocks(first[2:], [102])         # a second copy of 102
        after = {None: None, "cached": first[1], "copied": first[2]}[parent]
        chain = pool.get_new_blocks(20)
        pool.cache_blocks(chain, list(range(200, 220)), 2, after)
        return (pool.block_hashes, pool.parent_hashes, pool._parent_holder,
                pool.num_children, dict(pool.index._map), pool.index.num_shared_hashes)

    bulk, loop = registered(scored_pool.MIN_BULK_CHAIN), registered(10 ** 9)
    assert bulk == loop
    assert bulk[3][:3] == ([1, 0, 0] if parent is None else [1, 1, 0])   # 102 has a child
