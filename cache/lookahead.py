"""``lookahead``: an online eviction policy for multi-turn traffic (see docs/eviction.md).

It uses only what a server knows when it evicts:

1. **the waiting queue** - requests that arrived but are not admitted yet have known prompts, so
   their prefix lookups are known. A free cached block that a queued request's lookup would
   hit (its cached prefix, which grows while it waits as the blocks after it are cached) is
   *protected*: evicted only when no unprotected block is left (AttentionStore/CachedAttention's
   idea of scheduler-aware eviction). With chained block hashes that is every cached block
   whose hash the request will look up;
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
    otherwise; ``protected`` is 1 while a queued request's lookup reaches the block's hash
    (``wanted``: each queued request counts the hashes its lookup reaches, so queueing and
    admitting it cost what it hits, not its whole prompt).
    """

    name = "lookahead"
    pool_class = "lookahead"
    num_key_parts = 3

    def __init__(self) -> None:
        self.wanted: dict[int, int] = {}     # hash -> queued requests whose lookup reaches it
        self._waiters: dict = {}             # queued request -> its _Waiter
        self._blocked: dict[int, list] = {}  # hash -> waiters whose lookup stops just before it
        self.pool = None

    @property
    def queued(self) -> list:
        """The queued requests, in the order they were queued."""
        return list(self._waiters)

    def key(self, pool, block_id, block_hash, clock):
        credit = pool.num_blocks if pool.reused[block_id] else 0
        return (1 if block_hash in self.wanted else 0, clock + credit, clock)

    def entries(self, pool, block_ids, clock, id_bits):
        reused, hashes, wanted, n = pool.reused, pool.block_hashes, self.wanted, pool.num_blocks
        bits = KEY_PART_BITS
        return [((((((hashes[b] in wanted) << bits) + c + (n if reused[b] else 0)) << bits) + c)
                 << id_bits) + b for c, b in enumerate(block_ids, clock)]

    def enqueue(self, key, block_hashes: Sequence[int]) -> None:
        """Request ``key`` joined the waiting queue; its lookup will cover ``block_hashes``.
        Its cached prefix is protected at once (free blocks re-keyed), the rest as it gets
        cached (:meth:`reached`)."""
        if key in self._waiters:
            raise ValueError(f"request {key!r} is queued already")
        waiter = self._waiters[key] = _Waiter(list(block_hashes))
        if self.pool is None:        # no index to stop at: every hash counts
            self._reach(waiter, len(waiter.hashes))
            return
        found = self.pool.index.find_prefix(waiter.hashes)
        self._reach(waiter, len(found))
        self.pool.protect(found)

    def dequeue(self, key) -> None:
        """Request ``key`` left the waiting queue (admitted): end its protection."""
        waiter = self._waiters.pop(key)
        wanted, hashes, reach = self.wanted, waiter.hashes, waiter.reach
        for block_hash in hashes[:reach]:
            left = wanted[block_hash] - 1
            if left:
                wanted[block_hash] = left
            else:
                del wanted[block_hash]
        if reach < len(hashes):
            blocked = self._blocked[hashes[reach]]
            blocked.remove(waiter)
            if not blocked:
                del self._blocked[hashes[reach]]

    def reached(self, block_hashes: Sequence[int]) -> None:
        """These hashes were just cached: a queued lookup that stopped before one of them now
        goes on, as far as the index holds its next hashes."""
        blocked = self._blocked
        if not blocked or blocked.keys().isdisjoint(block_hashes):
            return
        index = self.pool.index._map
        for block_hash in blocked.keys() & block_hashes:     # any order: each goes as far
            for waiter in blocked.pop(block_hash):           # as the index holds its hashes
                hashes, end = waiter.hashes, waiter.reach + 1    # its next hash is cached
                while end < len(hashes) and hashes[end] in index:
                    end += 1
                self._reach(waiter, end)

    def _reach(self, waiter: "_Waiter", end: int) -> None:
        """Count ``waiter``'s hashes up to ``end`` as wanted; it waits on the next one."""
        wanted, hashes = self.wanted, waiter.hashes
        for block_hash in hashes[waiter.reach:end]:
            wanted[block_hash] = wanted.get(block_hash, 0) + 1
        waiter.reach = end
        if end < len(hashes):
            self._blocked.setdefault(hashes[end], []).append(waiter)


class _Waiter:
    """A queued request's lookup: ``hashes[:reach]`` would hit now (or did while it waited)."""

    __slots__ = ("hashes", "reach")

    def __init__(self, hashes: list[int]):
        self.hashes, self.reach = hashes, 0


class LookaheadPool(ScoredBlockPool):
    """A :class:`ScoredBlockPool` that marks blocks of reused chains (``reused``) and can
    protect free blocks a queued request will look up (:meth:`protect`)."""

    def __init__(self, num_blocks: int, enable_caching: bool = True, policy=None):
        super().__init__(num_blocks, enable_caching, policy)
        self.reused = [False] * num_blocks
        policy.pool = self
        self._reached = getattr(policy, "reached", None)   # lookahead reads the queue

    def cache_blocks(self, block_ids, block_hashes, depth: int = 0, parent=None) -> None:
        """A chain is *reused* from its first block under a parent that was hit at depth >= 1
        (the request continued an earlier prompt, not just a shared first block)."""
        reused = parent is not None and (
            self.reused[parent] or (self.hits[parent] > 0 and self._parent[parent] is not None))
        marks = self.reused
        for block_id in block_ids:
            marks[block_id] = reused
        super().cache_blocks(block_ids, block_hashes, depth, parent)
        if self._reached is not None:
            self._reached(block_hashes)

    def touch(self, block_ids) -> None:
        block_ids = list(block_ids)
        super().touch(block_ids)
        if len(block_ids) > 1:     # the hit blocks of a continued chain belong to it
            reused = self.reused
            for block_id in block_ids[1:]:
                reused[block_id] = True

    def protect(self, block_ids) -> None:
        """Those of ``block_ids`` that are free and cached are now wanted by a queued request:
        a key not protected yet gets its first part set, and is queued again."""
        cached_free, entries = self._cached_free, self._entry
        unit = 1 << (2 * KEY_PART_BITS + self._id_bits)     # protected = 1, in the entry
        changed = [b for b in block_ids if b in cached_free and entries[b] < unit]
        for block_id in changed:
            entries[block_id] += unit
        self._push_all(changed)
