"""What the pools of non-LRU eviction policies share.

A :class:`PolicyPool` is a :class:`~kvsim.cache.block_pool.BlockPool` whose free blocks live in
two places: free blocks without a hash stay in the ``OrderedDict`` of the plain pool (reused
first, as vLLM), free *cached* blocks belong to the policy's own structure, counted by
``num_cached_free_blocks``. The two policy pools differ only in that structure:
:class:`~kvsim.cache.scored_pool.ScoredBlockPool` (a heap of release-time scores) and
:class:`~kvsim.cache.queue_pool.QueuePool` (a policy's queues, as ARC's and S3-FIFO's).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

from kvsim.cache.block_pool import BlockPool
from kvsim.cache.bulk import drop_refs, gather, set_all, without_marked


class _Unreachable:
    """The ``block_hashes`` entry of cached content no lookup can reach (see
    :meth:`BlockPool.cache_unreachable`): cached, but in no index."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNREACHABLE"


UNREACHABLE = _Unreachable()


class PolicyPool(BlockPool):
    """Queries and composite actions of a pool whose free cached blocks a policy orders.

    Subclasses give :meth:`cached_free_order` and the block actions (``get_new_blocks``,
    ``touch``, ``free_blocks``, ``cache_blocks``, ``reset_prefix_cache``).
    """

    opens_in_bulk = "never"
    caches_unreachable = False      # (a pool whose eviction handles UNREACHABLE says so)

    def _init_free_blocks(self, num_blocks: int) -> None:
        self.ref_counts: list[int] = [0] * num_blocks    # (read one block at a time)
        self._free = OrderedDict.fromkeys(range(num_blocks))     # the unhashed free blocks

    def is_cached(self, block_id: int) -> bool:
        return self.block_hashes[block_id] is not None

    def num_free_among(self, block_ids: list[int]) -> int:
        refs = self.ref_counts
        return sum(1 for b in block_ids if refs[b] == 0)

    # --- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + self.num_cached_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def free_queue(self) -> list[int]:
        """Free block ids: unhashed ones (reused first), then cached ones in policy order."""
        return list(self._free) + self.cached_free_order()

    def cached_free_order(self) -> list[int]:
        """Free cached blocks, roughly in the order the policy would evict them."""
        raise NotImplementedError

    def can_get_new_blocks(self, n: int) -> bool:
        return n <= self.num_free_blocks

    def can_reset(self) -> bool:
        return self.num_free_blocks == self.num_blocks

    # --- shared parts of the actions ------------------------------------------------------

    def _take_unhashed(self, n: int) -> list[int]:
        """Check that ``n`` blocks are free and take the unhashed ones first (reused before any
        cached block, as vLLM), at most ``n``; the caller takes the rest from the policy."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot get {n} free blocks: only {self.num_free_blocks} are free")
        popitem = self._free.popitem
        return [popitem(last=False)[0] for _ in range(min(n, len(self._free)))]

    def _drop_refs(self, ordered_block_ids: Iterable[int]) -> tuple[list[int], list[int]]:
        """Drop one reference from each block; those now free: (cached, uncached), in order."""
        ids = ordered_block_ids if ordered_block_ids.__class__ is list else list(
            ordered_block_ids)
        return drop_refs(self.ref_counts, self.block_hashes, ids)

    def _uncache_many(self, block_ids: list[int]) -> None:
        """Forget the content of free cached blocks a policy evicts (in this order) and take
        them, each with one reference (:meth:`BlockPool._evict` for a policy pool's lists)."""
        self._forget_hashes(block_ids)
        set_all(self.ref_counts, block_ids, 1)

    def _forget_hashes(self, block_ids: list[int]) -> None:
        """Evicted cached blocks: out of the index (those it holds), their hashes gone."""
        hashes = self.block_hashes
        found, indexed = gather(hashes, block_ids), block_ids
        kept = self.caches_unreachable and without_marked(UNREACHABLE, block_ids, found)
        if kept:
            indexed, found = kept
        if self.evicted is not None:
            self.evicted.extend(zip(indexed, found))
        self.index.remove_many(found, indexed)
        set_all(hashes, block_ids, None)

    def _prepend(self, block_ids: list[int]) -> None:
        """Put free unhashed blocks at the head, the first of them first."""
        free = self._free
        for block_id in reversed(block_ids):
            free[block_id] = None
            free.move_to_end(block_id, last=False)

    def _count_released(self, released: list[int]) -> int:
        """Count just released cached blocks as free and give them the next release clocks
        (a pool that orders by release time keeps ``_clock``); returns the first."""
        clock = self._clock + 1
        self._clock += len(released)
        self.num_cached_free_blocks += len(released)
        return clock

    # --- composite actions ---------------------------------------------------------------

    def cache_block(self, block_id: int, block_hash: int) -> None:
        self.cache_blocks([block_id], [block_hash])

    def put_cached(self, block_hash: int) -> int:
        block_id = self.get_new_blocks(1)[0]
        self.cache_block(block_id, block_hash)
        self.free_blocks([block_id])
        return block_id

    def put_cached_run(self, block_hashes: list[int]) -> list[int]:
        return [self.put_cached(block_hash) for block_hash in block_hashes]

    def refresh(self, block_id: int) -> None:
        self.touch([block_id])
        self.free_blocks([block_id])

    def refresh_many(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            self.refresh(block_id)
