"""Blocks only their own request can hit: the paged manager skips the prefix-cache work that
cannot pay off for them, and nothing observable changes.

A sequence whose block ids are private to it (``has_private_blocks``: a length-only request)
costs no prefix-cache work that cannot pay off: its first lookup is a miss without computing its
ids (nothing holds them before it ran), and with ``defer_private_blocks`` its full blocks are
registered in the prefix index only when it frees them, or as soon as any other sequence uses
the index (a request continuing it could look them up). A finished one that nothing can
continue (``unreachable_when_finished``) does not even compute its ids: its blocks are cached
as content no lookup can reach (:meth:`BlockPool.cache_unreachable`). The same holds for the
tail of a sequence whose first ``num_shared_blocks`` blocks alone may be hit by another request
(:mod:`kvsim.workloads.sharing`): its later blocks are registered only if it is preempted, and
become unreachable content when it finishes. Nothing observable changes: hits, the free queue's
order and the cached-block counts are those of registering every block as it fills.

Of the non-LRU pools, ``lfu``'s and the lanes of ``hybrid``, ``priority`` and ``lookahead`` skip
private blocks too (``caches_unreachable``), keeping their chains as registering them would have.
As the lanes' policies read a block's chain (is it a reused one?), there a chain's first two
blocks are registered as they fill, the private ones get the mark registering would have given
(:meth:`BlockPool.chain_mark`, read when the first of them filled), and a length-only request's
blocks are registered as they fill. ARC's and S3-FIFO's queues (``hears_private_fills``) must
hear a block when it fills, so there a private block is told to the pool as it fills, without
its id (``fill_private``: a request never preempted cannot find its own unique ids in a ghost
list), indexed only if its request is preempted (``register_filled``); their length-only
requests register every block. ``belady`` registers every block. vLLM's CPU offloading
(:mod:`kvsim.cache.offloading`) skips private blocks too: it offers every full block to the
CPU under the request's own ids, registered or not.
"""

from __future__ import annotations

#: ``num_filled`` of an entry whose pool hears no private fill (none is ever told).
ALL = 1 << 62


class PrivateBlocks:
    """The private-block registration of :class:`~kvsim.cache.kv_cache_manager.KVCacheManager`
    (a base of it): which entries defer, and registering them when they end. The manager's
    state (``pool``, ``_defer``, ``_hears_fills``, the entries) is its own."""

    @property
    def skips_private_blocks(self) -> bool:
        """Whether blocks only their own request can hit (``num_shared_blocks``) skip the
        prefix index while it runs (see the module docstring)."""
        return self._defer

    def is_registration_deferred(self, request_id) -> bool:
        """Whether ``request_id``'s full blocks wait to be registered (see the module doc)."""
        entry = self._requests.get(request_id)
        return entry is not None and entry.deferred is not None

    def _defer_registration(self, request_id, entry, tokens) -> None:
        """A new entry's registration: deferred (a length-only request), private after its
        shared blocks, or as they fill (nothing to do)."""
        hears = self._hears_fills
        if (getattr(tokens, "has_private_blocks", False) and not self._num_always_registered
                and not hears):
            entry.deferred = tokens
            self._deferred[request_id] = entry
        elif getattr(tokens, "num_shared_blocks", None) is not None and not (
                hears and tokens.num_preemptions):     # (its ids may be in a ghost list)
            entry.private = tokens
            if hears:
                entry.num_filled = 0

    def _register(self, entry, seq, reachable: bool = True) -> None:
        """Register the full blocks of ``seq`` that ``entry`` left unregistered (deferred, or
        private after its shared ones), as allocating them would have; not ``reachable`` (a
        finished request no other can hit): as cached content no lookup can reach, queued
        and counted alike, without computing their ids or indexing them."""
        n = len(seq)
        num_tokens = entry.num_slots if entry.num_slots < n else n
        if self._hears_fills and entry.at_cap:      # (the pool heard its private blocks fill)
            self._fill_privately(entry, num_tokens // self.block_size)
            if reachable:
                self._register_filled(entry, seq, entry.num_filled)
                return
        if reachable:
            self._cache_full_blocks(entry, seq, num_tokens)
        else:
            start = entry.num_cached
            self.pool.cache_unreachable(entry.block_ids[start:num_tokens // self.block_size],
                                        entry.block_ids[start - 1] if start else None,
                                        entry.chain_mark)

    def _register_deferred(self) -> None:
        """Another sequence uses the prefix index: register every deferred block first."""
        for entry in self._deferred.values():
            seq, entry.deferred = entry.deferred, None
            self._register(entry, seq)
        self._deferred.clear()

    def _fill_privately(self, entry, num_full: int) -> None:
        """Tell a pool that hears private fills of the request's private blocks full within
        ``num_full`` blocks it was not told of yet, without their ids."""
        start = max(entry.num_filled, entry.num_cached)
        if num_full > start:
            self.pool.fill_private(entry.block_ids[start:num_full])
            entry.num_filled = num_full

    def _register_filled(self, entry, seq, num_full: int) -> None:
        """Index the private blocks a pool heard filled (a preempted request's: a
        ``RequestState``), the policy told nothing more."""
        start = entry.num_cached
        self.pool.register_filled(entry.block_ids[start:num_full],
                                  seq.block_hashes(start, num_full))
        entry.num_cached = num_full

    def _registration_cap(self, entry, tokens) -> int:
        """Blocks of a sequence with private blocks registered as they fill: its shared ones
        (and the pool's ``num_always_registered``), or more once it had to register them."""
        cap = tokens.num_shared_blocks
        if cap < self._num_always_registered:
            cap = self._num_always_registered
        return cap if cap > entry.num_cached else entry.num_cached
