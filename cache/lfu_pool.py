"""LFU's pool: the LRU pool's free queues, one per hit count.

LFU evicts the free cached block with the smallest ``(hits, release clock)``: ``hits`` counts
the prefix hits a block took since it was filled, fixed for a free block at its release. Within
one count the order is the release order, so each count is an LRU free queue (the plain pool's
:class:`~kvsim.cache.free_queue.FreeQueue`) and counts are classes: the victims are the head of
the lowest queue that has blocks, a run at a time, as the plain pool takes them.

The chain rule of the scored pools (a block stays while its content has a cached child and no
other copy) holds here by itself but in one case. A child is filled after its parent and every
hit on it is a hit on its parent (a prefix hit takes the whole prefix), so the parent has at
least as many hits; whoever holds the child holds the parent, so the parent is released last,
tail first in the same release or later. The parent's key is larger: it never goes first.
``tests/test_lane_pool.py`` checks every victim against the scored pool's definition by brute
force, and ``tests/test_lfu_pool.py`` runs both pools side by side.

The case: content held twice (two requests filled the same block at once, with chunked
prefill). Lookups hit the older copy; a request that continued the chain from the younger one
leaves the child's hits on the older. Once the older copy is evicted (a copy may go), the
younger can have fewer hits than its child and go first; the child then waits, unreachable,
for its own turn. The scored pool would keep the younger copy until its child goes. None of the
traces and settings checked (docs/performance.md) met it. Hash ids that are not chained (one id
after two parents) can break the rule the same way; the scored pool would still take the
best-keyed block when no leaf is left, and here it is always the best-keyed.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from kvsim.cache.block_pool import BlockPool
from kvsim.cache.free_queue import FreeQueue
from kvsim.cache.policy_pool import KeyedUse

__all__ = ["LFUPool"]

_SERIAL_BITS = 40       # serial numbers a count's queue gives before the next queue's range


class LFUPool(KeyedUse, BlockPool):
    """A :class:`~kvsim.cache.block_pool.BlockPool` with a free queue per hit count (the
    uncached free blocks at the head of count 0's, reused first as vLLM); see the module
    docstring. ``hits[b]``: the prefix hits block ``b`` took since it was filled."""

    def _init_free_blocks(self, num_blocks: int) -> None:
        super()._init_free_blocks(num_blocks)
        self.hits = np.zeros(num_blocks, dtype=np.int64)
        self._count = np.zeros(num_blocks, dtype=np.int64)      # the queue a free block is in
        self._released_at = np.zeros(num_blocks, dtype=np.int64)    # its release clock
        self._queues: dict[int, FreeQueue] = {0: self._free}    # hit count -> free queue
        self._range_of = {0: 0}         # hit count -> its queue's range of serial numbers
        self._spare_ranges: list[int] = []      # of queues dropped (their stamps all gone)
        self._clock = 0

    # --- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        if len(self._queues) == 1:
            return len(self._free)
        return sum(map(len, self._queues.values()))

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def free_queue(self) -> list[int]:
        """Free block ids, the next reused first: uncached ones, then by hit count."""
        return [b for count in sorted(self._queues) for b in self._queues[count].ids().tolist()]

    def cached_free_order(self) -> list[int]:
        """Free cached blocks, the next victim first."""
        content = self._content
        return [b for b in self.free_queue() if content[b]]

    def key_of(self, block_id: int) -> tuple[int, int]:
        """The LFU key free cached ``block_id`` got at its release: (hits, release clock)."""
        return int(self._count[block_id]), int(self._released_at[block_id])

    def can_get_new_blocks(self, n: int) -> bool:
        return n <= self.num_free_blocks

    def can_reset(self) -> bool:
        return self.num_free_blocks == self.num_blocks

    # --- actions -------------------------------------------------------------------------

    def get_new_blocks(self, n: int) -> list[int]:
        """Take ``n`` free blocks: uncached ones first, then by hit count, LRU within one."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot get {n} free blocks: only {self.num_free_blocks} are free")
        taken = self._free.popleft(n) if n <= len(self._free) else self._take_by_count(n)
        self.ref_counts[taken] = 1
        self.hits[taken] = 0
        self._evict(taken)
        return taken.tolist()

    def touch(self, block_ids: Iterable[int]) -> None:
        """A prefix hit: another reference on each block (distinct) and one more hit; free
        ones leave their queue."""
        ids = np.fromiter(block_ids, dtype=np.int64)
        if not len(ids):
            return
        free = ids[self.ref_counts[ids] == 0]
        self.ref_counts[ids] += 1
        self.hits[ids] += 1
        if len(free):
            self._unqueue(free)
            self.num_cached_free_blocks -= len(free)

    def cache_blocks(self, block_ids, block_hashes, depth: int = 0, parent=None,
                     chain_mark=None) -> None:
        """As :meth:`BlockPool.cache_blocks` (LFU needs no chain information either)."""
        super().cache_blocks(block_ids, block_hashes, depth, parent)

    def claim(self, block_ids) -> None:
        raise NotImplementedError("contiguous regions (the hybrid layout) page with lru only")

    def reset_prefix_cache(self) -> bool:
        order = np.array(self.free_queue(), dtype=np.int64)
        if not super().reset_prefix_cache():
            return False
        self._free = FreeQueue(self.num_blocks, filled=False)
        self._free.extend(order)
        self._queues, self._range_of, self._spare_ranges = {0: self._free}, {0: 0}, []
        self._count[:] = 0
        return True

    # --- internals -----------------------------------------------------------------------

    def _queue_cached(self, block_ids: np.ndarray) -> None:
        """Queue cached blocks just released (in this order) by their hit counts."""
        k = len(block_ids)
        if not k:
            return
        self._released_at[block_ids] = np.arange(self._clock + 1, self._clock + k + 1)
        self._clock += k
        counts = self.hits[block_ids]
        self._count[block_ids] = counts
        if not counts.any():            # (most releases)
            self._free.extend(block_ids)
            return
        for count in np.unique(counts).tolist():
            queue = self._queues.get(count)
            if queue is None:
                queue = self._new_queue(count)
            queue.extend(block_ids[counts == count])

    def _unqueue(self, block_ids: np.ndarray) -> None:
        """Take free blocks out of their queues."""
        if len(self._queues) == 1:
            self._free.remove(block_ids)
            return
        counts = self._count[block_ids]
        for count in np.unique(counts).tolist():
            self._queues[count].remove(block_ids[counts == count])
            self._forget_if_empty(count)

    def _take_by_count(self, n: int) -> np.ndarray:
        """The ``n`` next free blocks, queue by queue from count 0 (more than count 0 has)."""
        parts = []
        for count in sorted(self._queues):
            queue = self._queues[count]
            part = queue.popleft(min(n, len(queue)))
            parts.append(part)
            n -= len(part)
            self._forget_if_empty(count)
            if not n:
                break
        return np.concatenate(parts)

    def _new_queue(self, count: int) -> FreeQueue:
        """An empty queue for ``count``, sharing the block stamps of count 0's (one array for
        every count) with a range of serial numbers no other queue has."""
        spare = self._spare_ranges
        at = self._range_of[count] = spare.pop() if spare else len(self._range_of)
        queue = self._queues[count] = FreeQueue(self.num_blocks, filled=False, beside=self._free,
                                                first_serial=at << _SERIAL_BITS)
        return queue

    def _forget_if_empty(self, count: int) -> None:
        """Drop an empty queue of a nonzero count (counts come and go); its range is free."""
        if count and not self._queues[count]:
            del self._queues[count]
            self._spare_ranges.append(self._range_of.pop(count))
