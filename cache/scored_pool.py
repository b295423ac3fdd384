"""A :class:`~kvsim.cache.policy_pool.PolicyPool` that evicts free cached blocks in the order of an
eviction policy (:mod:`kvsim.cache.policies`) instead of vLLM's LRU."""

from __future__ import annotations

from collections import OrderedDict
from heapq import heapify, heappop, heappush
from typing import Iterable

from kvsim.cache.bulk import MIN_BULK_CHAIN, set_all, set_each
from kvsim.cache.chain_walk import walker
from kvsim.cache.policies import heap_entry, unpack_key
from kvsim.cache.policy_pool import UNREACHABLE, PolicyPool
from kvsim.cache.private_runs import PrivateRunBlocks, PrivateRuns

__all__ = ["ScoredBlockPool", "heap_entry"]


class ScoredBlockPool(PrivateRunBlocks, PolicyPool):
    """A :class:`~kvsim.cache.policy_pool.PolicyPool` whose free cached blocks are evicted in a policy's order.

    Free unhashed blocks stay in the ``OrderedDict`` (reused first, as vLLM). A free cached
    block gets its key from ``policy.key`` when released and goes into a min-heap as one int
    (:func:`heap_entry`: the key's parts and the block id packed in order, so the heap compares
    ints, not tuples); entries are invalidated lazily (a block's live entry is remembered), and
    the heap is rebuilt when stale entries outnumber live ones, so every block operation is
    O(log n) amortised.

    Chain property: a block is evicted only if no cached block was registered after it in a
    chain (no cached child of its hash) or another block holds the same content. Such a block
    always exists among the free cached ones when block hashes are chained (a request holding a
    child also holds a copy of its parent), so the policy is obeyed among the *leaves*. Should
    none be eligible (hashes that are not chained), the best-keyed free block is evicted anyway.

    The chain rule is kept in lists indexed by block id, not in dicts keyed by hash (the hot
    loops touch every block of every long prompt): a hash's cached children are counted on its
    *holder* (the oldest block holding it, :meth:`holder`), ``_shared`` marks blocks whose
    content another block also holds, so a block is eligible exactly when
    ``not num_children[b] or shared[b]``.

    Content no lookup can reach (:meth:`cache_unreachable`: a finished request's private
    blocks) holds ``UNREACHABLE`` instead of a hash and is in no index, but is chained and
    counted as registered blocks are; a policy whose key reads hashes (``belady``) gets every
    block registered instead.
    """

    opens_in_bulk = "new_chains"

    def __init__(self, num_blocks: int, enable_caching: bool = True, policy=None):
        super().__init__(num_blocks, enable_caching, policy)
        # blocks no other request can hit may stay out of the index, chained as registered
        # ones, unless the policy's key reads their hashes
        self.caches_unreachable = not getattr(policy, "reads_block_hashes", False)
        self.hits = [0] * num_blocks       # prefix hits since the block was filled
        self.prio = [0] * num_blocks       # best (lowest) priority of its users since then
        self.parent_hashes: list[int | None] = [None] * num_blocks   # hash of its chain parent
        self._parent_holder: list[int | None] = [None] * num_blocks  # its holder when cached
        self.num_children = [0] * num_blocks   # cached children of its hash, on its holder
        self._shared = [False] * num_blocks    # another block holds the same content
        self._orphans: dict[int, int] = {}     # hash -> cached children, while no block holds it
        self._entry: list[int | None] = [None] * num_blocks  # key and id packed (heap_entry)
        self._live: list[int | None] = [None] * num_blocks   # its entry in the heap, if any
        self._id_bits = num_blocks.bit_length()
        self._heap: list[int] = []
        self._clock = 0
        self._priority = 0
        self.priorities_seen = False        # every prio is 0 until a request has another
        self._runs = PrivateRuns()          # finished requests' private chains, evicted in bulk

    # --- queries -------------------------------------------------------------------------

    def cached_free_order(self) -> list[int]:
        """Free cached blocks by eviction key (the chain rule may still defer a block with a
        cached child)."""
        self._settle_runs()
        return sorted(self.cached_free_blocks(), key=self._entry.__getitem__)

    def cached_free_blocks(self) -> list[int]:
        """The free cached blocks, by id (a scan: they are not kept in a set, which would cost
        two dict operations per block on the hot paths)."""
        refs, hashes = self.ref_counts, self.block_hashes
        return [b for b in range(self.num_blocks) if not refs[b] and hashes[b] is not None]

    def holder(self, block_hash: int) -> int | None:
        """The block that counts the cached children of ``block_hash``: its oldest copy."""
        found = self.index._map.get(block_hash)
        return found if found is None or found.__class__ is int else next(iter(found))

    def key_of(self, block_id: int) -> tuple:
        """The policy key ``block_id`` got when it was last released."""
        self._settle_runs()
        return unpack_key(self._entry[block_id], self._id_bits, self.policy.key_part_bits)

    # --- actions -------------------------------------------------------------------------

    def begin(self, request_id, priority: int = 0) -> None:
        self._priority = priority
        if priority:
            self.priorities_seen = True
        self.policy.begin(request_id)

    def get_new_blocks(self, n: int) -> list[int]:
        """Take ``n`` free blocks: unhashed ones first, then the policy's victims."""
        self._link_pending()
        taken = self._take_unhashed(n)
        num_unhashed = len(taken)
        refs, hits, prio, priority = self.ref_counts, self.hits, self.prio, self._priority
        for block_id in taken:
            refs[block_id] = 1
            hits[block_id] = 0
            prio[block_id] = priority
        if n > num_unhashed:
            taken += self._evict_many(n - num_unhashed)     # taken as they are uncached
        return taken

    def touch(self, block_ids: Iterable[int]) -> None:
        self._link_pending()
        refs, priority = self.ref_counts, self._priority
        for block_id in block_ids:
            if refs[block_id] == 0:
                if self.block_hashes[block_id] is None:
                    del self._free[block_id]
                else:
                    self.num_cached_free_blocks -= 1
                    self._live[block_id] = None
            refs[block_id] += 1
            self.hits[block_id] += 1
            if priority < self.prio[block_id]:
                self.prio[block_id] = priority

    def free_blocks(self, ordered_block_ids: Iterable[int]) -> None:
        chain, run = self._runs.take_chain(), []
        if chain is not None:       # (a finished request's private chain first: see
            ordered_block_ids = list(ordered_block_ids)     # kvsim.cache.private_runs)
            run = self._split_run(ordered_block_ids, chain)
            if not run:
                self._link_rest(chain)
        released, first = self._drop_refs(ordered_block_ids)
        if run:
            released = run + released
        if released:
            clock = self._count_released(released)
            packed = self.policy.entries(self, released, clock, self._id_bits)
            if run:
                k = len(run)
                self._queue_run(run, packed[:k])
                released, packed = released[k:], packed[k:]
            self._queue_released(released, packed)
        self._prepend(first)

    def cache_blocks(self, block_ids, block_hashes, depth: int = 0, parent=None) -> None:
        """Register full, held blocks of one chain after block ``parent`` (None at the root);
        each block's parent hash is counted as having one more cached child."""
        self._link_pending()
        index, counts, orphans = self.index._map, self.num_children, self._orphans
        hashes, parents, holders = self.block_hashes, self.parent_hashes, self._parent_holder
        parent_hash = hashes[parent] if parent is not None else None
        holder = self.holder(parent_hash) if parent_hash is not None else None
        if (len(block_ids) >= MIN_BULK_CHAIN and not orphans and len(block_ids) == len(block_hashes)
                and self.index.add_new(block_hashes := list(block_hashes),
                                       block_ids := list(block_ids))):
            self._cache_new_chain(block_ids, block_hashes, parent_hash, holder)
            return
        for block_id, block_hash in zip(block_ids, block_hashes):
            hashes[block_id] = block_hash
            parents[block_id] = parent_hash
            holders[block_id] = holder
            if holder is not None:
                counts[holder] += 1
            if block_hash in index:
                holder = self._cache_copy(block_id, block_hash)
            else:
                index[block_hash] = holder = block_id
                if orphans:
                    counts[block_id] = orphans.pop(block_hash, 0)
            parent_hash = block_hash

    def _cache_new_chain(self, block_ids: list[int], block_hashes: list, parent_hash,
                         holder) -> None:
        """:meth:`cache_blocks` for a long chain whose hashes were all new (no orphan
        waiting), just indexed: each block holds its own hash and is its child's parent and
        holder."""
        set_each(self.block_hashes, block_ids, block_hashes)
        self._link_chain(block_ids, [parent_hash, *block_hashes[:-1]], holder)

    def _link_chain(self, block_ids: list[int], parent_hashes: list, holder) -> None:
        """Chain ``block_ids`` (in order): each the cached child of the one before, the first
        of ``holder`` (None: a chain's root); ``parent_hashes``: each one's parent's hash."""
        set_each(self.parent_hashes, block_ids, parent_hashes)
        set_each(self._parent_holder, block_ids, [holder, *block_ids[:-1]])
        counts = self.num_children
        if holder is not None:
            counts[holder] += 1
        for block_id in block_ids[:-1]:
            counts[block_id] += 1

    def cache_unreachable(self, block_ids: list[int], parent: int | None = None,
                          chain_mark=None) -> None:
        """Full, held blocks of one chain after block ``parent`` as cached content in no index
        (``UNREACHABLE``), chained and counted as :meth:`cache_blocks` would (their content
        is new: no copies, no orphans). The caller releases them next (as
        :meth:`KVCacheManager.free` does): the chain after its first block is linked then, or,
        released as a run, only when the run is written out (:mod:`kvsim.cache.private_runs`)."""
        if not block_ids:
            return
        self._link_pending()
        block_ids = list(block_ids)
        parent_hash = self.block_hashes[parent] if parent is not None else None
        holder = self.holder(parent_hash) if parent_hash is not None else None
        set_all(self.block_hashes, block_ids, UNREACHABLE)
        self._link_chain(block_ids[:1], [parent_hash], holder)
        self._runs.note_chain(block_ids)

    def reset_prefix_cache(self) -> bool:
        if not self.can_reset():
            return False
        order = self.free_queue()
        self._free = OrderedDict.fromkeys(order)
        self._heap.clear()
        self._live = [None] * self.num_blocks     # (no block is queued any more)
        self._orphans.clear()
        self._runs.clear()
        self.parent_hashes = [None] * self.num_blocks
        self._parent_holder = [None] * self.num_blocks
        self.num_children = [0] * self.num_blocks
        self._shared = [False] * self.num_blocks
        self.index.clear()
        self.block_hashes = [None] * self.num_blocks
        self.num_cached_free_blocks = 0
        return True

    # --- internals -----------------------------------------------------------------------

    def _cache_copy(self, block_id: int, block_hash: int) -> int:
        """Register ``block_id`` as another copy of cached content and return the hash's
        holder: an older free copy with a cached child may now go (only one copy must stay),
        so parked copies are woken."""
        self.index.insert(block_hash, block_id)
        copies, shared = self.index._map[block_hash], self._shared
        for copy in copies:
            shared[copy] = True
        holder = next(iter(copies))
        if self.num_children[holder]:
            self._wake(block_hash)
        return holder

    def _drop_copy(self, block_id: int, block_hash: int) -> None:
        """Uncache one of several copies of ``block_hash``: its children count moves to the
        next holder; a last copy left alone is no longer shared."""
        index, counts, shared = self.index, self.num_children, self._shared
        index.remove(block_hash, block_id)
        shared[block_id] = False
        remaining = index._map[block_hash]
        if remaining.__class__ is int:
            shared[remaining] = False
        else:
            remaining = next(iter(remaining))
        counts[remaining], counts[block_id] = counts[remaining] + counts[block_id], 0

    def _push(self, block_id: int) -> None:
        """Queue ``block_id`` under its current key (its older entries go stale)."""
        self._push_all([block_id])

    def _push_all(self, block_ids: list[int]) -> None:
        """:meth:`_push` for each of ``block_ids``."""
        heap, live, entries = self._heap, self._live, self._entry
        for block_id in block_ids:
            entry = live[block_id] = entries[block_id]
            heappush(heap, entry)
        if len(heap) > 2 * self.num_cached_free_blocks + 64:
            self._compact()

    def _queue_released(self, block_ids: list[int], packed: list[int]) -> None:
        """Key just released blocks (their ``packed`` entries) and queue the eligible ones into
        the heap; the others stay *parked* (free and cached without a live entry: the heap
        would only drop them when met, so parking them at once gives the same victims with
        fewer heap entries)."""
        counts, shared, entries, eligible = self.num_children, self._shared, self._entry, []
        keep = eligible.append
        for block_id, entry in zip(block_ids, packed):
            entries[block_id] = entry
            if not counts[block_id] or shared[block_id]:
                keep(block_id)
        self._push_all(eligible)

    def _compact(self) -> None:
        self._settle_runs(forget=True)      # (parked blocks get live entries)
        live, entries, cached_free = self._live, self._entry, self.cached_free_blocks()
        for block_id in cached_free:
            live[block_id] = entries[block_id]
        self._heap[:] = [live[block_id] for block_id in cached_free]   # in place
        heapify(self._heap)

    def _evict_many(self, n: int) -> list[int]:
        """The next ``n`` victims, uncached and taken: each popped off the heap, then its
        chain's parents while they come next (:mod:`kvsim.cache.chain_walk`); a finished
        request's private run that the walk would take block by block, at once."""
        live, entries, heap, runs = self._live, self._entry, self._heap, self._runs
        walk, victims, left = walker(self), [], n
        while left:
            block_id = self._next_victim()
            live[block_id] = None       # a parent walked to below has no live entry
            run = runs.take(block_id, entries[block_id]) if runs else None
            if run is not None:         # the blocks the walk would take inline, but a root
                block_id, left = self._evict_run(run, left, victims)
                if block_id is None:
                    continue
            left = walk(block_id, left, heap[0] if heap else None, victims)
        self.num_cached_free_blocks -= n
        self.num_evictions += n
        return victims

    def _child_gone(self, block_hash: int) -> None:
        """A cached child of ``block_hash`` was evicted, and that hash has several copies (or
        none: an orphan, see :meth:`_next_victim`)."""
        holder = self.holder(block_hash)
        if holder is None:
            left = self._orphans.pop(block_hash) - 1
            if left:
                self._orphans[block_hash] = left
            return
        self.num_children[holder] -= 1
        if not self.num_children[holder]:
            self._wake(block_hash)

    def _next_victim(self) -> int:
        """The free cached block with the smallest live entry that is eligible: a chain leaf,
        or a block whose content another block also holds. An ineligible block met on the way
        is *parked* (its live entry dropped) until :meth:`_wake`."""
        heap, live, counts, shared = self._heap, self._live, self.num_children, self._shared
        id_mask = (1 << self._id_bits) - 1
        while heap:
            entry = heappop(heap)
            block_id = entry & id_mask
            if live[block_id] != entry:
                continue
            if not counts[block_id] or shared[block_id]:
                return block_id
            live[block_id] = None
        # no eligible block: hashes that are not chained (see the class docstring); its
        # children become orphans, counted by hash until the hash is cached again
        self._settle_runs(forget=True)      # (it may be a parked block of a run)
        block_id = min(self.cached_free_blocks(), key=self._entry.__getitem__)
        if counts[block_id] and not shared[block_id]:
            block_hash = self.block_hashes[block_id]
            self._orphans[block_hash] = self._orphans.get(block_hash, 0) + counts[block_id]
            counts[block_id] = 0
        return block_id

    def _wake(self, block_hash: int) -> None:
        """Re-queue the parked free copies of ``block_hash`` (they may have become evictable);
        a copy whose entry is still queued needs nothing."""
        found, refs, live = self.index._map.get(block_hash), self.ref_counts, self._live
        for block_id in ((found,) if found.__class__ is int else found or ()):
            if refs[block_id] == 0 and live[block_id] is None:
                self._push(block_id)
