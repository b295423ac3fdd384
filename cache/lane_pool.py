"""The pool of policies whose key is a release clock plus a per-class offset (``hybrid``,
``lookahead``, ``priority``): free cached blocks in FIFO lanes, one per offset.

``hybrid`` evicts the smallest ``(clock + offset, clock)`` with ``offset = N/2 * reused - N *
priority`` (:class:`~kvsim.cache.policies.HybridPolicy`), ``priority`` the smallest
``(-priority, clock)``, a lane per level (``offset = -2**48 * priority``), ``lookahead`` the
smallest ``(0, clock + offset, 0 if offset else 1)`` with ``offset = N * reused`` among unprotected blocks
(:class:`~kvsim.cache.lookahead_pool.LookaheadPool` adds its protected blocks). Within a class
the key grows with the release clock, so each class is a FIFO *lane*
(:class:`~kvsim.cache.lane.Lane`: blocks with their release clocks) and the victim is the
smallest of the lanes' heads: an eviction takes a lane's head, as in vLLM's LRU queue, instead
of a heap operation and a packed key per released block, and a run of victims from one lane is
a slice. With every priority 0 there are two lanes (reused or not); a tie on ``clock + offset``
goes to the lane with the larger offset (the smaller clock), as both keys order it.

The chain rule of :class:`~kvsim.cache.scored_pool.ScoredBlockPool` (a block whose content has
a cached child stays while it is its only copy) needs no bookkeeping here except for a chain's
*first* block, which is never reused: it is deferred while its content has cached children
(counted per hash) and taken as soon as the last one goes. Why the keys keep the rule for every
other block is in docs/eviction.md; the tests check victims against the rule by brute force.
Taking the victims is :class:`~kvsim.cache.lane_eviction.LaneEviction`'s.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import compress
from typing import Iterable, Sequence

from kvsim.cache.bulk import gather, set_all, set_each
from kvsim.cache.lane import Lane
from kvsim.cache.lane_eviction import LaneEviction
from kvsim.cache.policy_pool import UNREACHABLE, PolicyPool

__all__ = ["LanePool"]


class LanePool(LaneEviction, PolicyPool):
    """A :class:`~kvsim.cache.policy_pool.PolicyPool` evicting from FIFO lanes by offset (see
    the module docstring). It marks blocks of reused chains (``reused``) and, for a policy that
    reads them (``uses_priority``), keeps each block's best priority (``prio``). The policy
    gives the offset of a reused block (``lane_credit(num_blocks)``) and the key of a block in
    a lane (``lane_key(clock, offset)``)."""

    opens_in_bulk = "new_chains"
    # blocks no other request can hit may stay out of the index (UNREACHABLE) once their
    # chain's first two blocks, whose depth the chain rule reads, are registered
    caches_unreachable = True
    num_always_registered = 2

    def __init__(self, num_blocks: int, enable_caching: bool = True, policy=None):
        super().__init__(num_blocks, enable_caching, policy)
        # per-block flags in bytearrays (one byte a block: they stay in the CPU's cache)
        self.was_hit = bytearray(num_blocks)    # 1: a prefix hit since the block was filled
        self.reused = bytearray(num_blocks)     # 1: the block belongs to a reused chain
        self.prio = [0] * num_blocks       # best (lowest) priority of its users since filled
        self.first_hashes: list[int | None] = [None] * num_blocks    # a child's first block's
        self.credit = policy.lane_credit(num_blocks)    # the offset of a reused block
        self._plain = Lane()
        self._credited = Lane() if self.credit else self._plain  # (no credit: one)
        self._lanes = {0: self._plain, self.credit: self._credited}     # offset -> lane
        self._two_lanes = True          # only those (one or two): the fast eviction loop
        self._deferred: dict[int, tuple] = {}   # first block with cached children -> its key
        self._first_children: dict[int, int] = {}   # first-block hash -> its cached children
        self._depth = bytearray([2]) * num_blocks   # 0: a first block, 1: its child, 2: deeper
        self._clock = 0
        self._priority = 0
        self._uses_priority = policy.uses_priority
        if self._uses_priority:
            self._priority_weight = policy.priority_weight(num_blocks)
            self._priority_limit = policy.priority_limit
        self.priorities_seen = False        # every prio is 0 until a request has another
        self._lane_key = policy.lane_key

    # --- queries -------------------------------------------------------------------------

    def cached_free_blocks(self) -> list[int]:
        """The free cached blocks: lane by lane, then deferred ones."""
        return [b for lane in self._lanes.values() for b in lane] + list(self._deferred)

    def cached_free_order(self) -> list[int]:
        """Free cached blocks by eviction key (a first block may still be deferred)."""
        return sorted(self.cached_free_blocks(), key=lambda b: (self.key_of(b), b))

    def key_of(self, block_id: int) -> tuple:
        """The policy key of free cached ``block_id``."""
        if block_id in self._deferred:
            return self._key(*self._deferred[block_id])
        for offset, lane in self._lanes.items():
            if block_id in lane:
                return self._key(offset, lane[block_id])
        raise KeyError(f"block {block_id} is not free and cached")

    def _key(self, offset: int, clock: int) -> tuple:
        return self._lane_key(clock, offset)

    # --- actions -------------------------------------------------------------------------

    def begin(self, request_id, priority: int = 0) -> None:
        if self._uses_priority:
            self._priority = priority
            self.priorities_seen = self.priorities_seen or priority != 0
        self.policy.begin(request_id)

    def get_new_blocks(self, n: int) -> list[int]:
        """Take ``n`` free blocks: unhashed ones first, then the policy's victims."""
        taken = self._take_unhashed(n)
        num_unhashed, refs, was_hit = len(taken), self.ref_counts, self.was_hit
        for block_id in taken:
            refs[block_id] = 1
            was_hit[block_id] = 0
        if n > num_unhashed:
            taken += self._evict_many(n - num_unhashed)
        if self.priorities_seen:
            prio, priority = self.prio, self._priority
            for block_id in taken:
                prio[block_id] = priority
        return taken

    def touch(self, block_ids: Iterable[int]) -> None:
        block_ids = list(block_ids)
        refs, was_hit, hashes = self.ref_counts, self.was_hit, self.block_hashes
        for block_id in block_ids:
            if refs[block_id] == 0:
                if hashes[block_id] is None:
                    del self._free[block_id]
                else:
                    self.num_cached_free_blocks -= 1
                    self._unqueue(block_id)
            refs[block_id] += 1
            was_hit[block_id] = 1
        reused = self.reused        # a hit's blocks after its first belong to a reused chain
        for block_id in block_ids[1:]:
            reused[block_id] = 1
        if self.priorities_seen:
            prio, priority = self.prio, self._priority
            for block_id in block_ids:
                if priority < prio[block_id]:
                    prio[block_id] = priority

    def free_blocks(self, ordered_block_ids: Iterable[int]) -> None:
        released, first = self._drop_refs(ordered_block_ids)
        if released:
            self._queue_released(released, self._count_released(released))
        self._prepend(first)

    def cache_blocks(self, block_ids, block_hashes, depth: int = 0, parent=None,
                     chain_mark: bool | None = None) -> None:
        """Register full, held blocks of one chain after block ``parent`` (None at the root);
        they belong to a reused chain when the chain they continue does (when their first
        filled, if ``chain_mark`` says how it was then)."""
        set_each(self.block_hashes, block_ids, block_hashes)
        set_all(self.reused, block_ids,
                self.chain_mark(parent) if chain_mark is None else chain_mark)
        self.index.insert_many(block_hashes, block_ids)
        if block_ids and (parent is None or not self._depth[parent]):
            self._count_first_children(block_ids, parent)   # a first block, or its child

    def cache_unreachable(self, block_ids: list[int], parent: int | None = None,
                          chain_mark: bool | None = None) -> None:
        """Full, held blocks as cached content in no index (``UNREACHABLE``), marked as
        :meth:`cache_blocks` would (never a chain's first two: ``num_always_registered``)."""
        set_all(self.block_hashes, block_ids, UNREACHABLE)
        set_all(self.reused, block_ids,
                self.chain_mark(parent) if chain_mark is None else chain_mark)

    def chain_mark(self, parent: int | None) -> bool:
        """Whether blocks cached after held block ``parent`` (None: a chain's start) belong to
        a *reused chain*: ``parent`` is reused itself, or was hit and is not a chain's first
        block (the request continued an earlier prompt, not just a shared first block)."""
        return parent is not None and bool(self.reused[parent] or (
            self.was_hit[parent] and self._depth[parent] != 0))

    def reset_prefix_cache(self) -> bool:
        if not self.can_reset():
            return False
        self._free = OrderedDict.fromkeys(self.free_queue())
        for lane in self._lanes.values():
            lane.clear()
        self._deferred.clear()
        self._first_children.clear()
        self._depth = bytearray([2]) * self.num_blocks
        self.index.clear()
        self.block_hashes = [None] * self.num_blocks
        self.num_cached_free_blocks = 0
        return True

    # --- releasing -----------------------------------------------------------------------

    def _queue_released(self, block_ids: list[int], clock: int) -> None:
        """Queue blocks just released at clocks ``clock, clock + 1, ...``."""
        self._queue(block_ids, range(clock, clock + len(block_ids)))

    def _queue(self, block_ids: list[int], clocks: Sequence[int]) -> None:
        """Append released blocks (released at ``clocks``, increasing) to their lanes."""
        if self.priorities_seen:
            self._queue_by_offset(block_ids, clocks)
            return
        self._append(self._plain, self._credited, block_ids, clocks)

    def _append(self, plain: Lane, credited: Lane, block_ids: list[int],
                clocks: Sequence[int]) -> None:
        """Append blocks (released at ``clocks``, increasing) to lane ``credited`` if they
        belong to a reused chain, else to lane ``plain``."""
        marks = () if credited is plain else gather(self.reused, block_ids)
        if not any(marks):
            plain.extend(block_ids, clocks)
        elif all(marks):
            credited.extend(block_ids, clocks)
        else:       # typically a continued chain: credited after its first block
            credited.extend(list(compress(block_ids, marks)), list(compress(clocks, marks)))
            rest = [not m for m in marks]
            plain.extend(list(compress(block_ids, rest)), list(compress(clocks, rest)))

    def _queue_by_offset(self, block_ids: list[int], clocks: Sequence[int]) -> None:
        """:meth:`_queue` with priorities: ``offset = credit * reused - weight * priority``
        (the policy's ``priority_weight``; a priority beyond its ``priority_limit`` counts as
        the limit)."""
        reused, prio, credit = self.reused, self.prio, self.credit
        weight, limit = self._priority_weight, self._priority_limit
        by_offset: dict[int, tuple[list[int], list[int]]] = {}
        for block_id, clock in zip(block_ids, clocks):
            p = prio[block_id]
            if limit is not None:
                p = min(max(p, -limit), limit)
            offset = (credit if reused[block_id] else 0) - weight * p
            if offset not in by_offset:
                by_offset[offset] = ([], [])
            ids, lane_clocks = by_offset[offset]
            ids.append(block_id)
            lane_clocks.append(clock)
        for offset, (ids, lane_clocks) in by_offset.items():
            lane = self._lanes.get(offset)
            if lane is None:
                lane = self._lanes[offset] = Lane()
                self._two_lanes = False
            lane.extend(ids, lane_clocks)

    def _unqueue(self, block_id: int) -> None:
        """A free cached block is taken: out of its lane."""
        for lane in self._lanes.values():
            if lane.pop(block_id, None) is not None:
                return
        del self._deferred[block_id]

    # --- the chain rule of first blocks --------------------------------------------------

    def _count_first_children(self, block_ids, parent) -> None:
        """Mark a chain's first block and its child (``_depth``) and count the child under the
        first block's hash; a deferred copy of that content may go now that it has another.
        ``block_ids`` start a chain (``parent`` None) or continue one from its first block."""
        hashes, depth, counts = self.block_hashes, self._depth, self._first_children
        if parent is None:
            first = block_ids[0]
            depth[first] = 0
            found = self.index._map[hashes[first]]
            if found.__class__ is not int:
                for copy in found:
                    self._wake(copy)
            if len(block_ids) < 2:
                return
            child = block_ids[1]
        else:                   # the chain goes on from a first block
            child = block_ids[0]
        depth[child] = 1
        first_hash = self.first_hashes[child] = hashes[first if parent is None else parent]
        counts[first_hash] = counts.get(first_hash, 0) + 1

    def _defers(self, block_id: int, offset, value: int) -> bool:
        """Whether first block ``block_id`` (just taken from lane ``offset`` at clock ``value``;
        None and its heap entry for a protected block) must wait: its content has cached
        children and no other copy."""
        block_hash = self.block_hashes[block_id]
        if self._first_children.get(block_hash) and \
                self.index._map[block_hash].__class__ is int:
            self._deferred[block_id] = (offset, value)
            return True
        return False

    def _child_gone(self, first_hash: int) -> int | None:
        """A cached child of ``first_hash`` was evicted. Returns its deferred first block if
        that was the last child and the block sits in a lane: it has the smallest key now
        (deferred at the head of its lane, older than every block queued since), so it is the
        next victim; a protected one goes back to the heap."""
        counts = self._first_children
        left = counts[first_hash] - 1
        if left:
            counts[first_hash] = left
            return None
        del counts[first_hash]
        found = self.index._map.get(first_hash)
        if found.__class__ is not int or found not in self._deferred:
            return None
        if self._deferred[found][0] is not None:
            return found
        self._wake(found)
        return None

    def _wake(self, block_id: int) -> None:
        """Queue deferred ``block_id`` again (its children are gone, or it has a copy)."""
        if block_id in self._deferred:
            self._requeue(block_id, *self._deferred.pop(block_id))

    def _requeue(self, block_id: int, offset: int, clock: int) -> None:
        """Put a woken block back in its lane's front part (older than every block queued
        since it was deferred; other woken ones stay first where they are older)."""
        lane, older = self._lanes[offset], []
        while (head := lane.head()) is not None and head[1] < clock:
            older.append(lane.popleft())
        lane.appendleft(block_id, clock)
        for item in reversed(older):
            lane.appendleft(*item)
