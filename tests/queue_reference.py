"""The queue policies as they were before the batched hooks (one Python call per block): the
reference that tests/test_queue_policies.py replays the batched code against.

Kept verbatim from ``cache/queue_pool.py`` at 8f6c821 (only the class names gained ``Ref``):
any difference in a victim, a queue order or a count is a change of behaviour.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

from kvsim.cache.policy_pool import PolicyPool


class RefQueuePolicy:
    """Hooks a :class:`QueuePool` calls; see the module docstring."""

    name = "queue"
    is_lru = False
    pool_class = "queue"

    def attach(self, pool: "RefQueuePool") -> None:
        self.pool = pool

    def begin(self, request_id) -> None:
        """Blocks are about to be taken or touched for ``request_id``."""

    def fill(self, block_id: int, block_hash: int) -> None:
        raise NotImplementedError

    def hit(self, block_id: int) -> None:
        raise NotImplementedError

    def release(self, block_id: int) -> None:
        raise NotImplementedError

    def acquire(self, block_id: int) -> None:
        raise NotImplementedError

    def victim(self) -> int:
        raise NotImplementedError

    def order(self) -> list[int]:
        """Free cached blocks, roughly in the order they would be evicted."""
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RefARCPolicy(RefQueuePolicy):
    """Adaptive Replacement Cache (Megiddo & Modha, FAST'03), as vLLM's
    ``ARCOffloadingManager`` applies it to KV blocks.

    - ``T1``: cached blocks used by one request since they were filled; ``T2``: blocks hit
      again since (a hit in ``T1`` promotes to ``T2``). ``num_t1``/``num_t2`` count held and
      free blocks; only free ones (kept in release order, oldest first) can be evicted;
    - ``B1``/``B2``: ghost lists, hashes evicted from ``T1``/``T2``, each at most the pool size;
    - ``target_t1`` (ARC's ``p``): a block filled with a hash found in ``B1`` means ``T1`` was
      too small, ``p`` grows by ``max(1, |B2| / |B1|)``; one found in ``B2`` shrinks it by
      ``max(1, |B1| / |B2|)``; such a block enters ``T2``, others ``T1``;
    - eviction takes the oldest free block of ``T1`` while ``T1`` holds more than ``p``
      blocks (or ``T2`` has no free block), else the oldest free block of ``T2``.
    """

    name = "arc"

    def attach(self, pool) -> None:
        super().attach(pool)
        self.capacity = pool.num_blocks
        self.reset()

    def reset(self) -> None:
        self.t1: OrderedDict[int, None] = OrderedDict()      # free T1 blocks, oldest first
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()      # ghost hashes, oldest first
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.in_t2 = [False] * self.capacity
        self.num_t1 = self.num_t2 = 0
        self.target_t1 = 0

    def fill(self, block_id, block_hash):
        b1, b2 = self.b1, self.b2
        if block_hash in b1:
            self.target_t1 = min(self.capacity, self.target_t1 + max(1, len(b2) // len(b1)))
            del b1[block_hash]
        elif block_hash in b2:
            self.target_t1 = max(0, self.target_t1 - max(1, len(b1) // len(b2)))
            del b2[block_hash]
        else:
            self.in_t2[block_id] = False
            self.num_t1 += 1
            return
        self.in_t2[block_id] = True
        self.num_t2 += 1

    def hit(self, block_id):
        if not self.in_t2[block_id]:
            self.in_t2[block_id] = True
            self.num_t1 -= 1
            self.num_t2 += 1

    def release(self, block_id):
        (self.t2 if self.in_t2[block_id] else self.t1)[block_id] = None

    def acquire(self, block_id):
        del (self.t2 if self.in_t2[block_id] else self.t1)[block_id]

    def evicts_t1(self) -> bool:
        """Whether the next victim comes from ``T1``."""
        return bool(self.t1) and (self.num_t1 > self.target_t1 or not self.t2)

    def victim(self):
        from_t1 = self.evicts_t1()
        queue, ghost = (self.t1, self.b1) if from_t1 else (self.t2, self.b2)
        block_id = queue.popitem(last=False)[0]
        if from_t1:
            self.num_t1 -= 1
        else:
            self.num_t2 -= 1
        ghost[self.pool.block_hashes[block_id]] = None
        if len(ghost) > self.capacity:
            ghost.popitem(last=False)
        return block_id

    def order(self):
        first, second = (self.t1, self.t2) if self.evicts_t1() else (self.t2, self.t1)
        return list(first) + list(second)


class RefS3FIFOPolicy(RefQueuePolicy):
    """S3-FIFO (Yang et al., SOSP'23): a small FIFO ``S`` (10 % of the pool) for probation, a
    main FIFO ``M`` and a ghost FIFO ``G`` of hashes evicted from ``S``.

    - a filled block enters ``M`` when its hash is in ``G`` (it came back soon), else ``S``;
    - every hit raises the block's frequency, capped at 3;
    - eviction, while ``S`` holds at least its share: ``S``'s oldest block moves to ``M`` if it
      was hit since it entered (``freq >= 1``) or a request still holds it (in use is in use:
      re-queueing it in ``S`` would make every eviction rescan the held blocks), else it is
      evicted and its hash goes to ``G``;
      otherwise ``M``'s oldest block is evicted if its frequency is 0, else it is re-queued with
      the frequency lowered by one (CLOCK-like second chances);
    - queues keep held blocks too (fill order is the FIFO order); a held block met at ``M``'s
      eviction end is re-queued without a change (it cannot go yet).

    Scan resistance: a burst of one-off prompts passes through ``S`` only, so it cannot push
    the reused blocks in ``M`` out.
    """

    name = "s3fifo"
    max_freq = 3
    small_share = 0.1

    def attach(self, pool) -> None:
        super().attach(pool)
        self.capacity = pool.num_blocks
        self.small_capacity = max(1, int(self.small_share * pool.num_blocks))
        self.reset()

    def reset(self) -> None:
        self.small: OrderedDict[int, None] = OrderedDict()   # oldest first
        self.main: OrderedDict[int, None] = OrderedDict()
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.freq = [0] * self.capacity
        self.in_main = [False] * self.capacity
        self.num_main_free = 0          # free blocks in M: none -> skip its scan (O(1))

    def fill(self, block_id, block_hash):
        self.freq[block_id] = 0
        if block_hash in self.ghost:
            del self.ghost[block_hash]
            self.in_main[block_id] = True
            self.main[block_id] = None
        else:
            self.in_main[block_id] = False
            self.small[block_id] = None

    def hit(self, block_id):
        if self.freq[block_id] < self.max_freq:
            self.freq[block_id] += 1

    def release(self, block_id):
        """Queue order is fill order: nothing moves."""
        if self.in_main[block_id]:
            self.num_main_free += 1

    def acquire(self, block_id):
        """Held blocks stay queued (skipped by eviction)."""
        if self.in_main[block_id]:
            self.num_main_free -= 1

    def victim(self):
        """Small queue first while it holds its share; a queue whose free blocks were all
        promoted or held hands over to the other (at most three scans: the pool only asks
        while a free cached block exists)."""
        if len(self.small) >= self.small_capacity or not self.main:
            block_id = self._from_small()
            if block_id is not None:
                return block_id
        block_id = self._from_main()
        if block_id is None:
            block_id = self._from_small()
        return block_id if block_id is not None else self._from_main()

    def _from_small(self) -> int | None:
        """Scan ``S`` once from its oldest block; None if every block was promoted."""
        small, refs = self.small, self.pool.ref_counts
        for _ in range(len(small)):
            block_id = next(iter(small))
            if refs[block_id] or self.freq[block_id] >= 1:
                del small[block_id]
                self.in_main[block_id] = True
                self.main[block_id] = None
                self.num_main_free += refs[block_id] == 0
            else:
                del small[block_id]
                self._ghost(self.pool.block_hashes[block_id])
                return block_id
        return None

    def _from_main(self) -> int | None:
        """CLOCK over ``M``: the first free block of frequency 0 goes, free ones met on the way
        lose one; None after enough passes to bring any free block to 0 (none was free)."""
        main, refs, freq = self.main, self.pool.ref_counts, self.freq
        if not self.num_main_free:
            return None
        for _ in range((self.max_freq + 1) * len(main)):
            block_id = next(iter(main))
            if refs[block_id] == 0:
                if freq[block_id] == 0:
                    del main[block_id]
                    self.num_main_free -= 1
                    return block_id
                freq[block_id] -= 1
            main.move_to_end(block_id)
        return None

    def _ghost(self, block_hash: int) -> None:
        self.ghost[block_hash] = None
        if len(self.ghost) > self.capacity - self.small_capacity:
            self.ghost.popitem(last=False)

    def order(self):
        refs = self.pool.ref_counts
        return [b for b in (*self.small, *self.main) if refs[b] == 0]


class RefQueuePool(PolicyPool):
    """A :class:`~kvsim.cache.policy_pool.PolicyPool` whose free cached blocks are evicted by a :class:`QueuePolicy`."""

    def __init__(self, num_blocks: int, enable_caching: bool = True, policy=None):
        super().__init__(num_blocks, enable_caching, policy)
        policy.attach(self)

    # --- queries -------------------------------------------------------------------------

    def cached_free_order(self) -> list[int]:
        return self.policy.order()

    # --- actions -------------------------------------------------------------------------

    def begin(self, request_id, priority: int = 0) -> None:
        self.policy.begin(request_id)

    def get_new_blocks(self, n: int) -> list[int]:
        if n > self.num_free_blocks:
            raise ValueError(f"cannot get {n} free blocks: only {self.num_free_blocks} are free")
        popitem, num_unhashed = self._free.popitem, min(n, len(self._free))
        taken = [popitem(last=False)[0] for _ in range(num_unhashed)]
        if n > num_unhashed:
            taken += self._evict_many(n - num_unhashed)
        refs = self.ref_counts
        for block_id in taken:
            refs[block_id] = 1
        return taken

    def touch(self, block_ids: Iterable[int]) -> None:
        refs, hashes, policy = self.ref_counts, self.block_hashes, self.policy
        for block_id in block_ids:
            cached = hashes[block_id] is not None
            if refs[block_id] == 0:
                if cached:
                    policy.acquire(block_id)
                    self.num_cached_free_blocks -= 1
                else:
                    del self._free[block_id]
            refs[block_id] += 1
            if cached:
                policy.hit(block_id)

    def free_blocks(self, ordered_block_ids: Iterable[int]) -> None:
        refs, hashes, first = self.ref_counts, self.block_hashes, []
        for block_id in ordered_block_ids:
            refs[block_id] -= 1
            if refs[block_id] == 0:
                if hashes[block_id] is None:
                    first.append(block_id)
                    continue
                self.policy.release(block_id)
                self.num_cached_free_blocks += 1
        self._prepend(first)

    def cache_blocks(self, block_ids, block_hashes, depth: int = 0, parent=None) -> None:
        for block_id, block_hash in zip(block_ids, block_hashes):
            self.block_hashes[block_id] = block_hash
            self.index.insert(block_hash, block_id)
            self.policy.fill(block_id, block_hash)

    def reset_prefix_cache(self) -> bool:
        if not self.can_reset():
            return False
        self._free = OrderedDict.fromkeys(list(self._free) + self.policy.order())
        self.policy.reset()
        self.index.clear()
        self.block_hashes = [None] * self.num_blocks
        self.num_cached_free_blocks = 0
        return True

    # --- internals -----------------------------------------------------------------------

    def _evict_many(self, n: int) -> list[int]:
        """The policy's next ``n`` victims, uncached (one loop)."""
        victim, hashes, index = self.policy.victim, self.block_hashes, self.index._map
        evicted, victims = self.evicted, []
        for _ in range(n):
            block_id = victim()
            block_hash = hashes[block_id]
            if evicted is not None:
                evicted.append((block_id, block_hash))
            if index[block_hash].__class__ is int:
                del index[block_hash]
            else:
                self.index.remove(block_hash, block_id)
            hashes[block_id] = None
            victims.append(block_id)
        self.num_cached_free_blocks -= n
        self.num_evictions += n
        return victims
