"""A :class:`~kvsim.cache.policy_pool.PolicyPool` that evicts free cached blocks in the order of an
eviction policy (:mod:`kvsim.cache.policies`) instead of vLLM's LRU."""

from __future__ import annotations

from collections import OrderedDict
from heapq import heapify, heappop, heappush
from typing import Iterable

from kvsim.cache.policy_pool import PolicyPool


class ScoredBlockPool(PolicyPool):
    """A :class:`~kvsim.cache.policy_pool.PolicyPool` whose free cached blocks are evicted in a policy's order.

    Free unhashed blocks stay in the ``OrderedDict`` (reused first, as vLLM). A free cached
    block gets its key from ``policy.key`` when released and goes into a min-heap; entries are
    invalidated lazily (a per-block stamp), and the heap is rebuilt when stale entries outnumber
    live ones, so every block operation is O(log n) amortised.

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
        self.depth = [0] * num_blocks      # blocks before it in its chain
        self._parent: list[int | None] = [None] * num_blocks   # hash of its chain parent
        self._children: dict[int, int] = {}                    # hash -> cached children
        self._cached_free: dict[int, None] = {}
        self._key: list[tuple | None] = [None] * num_blocks
        self._stamp = [0] * num_blocks
        self._heap: list[tuple] = []
        self._clock = 0
        self._priority = 0

    # --- queries -------------------------------------------------------------------------

    def cached_free_order(self) -> list[int]:
        """Free cached blocks by eviction key (the chain rule may still defer a block with a
        cached child)."""
        return sorted(self._cached_free, key=self._key.__getitem__)

    # --- actions -------------------------------------------------------------------------

    def begin(self, request_id, priority: int = 0) -> None:
        self._priority = priority
        self.policy.begin(request_id)

    def get_new_blocks(self, n: int) -> list[int]:
        """Take ``n`` free blocks: unhashed ones first, then the policy's victims."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot get {n} free blocks: only {self.num_free_blocks} are free")
        free, taken = self._free, []
        for _ in range(n):
            block_id = free.popitem(last=False)[0] if free else self._evict()
            self.ref_counts[block_id] = 1
            self.hits[block_id] = 0
            self.prio[block_id] = self._priority
            taken.append(block_id)
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
                    self._stamp[block_id] += 1
            refs[block_id] += 1
            self.hits[block_id] += 1
            if priority < self.prio[block_id]:
                self.prio[block_id] = priority

    def free_blocks(self, ordered_block_ids: Iterable[int]) -> None:
        refs, hashes, first = self.ref_counts, self.block_hashes, []
        for block_id in ordered_block_ids:
            refs[block_id] -= 1
            if refs[block_id] == 0:
                if hashes[block_id] is None:
                    first.append(block_id)
                    continue
                self._clock += 1
                self._key[block_id] = self.policy.key(self, block_id, hashes[block_id],
                                                      self._clock)
                self._cached_free[block_id] = None
                self.num_cached_free_blocks += 1
                self._push(block_id)
        self._prepend(first)

    def cache_blocks(self, block_ids, block_hashes, depth: int = 0, parent=None) -> None:
        parent_hash = self.block_hashes[parent] if parent is not None else None
        index, children = self.index._map, self._children
        for block_id, block_hash in zip(block_ids, block_hashes):
            second_copy = block_hash in index and block_hash in children
            self.block_hashes[block_id] = block_hash
            self.index.insert(block_hash, block_id)
            self.depth[block_id] = depth
            self._parent[block_id] = parent_hash
            if parent_hash is not None:
                children[parent_hash] = children.get(parent_hash, 0) + 1
            if second_copy:
                self._wake(block_hash)   # an older free copy may now go
            parent_hash, depth = block_hash, depth + 1

    def reset_prefix_cache(self) -> bool:
        if not self.can_reset():
            return False
        order = self.free_queue()
        self._free = OrderedDict.fromkeys(order)
        self._cached_free.clear()
        self._children.clear()
        self._heap.clear()
        self._parent = [None] * self.num_blocks
        self.index.clear()
        self.block_hashes = [None] * self.num_blocks
        self.num_cached_free_blocks = 0
        return True

    # --- internals -----------------------------------------------------------------------

    def _push(self, block_id: int) -> None:
        self._stamp[block_id] += 1
        heappush(self._heap, (*self._key[block_id], block_id, self._stamp[block_id]))
        if len(self._heap) > 2 * len(self._cached_free) + 64:
            self._compact()

    def _compact(self) -> None:
        stamp, key = self._stamp, self._key
        self._heap = [(*key[b], b, stamp[b]) for b in self._cached_free]
        heapify(self._heap)

    def _eligible(self, block_id: int) -> bool:
        block_hash = self.block_hashes[block_id]
        if block_hash not in self._children:
            return True
        found = self.index._map[block_hash]    # an int, or a dict of one or more copies
        return found.__class__ is not int and len(found) > 1

    def _evict(self) -> int:
        heap, stamp = self._heap, self._stamp
        while heap:
            entry = heappop(heap)
            block_id = entry[-2]
            if entry[-1] == stamp[block_id] and self._eligible(block_id):
                break
        else:   # no eligible block: hashes that are not chained (see the class docstring)
            block_id = min(self._cached_free, key=self._key.__getitem__)
        if self.evicted is not None:
            self.evicted.append((block_id, self.block_hashes[block_id]))
        self._uncache(block_id)
        self.policy.on_evict(self._key[block_id])
        return block_id

    def _uncache(self, block_id: int) -> None:
        block_hash = self.block_hashes[block_id]
        self.index.remove(block_hash, block_id)
        self.block_hashes[block_id] = None
        del self._cached_free[block_id]
        self.num_cached_free_blocks -= 1
        self.num_evictions += 1
        self._stamp[block_id] += 1
        parent_hash, self._parent[block_id] = self._parent[block_id], None
        if parent_hash is not None:
            left = self._children[parent_hash] - 1
            if left:
                self._children[parent_hash] = left
            else:
                del self._children[parent_hash]
                self._wake(parent_hash)

    def _wake(self, block_hash: int) -> None:
        """Re-queue the free copies of ``block_hash`` (they may have become evictable)."""
        found = self.index._map.get(block_hash)
        for block_id in ((found,) if found.__class__ is int else found or ()):
            if block_id in self._cached_free:
                self._push(block_id)
