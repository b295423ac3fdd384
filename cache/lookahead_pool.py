"""The pool of ``lookahead`` (:mod:`kvsim.cache.lookahead`): FIFO lanes
(:class:`~kvsim.cache.lane_pool.LanePool`) for unprotected blocks, and for protected ones two
more lanes and a heap.

A block is *protected* while a queued request's lookup reaches its hash: released so, or
protected later while free (:meth:`LookaheadPool.protect`). Protected blocks are evicted only
when no unprotected one is left, by their key ``(1, clock + credit, 0 if credited else 1)``.
Blocks released protected keep release order in two *guarded* lanes (reused chain or not), as
unprotected ones do; a block protected while free keeps its clock and credit, so it goes to a
heap, its key packed as :func:`~kvsim.cache.policies.heap_entry` packs it. The victim among
them is the smaller of the guarded lanes' choice and the heap's top.

``free_blocks`` takes one block table's blocks (or those of them now free), tail first, as
every caller frees them: that is what lets a release find its wanted blocks by bisection.
"""

from __future__ import annotations

from bisect import bisect_left
from heapq import heappop, heappush

from kvsim.cache.lane import Lane
from kvsim.cache.lane_pool import LanePool
from kvsim.cache.policies import unpack_key

__all__ = ["LookaheadPool"]


class LookaheadPool(LanePool):
    """A :class:`~kvsim.cache.lane_pool.LanePool` whose policy reads the waiting queue: it
    protects the free blocks a queued request will look up and tells the policy which hashes
    got cached (``reached``).

    A finished request's private blocks stay out of the index here too (``UNREACHABLE``,
    see :meth:`LanePool.cache_unreachable`), and the policy is not told of them: only the
    request itself looks them up, once preempted, and a preemption registers them first."""

    def __init__(self, num_blocks: int, enable_caching: bool = True, policy=None):
        super().__init__(num_blocks, enable_caching, policy)
        self._guarded = Lane()            # blocks released protected
        self._guarded_credited = Lane()   # (the credit is >= 1)
        self._heap: list[int] = []          # packed keys of blocks protected while free
        self._protected: dict[int, int] = {}    # such a block -> its live heap entry
        self._id_bits = num_blocks.bit_length()
        self._id_mask = (1 << self._id_bits) - 1
        policy.pool = self
        self._reached = getattr(policy, "reached", None)

    # --- queries -------------------------------------------------------------------------

    def cached_free_blocks(self) -> list[int]:
        return [*super().cached_free_blocks(), *self._guarded, *self._guarded_credited,
                *self._protected]

    def key_of(self, block_id: int) -> tuple:
        if block_id in self._protected:
            return self._key(None, self._protected[block_id])
        for lane in (self._guarded, self._guarded_credited):
            if block_id in lane:
                return self._key(None, self._protected_entry(block_id, lane[block_id]))
        return super().key_of(block_id)

    def _key(self, offset, value: int) -> tuple:
        """A lane's key, or (``offset`` None) the key packed in heap entry ``value``."""
        if offset is None:
            return unpack_key(value, self._id_bits, self.policy.key_part_bits)
        return super()._key(offset, value)

    # --- actions -------------------------------------------------------------------------

    def cache_blocks(self, block_ids, block_hashes, depth: int = 0, parent=None,
                     chain_mark: bool | None = None) -> None:
        super().cache_blocks(block_ids, block_hashes, depth, parent, chain_mark)
        if self._reached is not None:
            self._reached(block_hashes)

    def protect(self, block_ids) -> None:
        """Those of ``block_ids`` that are free, cached and not protected yet are now wanted by
        a queued request: they leave their lane for the heap, their clock and credit kept."""
        refs, protected, deferred = self.ref_counts, self._protected, self._deferred
        for block_id in block_ids:
            if refs[block_id] or block_id in protected:
                continue
            if block_id in deferred:
                offset, clock = deferred[block_id]
                if offset is not None:
                    deferred[block_id] = (None, self._protected_entry(block_id, clock))
                continue
            lane = self._credited if self.reused[block_id] else self._plain
            clock = lane.pop(block_id, None)
            if clock is not None:           # (else it is in a guarded lane: protected)
                self._push_protected(block_id, clock)

    def reset_prefix_cache(self) -> bool:
        if not super().reset_prefix_cache():
            return False
        self._guarded.clear()
        self._guarded_credited.clear()
        self._heap.clear()
        self._protected.clear()
        return True

    # --- internals -----------------------------------------------------------------------

    def _queue_released(self, block_ids: list[int], clock: int) -> None:
        """:meth:`LanePool._queue`, the blocks whose hash a queued lookup reaches to the
        guarded lanes.

        A release is (part of) one block table, tail first (each caller frees one table at a
        time), and block ids are prefix identities, so the wanted hashes (closed under chain
        parents: a lookup reaches a prefix) are the release's last blocks: found by bisection,
        not looked up one by one."""
        wanted, hashes = self.policy.wanted.counts, self.block_hashes
        first = bisect_left(block_ids, True, key=lambda b: hashes[b] in wanted) if wanted \
            else len(block_ids)
        self._queue(block_ids[:first], range(clock, clock + first))
        if first < len(block_ids):
            self._append(self._guarded, self._guarded_credited, block_ids[first:],
                         range(clock + first, clock + len(block_ids)))

    def _push_protected(self, block_id: int, clock: int) -> None:
        """Queue ``block_id`` released at ``clock`` in the heap under its protected key."""
        entry = self._protected[block_id] = self._protected_entry(block_id, clock)
        heappush(self._heap, entry)

    def _protected_entry(self, block_id: int, clock: int) -> int:
        """``(1, clock + credit, 0 if credited else 1)`` packed with the block id, as
        :func:`~kvsim.cache.policies.heap_entry` packs it."""
        clock_bits, flag_bits = self.policy.key_part_bits
        if self.reused[block_id]:
            key = ((1 << clock_bits) + clock + self.credit) << flag_bits
        else:
            key = (((1 << clock_bits) + clock) << flag_bits) + 1
        return (key << self._id_bits) + block_id

    def _unqueue(self, block_id: int) -> None:
        if self._protected.pop(block_id, None) is None and \
                self._guarded.pop(block_id, None) is None and \
                self._guarded_credited.pop(block_id, None) is None:   # (a heap entry goes stale)
            super()._unqueue(block_id)

    def _requeue(self, block_id: int, offset, value: int) -> None:
        if offset is not None:
            super()._requeue(block_id, offset, value)
            return
        self._protected[block_id] = value
        heappush(self._heap, value)

    def _second_lanes(self) -> tuple | None:
        """The guarded lanes, while no protected block is in the heap (the usual case: else
        :meth:`_next_after_lanes` merges them with it, victim by victim)."""
        if self._protected or not (self._guarded or self._guarded_credited):
            return None
        return self._guarded, self._guarded_credited

    def _defers_head(self, block_id: int, second: bool, offset: int, clock: int) -> bool:
        if second:      # a guarded block waits as a protected one: its key packed
            return self._defers(block_id, None, self._protected_entry(block_id, clock))
        return self._defers(block_id, offset, clock)

    def _next_after_lanes(self) -> int:
        """The protected block with the smallest key that is not deferred; with none, as
        :meth:`LaneEviction._next_after_lanes`."""
        while True:
            block_id, entry = self._take_protected()
            if block_id is None:
                return super()._next_after_lanes()
            if self._depth[block_id] or not self._defers(block_id, None, entry):
                return block_id

    def _take_protected(self) -> tuple:
        """Take the protected block with the smallest key: the older of the guarded lanes'
        heads (the credited one counting its offset more, as :meth:`LaneEviction._evict_many`
        compares) or the heap's smallest live entry. Returns it and its packed key, or
        ``(None, None)``."""
        heap, protected, mask = self._heap, self._protected, self._id_mask
        while heap and protected.get(heap[0] & mask) != heap[0]:
            heappop(heap)           # stale: taken by a hit, or deferred
        lane, block_id = self._guarded_head()
        if lane is not None:
            entry = self._protected_entry(block_id, lane[block_id])
            if not heap or entry < heap[0]:
                lane.popleft()
                return block_id, entry
        if not heap:
            return None, None
        entry = heappop(heap)
        del protected[entry & mask]
        return entry & mask, entry

    def _guarded_head(self) -> tuple:
        """The guarded lane whose head goes first, and that head (``(None, None)`` if both
        are empty)."""
        plain, credited = self._guarded, self._guarded_credited
        head = plain.head()
        if credited:
            other = credited.head()
            if head is None or other[1] + self.credit <= head[1]:
                return credited, other[0]
        return (plain, head[0]) if head is not None else (None, None)
