"""The host (CPU) tier: KV blocks in host memory behind the GPU pool.

Its blocks serve two purposes, drawn from one :class:`~kvsim.cache.block_pool.BlockPool`:

- *cached content* demoted from the GPU (:meth:`HostTier.store`): findable by hash, one copy
  per hash, given up in the order of the tier's own eviction policy (the same family as the
  GPU's, see :mod:`kvsim.cache.policies`);
- *swap space* (:meth:`HostTier.hold`): the blocks of a request preempted by swapping, pinned
  until it is swapped back in (:meth:`HostTier.release`); taking them may evict cached content.

A GPU prefix hit continues into the host (:meth:`HostTier.lookup`): the blocks found there are
promoted (copied back into fresh GPU blocks) before the request's prefill.

Chain property across tiers: the GPU demotes a chain deepest block first and the host keeps the
order it is given, so a host-resident block's ancestors are usually on the GPU or the host. It is
not guaranteed (two tiers evict independently); a host block whose ancestor left both tiers can
no longer be reached by a lookup and simply ages out.

Pure bookkeeping like the rest of :mod:`kvsim.cache`: the copies are pairs the
:class:`~kvsim.cache.kv_cache_manager.KVCacheManager` puts in the step plan.
"""

from __future__ import annotations

from itertools import compress, count, islice
from operator import not_
from typing import Sequence

from kvsim.cache.eviction import make_pool
from kvsim.cache.intmap import COMPILED


class HostTier:
    """``num_blocks`` host KV blocks: an evictable cache by hash plus pinned swap space.

    >>> host = HostTier(4)
    >>> host.store(111), host.store(222), host.store(111)
    (0, 1, None)
    >>> host.lookup([111, 222, 333])
    [0, 1]
    """

    def __init__(self, num_blocks: int, policy=None):
        self.pool = make_pool(num_blocks, enable_caching=True, policy=policy)
        self.num_stored_blocks = 0     # copies made into the host cache
        self.num_dropped_blocks = 0    # demotions refused: every host block was pinned

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding cached content (evictable)."""
        return self.pool.num_cached_free_blocks

    @property
    def num_pinned_blocks(self) -> int:
        """Blocks in use: swap space, or promotions in progress."""
        return self.pool.num_used_blocks

    def find(self, block_hash: int) -> int | None:
        return self.pool.index.get(block_hash)

    def lookup(self, block_hashes: Sequence[int]) -> list[int]:
        """Host blocks holding the leading run of ``block_hashes`` (stops at the first miss)."""
        return self.pool.index.find_prefix(block_hashes)

    # --- cached content ------------------------------------------------------------------

    def store(self, block_hash: int) -> int | None:
        """Make ``block_hash`` host-resident and return the host block to copy it into; None
        when no copy is needed (already there: only refreshed) or possible (all pinned)."""
        pool = self.pool
        found = pool.index.get(block_hash)
        if found is not None:
            pool.refresh(found)
            return None
        if not pool.can_get_new_blocks(1):
            self.num_dropped_blocks += 1
            return None
        self.num_stored_blocks += 1
        return pool.put_cached(block_hash)

    def store_many(self, block_hashes: list[int]) -> list[int | None]:
        """:meth:`store` of each hash in turn, a run at a time: a run of hashes held here is
        refreshed in one call, and a run that needs a copy each (not held, distinct, no more
        than the free blocks) is put in one call. Refreshing evicts nothing, and the blocks a
        put takes hold none of its hashes, so each run finds the tier as its hashes one at a
        time would."""
        pool = self.pool
        if not pool.can_get_new_blocks(1):      # (nothing can be put: one at a time)
            return [self.store(block_hash) for block_hash in block_hashes]
        out, at = [], 0
        while at < len(block_hashes):
            end, held = self._run_end(block_hashes, at)
            run = block_hashes[at:end]
            if held:
                pool.refresh_many(pool.index.find_prefix(run))
                out.extend([None] * len(run))
            else:
                out.extend(pool.put_cached_run(run))
                self.num_stored_blocks += len(run)
            at = end
        return out

    def _run_end(self, block_hashes: list[int], at: int) -> tuple[int, bool]:
        """Where the run of :meth:`store_many` starting at ``at`` ends, and whether its hashes
        are held here (else each needs a copy). The scans run in C."""
        held = self.pool.index._map.__contains__
        if held(block_hashes[at]):
            misses = map(not_, map(held, islice(block_hashes, at, None)))
            return next(compress(count(at), misses), len(block_hashes)), True
        limit = min(len(block_hashes), at + self.pool.num_free_blocks)
        if COMPILED:
            return self.pool.index._map.run_end(block_hashes, at, limit), False
        end = next(compress(count(at), map(held, islice(block_hashes, at, limit))), limit)
        if len(set(block_hashes[at:end])) < end - at:      # a hash twice: the run ends there
            seen: set[int] = set()
            for i in range(at, end):
                if block_hashes[i] in seen:
                    return i, False
                seen.add(block_hashes[i])
        return end, False

    def pin(self, block_ids: Sequence[int]) -> None:
        """Keep cached blocks from eviction while they are being read (a promotion)."""
        self.pool.touch(block_ids)

    def unpin(self, block_ids: Sequence[int]) -> None:
        """End a :meth:`pin`; the blocks count as just used (a chain's tail goes first)."""
        self.pool.free_blocks(reversed(block_ids))

    # --- swap space ----------------------------------------------------------------------

    def can_hold(self, n: int) -> bool:
        return self.pool.can_get_new_blocks(n)

    def hold(self, n: int) -> list[int]:
        """Pin ``n`` blocks of swap space (evicting cached content if need be)."""
        return self.pool.get_new_blocks(n)

    def release(self, block_ids: Sequence[int]) -> None:
        """Give swap space back; it is reused before any cached content is evicted."""
        self.pool.free_blocks(block_ids)
