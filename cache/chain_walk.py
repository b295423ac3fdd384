"""The scored pool's eviction walk: a victim, then up its chain while each parent becomes the
next victim at once.

:meth:`~kvsim.cache.scored_pool.ScoredBlockPool._evict_many` pops a victim off the heap; a
released chain goes tail first, so the victim's parent, woken when its last cached child
goes, is usually the next victim: while its entry is below the heap's smallest, the walk
evicts it too, with no heap work and no live entry. This loop runs once per evicted block of
the non-LRU scored policies (about half of the whole Mooncake trace's 8.9 million under
``lfu``); where the install compiled ``cache/_bulk.c`` it runs in C, the Python loop here
otherwise (the tests check them against each other).

The walk reads the pool through a *context* tuple (:func:`walk_context`) made once per
eviction: its block lists, index, eviction log, the priority that fills take, and its
callbacks for the rare cases (a copy of shared content, a parent with several copies).
"""

from __future__ import annotations

from functools import partial
from heapq import heappush

from kvsim.cache.bulk import compiled_loop
from kvsim.cache.policy_pool import UNREACHABLE

_c_walk = compiled_loop("walk_chain")


def walker(pool):
    """``walk(block_id, left, top, victims)`` for ``pool`` as it is now (:func:`walk_chain`,
    compiled where built)."""
    return partial(_c_walk or walk_chain, walk_context(pool))


def walk_context(pool) -> tuple:
    """What :func:`walk_chain` reads of a :class:`~kvsim.cache.scored_pool.ScoredBlockPool`
    (``prio`` None while every priority is 0: no writes), in the order the C loop reads it."""
    return (pool.block_hashes, pool.index._map, pool.evicted, pool._shared, pool.ref_counts,
            pool.hits, pool.prio if pool.priorities_seen else None, pool._priority,
            pool.parent_hashes, pool._parent_holder, pool.num_children, pool._live,
            pool._entry, pool._heap, UNREACHABLE, pool._drop_copy, pool._child_gone,
            heappush)


def walk_chain(context: tuple, block_id: int, left: int, top, victims: list[int]) -> int:
    """Evict ``block_id`` (uncached, taken into ``victims``), then its parent while it is left
    without a cached child, free, unqueued and keyed below ``top`` (the heap's smallest
    entry, None if empty) and victims are still wanted (``left``); a parent left eligible
    but keyed later is queued. Returns the victims still wanted. A parent's holder is read
    from the link kept when the block was cached, or from the index when that block no longer
    holds the hash alone (parent links are not reset when a block goes: only cached blocks
    are read, and caching sets them). Longer than most functions: one loop keeps the hot
    path's locals."""
    (hashes, index, evicted, shared, refs, hits, prio, priority, parents, holders, counts,
     live, entries, heap, unreachable, drop_copy, child_gone, push) = context
    while True:
        block_hash = hashes[block_id]
        if block_hash is not unreachable:
            if evicted is not None:
                evicted.append((block_id, block_hash))
            if shared[block_id]:
                drop_copy(block_id, block_hash)
            else:
                del index[block_hash]
        hashes[block_id] = None
        victims.append(block_id)
        refs[block_id] = 1
        hits[block_id] = 0
        if prio is not None:
            prio[block_id] = priority
        left -= 1
        parent_hash = parents[block_id]
        if parent_hash is None:
            return left
        found = holders[block_id]
        if found is None or hashes[found] is not parent_hash or shared[found]:
            found = index.get(parent_hash)     # (the holder may have changed)
            if found.__class__ is not int:     # copies, or no block (an orphan)
                child_gone(parent_hash)
                return left
        count = counts[found] = counts[found] - 1
        if count or refs[found] or live[found] is not None:
            return left         # other children, held, or queued already
        entry = entries[found]
        if left and (top is None or entry < top):
            block_id = found
            continue
        live[found] = entry
        push(heap, entry)
        return left
