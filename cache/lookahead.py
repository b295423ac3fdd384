"""``lookahead``: an online eviction policy for multi-turn traffic (see docs/eviction.md).

It uses only what a server knows when it evicts:

1. **the waiting queue** - requests that arrived but are not admitted yet have known prompts, so
   their prefix lookups are known. A free cached block that a queued request will look up is
   *protected*: evicted only when no unprotected block is left (AttentionStore/CachedAttention's
   idea of scheduler-aware eviction);
2. **the past** - whether a chain was already reused. A block whose chain was continued by a
   later request (a multi-turn conversation past its first turn) is kept one more *cache
   lifetime* than a block of a chain seen once: its release clock is credited with the pool
   size. Conversations that came back once come back again more often (on the Mooncake
   conversation trace, 51 % of continued prompts are continued again against 30 % of first
   turns) and their next turn comes after a user's think time, which LRU does not wait out.

Among unprotected blocks of the same class the order is LRU; the chain rule of
:class:`~kvsim.cache.scored_pool.ScoredBlockPool` holds (only chain leaves go). Without a queue
(a driver that never calls :meth:`LookaheadPolicy.enqueue`) only the second part acts.
"""

from __future__ import annotations

from typing import Sequence

from kvsim.cache.policies import KEY_PART_BITS, CachePolicy
from kvsim.cache.scored_pool import ScoredBlockPool


class LookaheadPolicy(CachePolicy):
    """Key ``(protected, release clock + credit, release clock)``, smallest evicted first.

    ``credit`` is the pool size for a block of a reused chain (see the module docstring), 0
    otherwise; ``protected`` is 1 while a queued request will look the block's hash up.
    """

    name = "lookahead"
    pool_class = "lookahead"
    num_key_parts = 3

    def __init__(self) -> None:
        self.wanted: dict[int, int] = {}     # hash -> queued requests that will look it up
        self.pool = None

    def key(self, pool, block_id, block_hash, clock):
        credit = pool.num_blocks if pool.reused[block_id] else 0
        return (1 if block_hash in self.wanted else 0, clock + credit, clock)

    def entries(self, pool, block_ids, clock, id_bits):
        reused, hashes, wanted, n = pool.reused, pool.block_hashes, self.wanted, pool.num_blocks
        bits = KEY_PART_BITS
        return [((((((hashes[b] in wanted) << bits) + c + (n if reused[b] else 0)) << bits) + c)
                 << id_bits) + b for c, b in enumerate(block_ids, clock)]

    def enqueue(self, block_hashes: Sequence[int]) -> None:
        """A request joined the waiting queue; it will look up ``block_hashes``."""
        wanted = self.wanted
        for block_hash in block_hashes:
            wanted[block_hash] = wanted.get(block_hash, 0) + 1
        if self.pool is not None:
            self.pool.rekey(self.pool.index.find_prefix(block_hashes))

    def dequeue(self, block_hashes: Sequence[int]) -> None:
        """A request left the waiting queue (admitted): end its protection."""
        wanted = self.wanted
        for block_hash in block_hashes:
            left = wanted.get(block_hash, 0) - 1
            if left > 0:
                wanted[block_hash] = left
            else:
                wanted.pop(block_hash, None)


class LookaheadPool(ScoredBlockPool):
    """A :class:`ScoredBlockPool` that marks blocks of reused chains (``reused``) and can
    re-key free blocks whose protection changed (:meth:`rekey`)."""

    def __init__(self, num_blocks: int, enable_caching: bool = True, policy=None):
        super().__init__(num_blocks, enable_caching, policy)
        self.reused = [False] * num_blocks
        policy.pool = self

    def cache_blocks(self, block_ids, block_hashes, depth: int = 0, parent=None) -> None:
        """A chain is *reused* from its first block under a parent that was hit at depth >= 1
        (the request continued an earlier prompt, not just a shared first block)."""
        reused = parent is not None and (
            self.reused[parent] or (self.hits[parent] > 0 and self._parent[parent] is not None))
        marks = self.reused
        for block_id in block_ids:
            marks[block_id] = reused
        super().cache_blocks(block_ids, block_hashes, depth, parent)

    def touch(self, block_ids) -> None:
        block_ids = list(block_ids)
        super().touch(block_ids)
        if len(block_ids) > 1:     # the hit blocks of a continued chain belong to it
            reused = self.reused
            for block_id in block_ids[1:]:
                reused[block_id] = True

    def rekey(self, block_ids) -> None:
        """Recompute the key of those of ``block_ids`` that are free and cached (the key's last
        part is the block's release clock)."""
        for block_id in block_ids:
            if block_id in self._cached_free:
                clock = self.key_of(block_id)[-1]
                self._entry[block_id] = self.policy.entries(self, [block_id], clock,
                                                            self._id_bits)[0]
                self._push(block_id)
