"""``lookahead``: an online eviction policy for multi-turn traffic (see docs/eviction.md).

It uses only what a server knows when it evicts:

1. **the waiting queue** - requests that arrived but are not admitted yet have known prompts, so
   their prefix lookups are known. A free cached block that a queued request's lookup would
   hit (its cached prefix, which grows while it waits as the blocks after it are cached) is
   *protected*: evicted only when no unprotected block is left (AttentionStore/CachedAttention's
   idea of scheduler-aware eviction). With chained block hashes that is every cached block
   whose hash the request will look up. A server admits from the head of its queue, so only
   the first ``window`` queued requests are tracked (``kvsim run``: ``--max-num-seqs``, the
   most one step could admit); the others, hours away on an overloaded server, cost nothing
   until they move up;
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

from collections import Counter
from typing import Callable, Sequence

from kvsim.cache.policies import KEY_PART_BITS, CachePolicy
from kvsim.cache.scored_pool import ScoredBlockPool


class LookaheadPolicy(CachePolicy):
    """Key ``(protected, release clock + credit, 0 if credited else 1)``, smallest evicted
    first.

    ``credit`` is the pool size for a block of a reused chain (see the module docstring), 0
    otherwise; ``protected`` is 1 while a queued request's lookup reaches the block's hash
    (``wanted``: each queued request counts the hashes its lookup reaches, so queueing and
    admitting it cost what it hits, not its whole prompt). Release clocks are unique, so two
    blocks tie on ``clock + credit`` only when one of them was credited: it was released
    earlier, and the last part orders it first, as a tie-break on the release clock would
    (a one-bit part keeps the packed entry small: the release path computes one per block).
    """

    name = "lookahead"
    pool_class = "lookahead"
    key_part_bits = (KEY_PART_BITS, 1)

    def __init__(self, window: int | None = None) -> None:
        self.window = window                 # queued requests tracked at most (None: all)
        self.wanted: Counter = Counter()    # hash -> queued requests whose lookup reaches it
        self._waiters: dict = {}             # tracked queued request -> its _Waiter
        self._backlog: dict = {}             # queued behind the window -> its lookup
        self._blocked: dict[int, dict] = {}  # hash -> waiters whose lookup stops just before it
        self.pool = None

    @property
    def queued(self) -> list:
        """The queued requests: the tracked ones, then the others, each in queue order."""
        return [*self._waiters, *self._backlog]

    def key(self, pool, block_id, block_hash, clock):
        credit = pool.num_blocks if pool.reused[block_id] else 0
        return (1 if block_hash in self.wanted else 0, clock + credit, 0 if credit else 1)

    def entries(self, pool, block_ids, clock, id_bits):
        reused, n, shift = pool.reused, pool.num_blocks, id_bits + 1
        unflagged = 1 << id_bits
        packed = [((c + n) << shift if reused[b] else (c << shift) + unflagged) + b
                  for c, b in enumerate(block_ids, clock)]
        if self.wanted:
            self._protect_wanted(pool, block_ids, packed, id_bits)
        return packed

    def _protect_wanted(self, pool, block_ids, packed, id_bits) -> None:
        """Add ``protected = 1`` to the entries of the blocks whose hash is wanted.

        ``wanted`` is closed under chain parents (a lookup reaches a prefix), so the child of an
        unwanted block is unwanted: read backwards (a release lists a chain tail first), only
        the wanted blocks and the first one after them are looked up in ``wanted``, a large
        dict (this runs for every released block)."""
        hashes, parents, wanted = pool.block_hashes, pool.parent_hashes, self.wanted
        unit, above, above_wanted = self.protected_unit(id_bits), None, True
        for i in range(len(block_ids) - 1, -1, -1):
            block_hash = hashes[block_ids[i]]
            if above_wanted or parents[block_ids[i]] is not above:
                above_wanted = block_hash in wanted
                if above_wanted:
                    packed[i] += unit
            above = block_hash

    def protected_unit(self, id_bits: int) -> int:
        """The packed entry's ``protected = 1`` (the first key part, above the others)."""
        return 1 << (sum(self.key_part_bits) + id_bits)

    def enqueue(self, key, lookup: Sequence[int] | Callable[[], Sequence[int]],
                front: bool = False) -> None:
        """Request ``key`` joined the waiting queue (at its head if ``front``: a preempted
        request); its lookup will cover the hashes ``lookup`` gives (or, if callable, returns
        when the request enters the window). Inside the window its cached prefix is protected
        at once (free blocks re-keyed), the rest as it gets cached (:meth:`reached`)."""
        if key in self._waiters or key in self._backlog:
            raise ValueError(f"request {key!r} is queued already")
        if front or self.window is None or len(self._waiters) < self.window:
            self._track(key, lookup)
        else:
            self._backlog[key] = lookup

    def dequeue(self, key) -> None:
        """Request ``key`` left the waiting queue (admitted): end its protection; the next
        queued request enters the window."""
        if self._backlog.pop(key, None) is None:
            self._untrack(key)
        backlog = self._backlog
        while backlog and len(self._waiters) < self.window:
            first = next(iter(backlog))
            self._track(first, backlog.pop(first))

    def _track(self, key, lookup) -> None:
        hashes = lookup() if callable(lookup) else lookup
        if hashes.__class__ is not list:
            hashes = list(hashes)
        waiter = self._waiters[key] = _Waiter(hashes)
        if self.pool is None:        # no index to stop at: every hash counts
            self._reach(waiter, len(hashes))
            return
        found = self.pool.index.find_prefix(hashes)
        self._reach(waiter, len(found))
        self.pool.protect(found)

    def _untrack(self, key) -> None:
        waiter = self._waiters.pop(key)
        wanted, hashes, reach = self.wanted, waiter.hashes, waiter.reach
        drop = wanted.pop       # dict's (Counter's ``del`` is written in Python)
        for block_hash in hashes[:reach]:
            left = wanted[block_hash] - 1
            if left:
                wanted[block_hash] = left
            else:
                drop(block_hash)
        if reach < len(hashes):
            blocked = self._blocked[hashes[reach]]
            del blocked[waiter]
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
        hashes = waiter.hashes
        self.wanted.update(hashes[waiter.reach:end])     # a Counter: +1 each, in C
        waiter.reach = end
        if end < len(hashes):
            self._blocked.setdefault(hashes[end], {})[waiter] = None


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
        reused = parent is not None and (self.reused[parent] or (
            self.hits[parent] > 0 and self.parent_hashes[parent] is not None))
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
        refs, entries = self.ref_counts, self._entry     # the blocks are cached
        unit = self.policy.protected_unit(self._id_bits)
        changed = [b for b in block_ids if not refs[b] and entries[b] < unit]
        for block_id in changed:
            entries[block_id] += unit
        self._push_all(changed)
