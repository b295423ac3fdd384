"""The pool of ``lookahead`` (:mod:`kvsim.cache.lookahead`): free cached blocks in FIFO lanes.

Lookahead's key is ``(protected, release clock + credit, 0 if credited else 1)``. Among blocks
released unprotected it grows with the release clock within each credit class, so two FIFO
*lanes* (``OrderedDict`` block -> release clock) hold them, and the victim is the older head,
the credited lane's clocks counting the pool size more: an eviction is a ``popitem``, as in
vLLM's LRU queue, not a heap operation and a packed key per block. Protected blocks go to a
min-heap of packed keys, evicted only when no unprotected block is left.

The chain rule of :class:`~kvsim.cache.scored_pool.ScoredBlockPool` (a block whose content has
a cached child stays while it is its only copy) needs no bookkeeping here except for a chain's
*first* block, which is never credited: it is deferred while its content has cached children
(counted per hash) and taken as soon as the last one goes. Why the keys keep the rule for every
other block is in docs/eviction.md; the tests check victims against the rule by brute force.
"""

from __future__ import annotations

from collections import OrderedDict
from heapq import heappop, heappush
from itertools import compress
from typing import Iterable, Sequence

from kvsim.cache.policies import unpack_key
from kvsim.cache.policy_pool import PolicyPool, chain_is_reused, mark_hit_chain

__all__ = ["LanePool"]


class LanePool(PolicyPool):
    """A :class:`~kvsim.cache.policy_pool.PolicyPool` evicting in lookahead's key order from
    two FIFO lanes (unprotected; uncredited and credited) and a heap (protected), see the
    module docstring. It marks blocks of reused chains (``reused``) and can protect free blocks
    a queued request will look up (:meth:`protect`)."""

    opens_in_bulk = "new_chains"

    def __init__(self, num_blocks: int, enable_caching: bool = True, policy=None):
        super().__init__(num_blocks, enable_caching, policy)
        self.hits = [0] * num_blocks       # prefix hits since the block was filled
        self.reused = [False] * num_blocks  # the block belongs to a reused chain
        self.parent_hashes: list[int | None] = [None] * num_blocks   # hash of its chain parent
        self._plain: OrderedDict[int, int] = OrderedDict()      # block -> release clock
        self._credited: OrderedDict[int, int] = OrderedDict()
        self._heap: list[int] = []          # packed keys of protected free blocks
        self._protected: dict[int, int] = {}    # protected free block -> its live heap entry
        self._deferred: dict[int, tuple] = {}   # first block with cached children -> its key
        self._first_children: dict[int, int] = {}   # first-block hash -> its cached children
        self._depth = bytearray([2]) * num_blocks   # 0: a first block, 1: its child, 2: deeper
        self._id_bits = num_blocks.bit_length()
        self._clock = 0
        policy.pool = self
        self._reached = getattr(policy, "reached", None)   # lookahead reads the queue

    # --- queries -------------------------------------------------------------------------

    def cached_free_blocks(self) -> list[int]:
        """The free cached blocks: uncredited, credited, protected, then deferred ones."""
        return [*self._plain, *self._credited, *self._protected, *self._deferred]

    def cached_free_order(self) -> list[int]:
        """Free cached blocks by eviction key (a first block may still be deferred)."""
        return sorted(self.cached_free_blocks(), key=lambda b: (self.key_of(b), b))

    def key_of(self, block_id: int) -> tuple:
        """The policy key of free cached ``block_id`` (as :meth:`LookaheadPolicy.key`)."""
        if block_id in self._deferred:
            return self._key(*self._deferred[block_id])
        if block_id in self._protected:
            return self._key(None, self._protected[block_id])
        if block_id in self._credited:
            return self._key(self._credited, self._credited[block_id])
        return self._key(self._plain, self._plain[block_id])

    def _key(self, lane, value: int) -> tuple:
        """The key of a block in ``lane`` at release clock ``value`` (None: a protected block,
        ``value`` its heap entry)."""
        if lane is None:
            return unpack_key(value, self._id_bits, self.policy.key_part_bits)
        if lane is self._credited:
            return (0, value + self.num_blocks, 0)
        return (0, value, 1)

    # --- actions -------------------------------------------------------------------------

    def begin(self, request_id, priority: int = 0) -> None:
        self.policy.begin(request_id)

    def get_new_blocks(self, n: int) -> list[int]:
        """Take ``n`` free blocks: unhashed ones first, then the policy's victims."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot get {n} free blocks: only {self.num_free_blocks} are free")
        popitem, num_unhashed = self._free.popitem, min(n, len(self._free))
        taken = [popitem(last=False)[0] for _ in range(num_unhashed)]
        refs, hits = self.ref_counts, self.hits
        for block_id in taken:
            refs[block_id] = 1
            hits[block_id] = 0
        if n > num_unhashed:
            taken += self._evict_many(n - num_unhashed)
        return taken

    def touch(self, block_ids: Iterable[int]) -> None:
        block_ids = list(block_ids)
        refs, hits, hashes = self.ref_counts, self.hits, self.block_hashes
        for block_id in block_ids:
            if refs[block_id] == 0:
                if hashes[block_id] is None:
                    del self._free[block_id]
                else:
                    self.num_cached_free_blocks -= 1
                    self._unqueue(block_id)
            refs[block_id] += 1
            hits[block_id] += 1
        mark_hit_chain(self.reused, block_ids)

    def free_blocks(self, ordered_block_ids: Iterable[int]) -> None:
        refs, hashes, first, released = self.ref_counts, self.block_hashes, [], []
        cached, uncached = released.append, first.append
        for block_id in ordered_block_ids:
            left = refs[block_id] - 1
            refs[block_id] = left
            if not left:
                (cached if hashes[block_id] is not None else uncached)(block_id)
        if released:
            clock = self._clock + 1
            self._clock += len(released)
            self.num_cached_free_blocks += len(released)
            if self.policy.wanted:
                self._queue_with_protection(released, clock)
            else:
                self._queue(released, range(clock, clock + len(released)))
        self._prepend(first)

    def cache_blocks(self, block_ids, block_hashes, depth: int = 0, parent=None) -> None:
        """Register full, held blocks of one chain after block ``parent`` (None at the root);
        they belong to a reused chain when the chain they continue does."""
        reused = chain_is_reused(self, parent)
        hashes, parents, marks, index = (self.block_hashes, self.parent_hashes, self.reused,
                                         self.index._map)
        parent_hash = hashes[parent] if parent is not None else None
        for block_id, block_hash in zip(block_ids, block_hashes):
            hashes[block_id] = block_hash
            parents[block_id] = parent_hash
            marks[block_id] = reused
            if block_hash in index:
                self.index.insert(block_hash, block_id)
            else:
                index[block_hash] = block_id
            parent_hash = block_hash
        if block_ids:
            self._count_first_children(block_ids, parent)
        if self._reached is not None:
            self._reached(block_hashes)

    def _count_first_children(self, block_ids, parent) -> None:
        """Mark a chain's first block and its child (``_depth``) and count the child under the
        first block's hash; a deferred copy of that content may go now that it has another."""
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
        elif self.parent_hashes[parent] is None:
            child = block_ids[0]
        else:
            return
        depth[child] = 1
        first_hash = self.parent_hashes[child]
        counts[first_hash] = counts.get(first_hash, 0) + 1

    def protect(self, block_ids) -> None:
        """Those of ``block_ids`` that are free, cached and not protected yet are now wanted by
        a queued request: they leave their lane for the heap, their clock and credit kept."""
        refs, protected, deferred = self.ref_counts, self._protected, self._deferred
        for block_id in block_ids:
            if refs[block_id] or block_id in protected:
                continue
            if block_id in deferred:
                lane, clock = deferred[block_id]
                if lane is not None:
                    deferred[block_id] = (None, self._protected_entry(block_id, clock))
                continue
            lane = self._credited if self.reused[block_id] else self._plain
            self._push_protected(block_id, lane.pop(block_id))

    def reset_prefix_cache(self) -> bool:
        if not self.can_reset():
            return False
        self._free = OrderedDict.fromkeys(self.free_queue())
        self._plain.clear()
        self._credited.clear()
        self._heap.clear()
        self._protected.clear()
        self._deferred.clear()
        self._first_children.clear()
        self._depth = bytearray([2]) * self.num_blocks
        self.index.clear()
        self.block_hashes = [None] * self.num_blocks
        self.num_cached_free_blocks = 0
        return True

    # --- internals -----------------------------------------------------------------------

    def _queue(self, block_ids: list[int], clocks: Sequence[int]) -> None:
        """Append just released blocks (released at ``clocks``, increasing) to their lanes."""
        reused = self.reused
        credited = [reused[b] for b in block_ids]
        if not any(credited):
            self._plain.update(zip(block_ids, clocks))
        elif all(credited):
            self._credited.update(zip(block_ids, clocks))
        else:       # typically a continued chain: credited after its first block
            self._credited.update(zip(compress(block_ids, credited), compress(clocks, credited)))
            plain = [not c for c in credited]
            self._plain.update(zip(compress(block_ids, plain), compress(clocks, plain)))

    def _queue_with_protection(self, block_ids: list[int], clock: int) -> None:
        """:meth:`_queue`, the blocks whose hash a queued lookup reaches to the heap.

        Those hashes (``wanted``, a large dict) are closed under chain parents (a lookup
        reaches a prefix), so the child of an unwanted block is unwanted. A release lists a
        chain tail first: read backwards, the wanted blocks come first, and once one is not,
        none of the rest is when each is the parent of the one before (compared in one pass,
        the usual case: one request's blocks); else each is looked up (:meth:`_wanted`)."""
        hashes, wanted = self.block_hashes, self.policy.wanted
        last = len(block_ids) - 1
        while last >= 0 and hashes[block_ids[last]] in wanted:
            self._push_protected(block_ids[last], clock + last)
            last -= 1
        if last < 0:
            return
        parents = list(map(self.parent_hashes.__getitem__, block_ids[:last]))
        if parents == list(map(hashes.__getitem__, block_ids[1:last + 1])):
            self._queue(block_ids[:last + 1], range(clock, clock + last + 1))
            return
        flags = self._wanted(block_ids[:last + 1])
        for i in compress(range(last + 1), flags):
            self._push_protected(block_ids[i], clock + i)
        rest = [not f for f in flags]
        self._queue(list(compress(block_ids, rest)), list(compress(range(clock, clock + last + 1),
                                                                    rest)))

    def _wanted(self, block_ids: list[int]) -> list[bool]:
        """Whether each block's hash is wanted, read backwards with the closure under chain
        parents: a block whose parent (the block after it) is unwanted is not looked up."""
        hashes, parents, wanted = self.block_hashes, self.parent_hashes, self.policy.wanted
        flags, above, above_wanted = [False] * len(block_ids), None, True
        for i in range(len(block_ids) - 1, -1, -1):
            block_hash = hashes[block_ids[i]]
            if above_wanted or parents[block_ids[i]] != above:
                above_wanted = flags[i] = block_hash in wanted
            above = block_hash
        return flags

    def _push_protected(self, block_id: int, clock: int) -> None:
        """Queue ``block_id`` released at ``clock`` in the heap under its protected key."""
        entry = self._protected[block_id] = self._protected_entry(block_id, clock)
        heappush(self._heap, entry)

    def _protected_entry(self, block_id: int, clock: int) -> int:
        """``(1, clock + credit, 0 if credited else 1)`` packed with the block id, as
        :func:`~kvsim.cache.policies.heap_entry` packs it."""
        clock_bits, flag_bits = self.policy.key_part_bits
        if self.reused[block_id]:
            key = ((1 << clock_bits) + clock + self.num_blocks) << flag_bits
        else:
            key = (((1 << clock_bits) + clock) << flag_bits) + 1
        return (key << self._id_bits) + block_id

    def _unqueue(self, block_id: int) -> None:
        """A free cached block is taken: out of its lane (a heap entry goes stale)."""
        if self._plain.pop(block_id, None) is None and self._credited.pop(block_id, None) is None:
            if self._protected.pop(block_id, None) is None:
                del self._deferred[block_id]

    def _evict_many(self, n: int) -> list[int]:
        """The next ``n`` victims, uncached and taken: the older of the two lanes' heads (the
        credited lane's clocks counting the pool size more) while either has one, then
        protected blocks from the heap; a first block with cached children is deferred, and
        taken next when the last of them goes."""
        plain, credited, credit = self._plain, self._credited, self.num_blocks
        hashes, index, refs, hits = self.block_hashes, self.index._map, self.ref_counts, self.hits
        depth, evicted = self._depth, self.evicted
        head_plain = plain.popitem(last=False) if plain else None
        head_credited = credited.popitem(last=False) if credited else None
        victims, left, woken = [], n, None
        while left:
            if woken is not None:
                block_id, woken = woken, None
                del self._deferred[block_id]
            elif head_plain is not None and (head_credited is None
                                             or head_plain[1] < head_credited[1] + credit):
                block_id, clock = head_plain
                head_plain = plain.popitem(last=False) if plain else None
                if not depth[block_id] and self._defers(block_id, plain, clock):
                    continue
            elif head_credited is not None:
                block_id, clock = head_credited
                head_credited = credited.popitem(last=False) if credited else None
                if not depth[block_id] and self._defers(block_id, credited, clock):
                    continue
            else:
                block_id = self._next_protected()
            block_hash = hashes[block_id]
            if evicted is not None:
                evicted.append((block_id, block_hash))
            if index[block_hash].__class__ is int:
                del index[block_hash]
            else:
                self.index.remove(block_hash, block_id)
            hashes[block_id] = None
            refs[block_id] = 1
            hits[block_id] = 0
            victims.append(block_id)
            left -= 1
            if depth[block_id] != 2:
                if depth[block_id] == 1:
                    woken = self._child_gone(self.parent_hashes[block_id])
                depth[block_id] = 2
        for lane, head in ((plain, head_plain), (credited, head_credited)):
            if head is not None:        # not taken: back to the front of its lane
                lane[head[0]] = head[1]
                lane.move_to_end(head[0], last=False)
        if woken is not None:
            self._wake(woken)
        self.num_cached_free_blocks -= n
        self.num_evictions += n
        return victims

    def _defers(self, block_id: int, lane, value: int) -> bool:
        """Whether first block ``block_id`` (just taken from ``lane``, at ``value``) must wait:
        its content has cached children and no other copy."""
        block_hash = self.block_hashes[block_id]
        if self._first_children.get(block_hash) and \
                self.index._map[block_hash].__class__ is int:
            self._deferred[block_id] = (lane, value)
            return True
        return False

    def _child_gone(self, first_hash: int) -> int | None:
        """A cached child of ``first_hash`` was evicted. Returns its deferred first block if
        that was the last child and the block is unprotected: it is the smallest eligible key
        now (deferred at the head of its lane, older than every block queued since), so the
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

    def _requeue(self, block_id: int, lane, value: int) -> None:
        """Put a woken block back where its key orders it: the heap, or its lane's front part
        (older than every block queued since it was deferred; other woken ones stay first
        where they are older)."""
        if lane is None:
            self._protected[block_id] = value
            heappush(self._heap, value)
            return
        older = []
        while lane and next(iter(lane.values())) < value:
            older.append(lane.popitem(last=False))
        lane[block_id] = value
        lane.move_to_end(block_id, last=False)
        for item_id, clock in reversed(older):
            lane[item_id] = clock
            lane.move_to_end(item_id, last=False)

    def _next_protected(self) -> int:
        """The smallest live protected entry that is not deferred; with none, the smallest
        deferred first block goes anyway (hashes that are not chained), its children still
        counted by hash."""
        heap, protected, id_mask = self._heap, self._protected, (1 << self._id_bits) - 1
        while heap:
            entry = heappop(heap)
            block_id = entry & id_mask
            if protected.get(block_id) != entry:
                continue
            del protected[block_id]
            if self._depth[block_id] or not self._defers(block_id, None, entry):
                return block_id
        block_id = min(self._deferred, key=lambda b: (self.key_of(b), b))
        del self._deferred[block_id]
        return block_id
