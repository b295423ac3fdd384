"""A :class:`~kvsim.cache.policy_pool.PolicyPool` that evicts free cached blocks in the order of an
eviction policy (:mod:`kvsim.cache.policies`) instead of vLLM's LRU."""

from __future__ import annotations

from collections import OrderedDict
from heapq import heapify, heappop, heappush, heappushpop
from typing import Iterable

from kvsim.cache.policies import heap_entry, unpack_key
from kvsim.cache.policy_pool import PolicyPool

__all__ = ["ScoredBlockPool", "heap_entry"]


class ScoredBlockPool(PolicyPool):
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
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True, policy=None):
        super().__init__(num_blocks, enable_caching, policy)
        self.hits = [0] * num_blocks       # prefix hits since the block was filled
        self.prio = [0] * num_blocks       # best (lowest) priority of its users since then
        self._parent: list[int | None] = [None] * num_blocks   # hash of its chain parent
        self._children: dict[int, int] = {}                    # hash -> cached children
        self._cached_free: dict[int, None] = {}
        self._entry: list[int | None] = [None] * num_blocks  # key and id packed (heap_entry)
        self._live: list[int | None] = [None] * num_blocks   # its entry in the heap, if any
        self._id_bits = num_blocks.bit_length()
        self._heap: list[int] = []
        self._parked: set[int] = set()     # free blocks popped while ineligible (see _wake)
        self._clock = 0
        self._priority = 0

    # --- queries -------------------------------------------------------------------------

    def cached_free_order(self) -> list[int]:
        """Free cached blocks by eviction key (the chain rule may still defer a block with a
        cached child)."""
        return sorted(self._cached_free, key=self._entry.__getitem__)

    def key_of(self, block_id: int) -> tuple:
        """The policy key ``block_id`` got when it was last released."""
        return unpack_key(self._entry[block_id], self.policy.num_key_parts, self._id_bits)

    # --- actions -------------------------------------------------------------------------

    def begin(self, request_id, priority: int = 0) -> None:
        self._priority = priority
        self.policy.begin(request_id)

    def get_new_blocks(self, n: int) -> list[int]:
        """Take ``n`` free blocks: unhashed ones first, then the policy's victims."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot get {n} free blocks: only {self.num_free_blocks} are free")
        popitem, num_unhashed = self._free.popitem, min(n, len(self._free))
        taken = [popitem(last=False)[0] for _ in range(num_unhashed)]
        if n > num_unhashed:
            taken += self._evict_many(n - num_unhashed)
        refs, hits, prio, priority = self.ref_counts, self.hits, self.prio, self._priority
        for block_id in taken:
            refs[block_id] = 1
            hits[block_id] = 0
            prio[block_id] = priority
        return taken

    def touch(self, block_ids: Iterable[int]) -> None:
        refs, priority = self.ref_counts, self._priority
        for block_id in block_ids:
            if refs[block_id] == 0:
                if self.block_hashes[block_id] is None:
                    del self._free[block_id]
                else:
                    del self._cached_free[block_id]
                    self.num_cached_free_blocks -= 1
                    self._live[block_id] = None
                    self._parked.discard(block_id)
            refs[block_id] += 1
            self.hits[block_id] += 1
            if priority < self.prio[block_id]:
                self.prio[block_id] = priority

    def free_blocks(self, ordered_block_ids: Iterable[int]) -> None:
        refs, hashes, first, released = self.ref_counts, self.block_hashes, [], []
        for block_id in ordered_block_ids:
            refs[block_id] -= 1
            if refs[block_id] == 0:
                (released if hashes[block_id] is not None else first).append(block_id)
        if released:
            clock = self._clock + 1
            self._clock += len(released)
            entries = self._entry
            for block_id, entry in zip(released, self.policy.entries(self, released, clock,
                                                                      self._id_bits)):
                entries[block_id] = entry
            self._cached_free.update(dict.fromkeys(released))
            self.num_cached_free_blocks += len(released)
            self._queue_released(released)
        self._prepend(first)

    def cache_blocks(self, block_ids, block_hashes, depth: int = 0, parent=None) -> None:
        """Register full, held blocks of one chain after block ``parent`` (None at the root);
        each block's parent hash is counted as having one more cached child."""
        parent_hash = self.block_hashes[parent] if parent is not None else None
        index, children, get = self.index._map, self._children, self._children.get
        hashes, parents = self.block_hashes, self._parent
        for block_id, block_hash in zip(block_ids, block_hashes):
            hashes[block_id] = block_hash
            parents[block_id] = parent_hash
            if parent_hash is not None:
                children[parent_hash] = get(parent_hash, 0) + 1
            if block_hash in index:
                self._cache_copy(block_id, block_hash)
            else:
                index[block_hash] = block_id
            parent_hash = block_hash

    def reset_prefix_cache(self) -> bool:
        if not self.can_reset():
            return False
        order = self.free_queue()
        self._free = OrderedDict.fromkeys(order)
        self._cached_free.clear()
        self._children.clear()
        self._heap.clear()
        self._parked.clear()
        self._parent = [None] * self.num_blocks
        self.index.clear()
        self.block_hashes = [None] * self.num_blocks
        self.num_cached_free_blocks = 0
        return True

    # --- internals -----------------------------------------------------------------------

    def _cache_copy(self, block_id: int, block_hash: int) -> None:
        """Register ``block_id`` as another copy of cached content: an older free copy with a
        cached child may now go (only one copy must stay), so parked copies are woken."""
        second_copy = block_hash in self._children
        self.index.insert(block_hash, block_id)
        if second_copy:
            self._wake(block_hash)

    def _push(self, block_id: int) -> None:
        """Queue ``block_id`` under its current key (its older entries go stale)."""
        self._parked.discard(block_id)
        self._push_all([block_id])

    def _push_all(self, block_ids: list[int]) -> None:
        """:meth:`_push` for each of ``block_ids`` (none of them parked)."""
        heap, live, entries = self._heap, self._live, self._entry
        for block_id in block_ids:
            entry = live[block_id] = entries[block_id]
            heappush(heap, entry)
        if len(heap) > 2 * len(self._cached_free) + 64:
            self._compact()

    def _queue_released(self, block_ids: list[int]) -> None:
        """Queue just released blocks: the eligible ones into the heap, the others parked at
        once (the heap would only drop them when met: same victims, fewer heap entries)."""
        hashes, children, index, parked = self.block_hashes, self._children, self.index._map, []
        eligible = []
        for block_id in block_ids:
            block_hash = hashes[block_id]
            if block_hash not in children:
                eligible.append(block_id)
                continue
            found = index[block_hash]
            (eligible if found.__class__ is not int and len(found) > 1 else parked).append(block_id)
        self._parked.update(parked)
        self._push_all(eligible)

    def _compact(self) -> None:
        live, entries = self._live, self._entry
        for block_id in self._cached_free:
            live[block_id] = entries[block_id]
        self._heap[:] = [live[block_id] for block_id in self._cached_free]   # in place
        heapify(self._heap)
        self._parked.clear()

    def _evict_many(self, n: int) -> list[int]:
        """The next ``n`` victims, uncached (one loop: the hottest of a non-LRU simulation).

        A victim's parent, woken when its last cached child goes, is usually the next victim:
        its entry waits in ``woken`` and meets the heap by ``heappushpop`` (no heap work when it
        is the smallest)."""
        hashes, index, children = self.block_hashes, self.index._map, self._children
        live, parked, parents, entries = self._live, self._parked, self._parent, self._entry
        cached_free, evicted, victims, woken = self._cached_free, self.evicted, [], None
        heap = self._heap
        for _ in range(n):
            if woken is not None and (not heap or woken < heap[0]):
                block_id = woken_id     # a leaf now, and the smallest entry: no heap work
            else:
                block_id = self._next_victim(woken)
            woken = None
            block_hash = hashes[block_id]
            if evicted is not None:
                evicted.append((block_id, block_hash))
            if index[block_hash].__class__ is int:
                del index[block_hash]
            else:
                self.index.remove(block_hash, block_id)
            hashes[block_id] = None
            del cached_free[block_id]
            live[block_id] = None
            parent_hash = parents[block_id]
            if parent_hash is not None:
                parents[block_id] = None
                left = children[parent_hash] - 1
                if left:
                    children[parent_hash] = left
                else:
                    del children[parent_hash]
                    found = index.get(parent_hash)
                    if found.__class__ is int and found in parked:
                        parked.remove(found)
                        woken, woken_id = entries[found], found
                        live[found] = woken
                    else:
                        self._wake(parent_hash)
            victims.append(block_id)
        if woken is not None:
            heappush(heap, woken)
        self.num_cached_free_blocks -= n
        self.num_evictions += n
        return victims

    def _next_victim(self, woken: int | None) -> int:
        """The free cached block with the smallest live entry (in the heap, or ``woken``) that
        is eligible: a chain leaf, or a block whose content another block also holds. An
        ineligible block met on the way is *parked* (dropped from the heap) until
        :meth:`_wake`."""
        heap, live, hashes = self._heap, self._live, self.block_hashes
        children, index, id_mask = self._children, self.index._map, (1 << self._id_bits) - 1
        while heap or woken is not None:
            if woken is None:
                entry = heappop(heap)
            else:
                entry, woken = heappushpop(heap, woken), None
            block_id = entry & id_mask
            if live[block_id] != entry:
                continue
            block_hash = hashes[block_id]
            if block_hash not in children:
                return block_id
            found = index[block_hash]   # an int, or a dict of one or more copies
            if found.__class__ is not int and len(found) > 1:
                return block_id
            live[block_id] = None
            self._parked.add(block_id)
        # no eligible block: hashes that are not chained (see the class docstring)
        block_id = min(self._cached_free, key=self._entry.__getitem__)
        self._parked.discard(block_id)
        return block_id

    def _wake(self, block_hash: int) -> None:
        """Re-queue the parked free copies of ``block_hash`` (they may have become evictable);
        a copy whose entry is still queued needs nothing."""
        found, parked = self.index._map.get(block_hash), self._parked
        if not parked:
            return
        for block_id in ((found,) if found.__class__ is int else found or ()):
            if block_id in parked:
                self._push(block_id)
