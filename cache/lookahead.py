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

Among unprotected blocks of the same class the order is LRU, so the policy runs on FIFO lanes
(:class:`~kvsim.cache.lookahead_pool.LookaheadPool`). Without a queue (a driver that never
calls :meth:`LookaheadPolicy.enqueue`) only the second part acts.
"""

from __future__ import annotations

from itertools import islice, takewhile
from typing import Callable, Sequence

from kvsim.cache.intmap import count_down, count_up, hash_map
from kvsim.cache.policies import KEY_PART_BITS, CachePolicy


class LookaheadPolicy(CachePolicy):
    """Key ``(protected, release clock + credit, 0 if credited else 1)``, smallest evicted
    first.

    ``credit`` is the pool size for a block of a reused chain (see the module docstring), 0
    otherwise; ``protected`` is 1 while a queued request's lookup reaches the block's hash
    (``wanted``: each queued request counts the hashes its lookup reaches, so queueing and
    admitting it cost what it hits, not its whole prompt). Release clocks are unique, so two
    blocks tie on ``clock + credit`` only when one of them was credited: it was released
    earlier, and the last part orders it first, as a tie-break on the release clock would
    (a one-bit part keeps the packed entry small).
    """

    name = "lookahead"
    pool_class = "lookahead"      # :class:`~kvsim.cache.lookahead_pool.LookaheadPool`
    key_part_bits = (KEY_PART_BITS, 1)

    @staticmethod
    def lane_credit(num_blocks: int) -> int:
        """The offset of a credited block (its lane in a :class:`LanePool`): the pool size."""
        return num_blocks

    @staticmethod
    def lane_key(clock: int, offset: int) -> tuple:
        """The key of an unprotected block released at ``clock`` into the lane at ``offset``."""
        return (0, clock + offset, 0 if offset else 1)

    def __init__(self, window: int | None = None) -> None:
        self.window = window                 # queued requests tracked at most (None: all)
        self.wanted = WantedHashes()         # hashes queued lookups reach, with multiplicity
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
        hashes, reach = waiter.hashes, waiter.reach
        self.wanted.remove(hashes[:reach])
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
        cached = self.pool.index._map.__contains__
        for block_hash in blocked.keys() & block_hashes:     # any order: each goes as far
            for waiter in blocked.pop(block_hash):           # as the index holds its hashes
                hashes, end = waiter.hashes, waiter.reach + 1    # its next hash is cached
                end += len(list(takewhile(cached, islice(hashes, end, None))))
                self._reach(waiter, end)

    def _reach(self, waiter: "_Waiter", end: int) -> None:
        """Count ``waiter``'s hashes up to ``end`` as wanted; it waits on the next one."""
        hashes = waiter.hashes
        self.wanted.add(hashes[waiter.reach:end])
        waiter.reach = end
        if end < len(hashes):
            self._blocked.setdefault(hashes[end], {})[waiter] = None


class WantedHashes:
    """The hashes the tracked lookups reach, each counted once per lookup (a multiset):
    ``counts`` maps each to how many lookups reach it (a :func:`~kvsim.cache.intmap.hash_map`,
    counted up and down a lookup at a time in one C loop where it is compiled)."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts = hash_map()

    def __contains__(self, block_hash) -> bool:
        return block_hash in self.counts

    def __bool__(self) -> bool:
        return bool(len(self.counts))

    def __len__(self) -> int:
        return len(self.counts)

    def add(self, hashes: list[int]) -> None:
        """Count one more lookup reaching each of ``hashes`` (distinct)."""
        count_up(self.counts, hashes)

    def remove(self, hashes: list[int]) -> None:
        """Count one lookup fewer reaching each of ``hashes`` (distinct, each counted)."""
        count_down(self.counts, hashes)


class _Waiter:
    """A queued request's lookup: ``hashes[:reach]`` would hit now (or did while it waited)."""

    __slots__ = ("hashes", "reach")

    def __init__(self, hashes: list[int]):
        self.hashes, self.reach = hashes, 0
