"""ARC as a :class:`~kvsim.cache.queue_pool.QueuePolicy`: recency and frequency lists with an
adaptive target, driven one batch of blocks at a time."""

from __future__ import annotations

import numpy as np

from kvsim.cache.bulk import gather, set_all
from kvsim.cache.free_queue import FreeQueue
from kvsim.cache.ghost import Ghost, ghost_list
from kvsim.cache.queue_pool import QueuePolicy


def _ids(block_ids) -> np.ndarray:
    """Block ids as an index array."""
    return np.fromiter(block_ids, np.int64, len(block_ids))


class ARCPolicy(QueuePolicy):
    """Adaptive Replacement Cache (Megiddo & Modha, FAST'03), as vLLM's
    ``ARCOffloadingManager`` applies it to KV blocks.

    - ``T1``: cached blocks used by one request since they were filled; ``T2``: blocks hit
      again since (a hit in ``T1`` promotes to ``T2``). ``num_t1``/``num_t2`` count held and
      free blocks; only free ones (kept in release order, oldest first, in a
      :class:`~kvsim.cache.free_queue.FreeQueue`: a request's blocks are released, taken
      and evicted a run at a time) can be evicted;
    - ``B1``/``B2``: ghost lists, hashes evicted from ``T1``/``T2``, each at most the pool size;
    - ``target_t1`` (ARC's ``p``): a block filled with a hash found in ``B1`` means ``T1`` was
      too small, ``p`` grows by ``max(1, |B2| / |B1|)``; one found in ``B2`` shrinks it by
      ``max(1, |B1| / |B2|)``; such a block enters ``T2``, others ``T1``;
    - eviction takes the oldest free block of ``T1`` while ``T1`` holds more than ``p``
      blocks (or ``T2`` has no free block), else the oldest free block of ``T2``.

    The hooks take batches; each gives the same state as its blocks one at a time in order.
    """

    name = "arc"
    takes_late_fills = True
    hears_private_fills = True

    def attach(self, pool) -> None:
        super().attach(pool)
        self.capacity = pool.num_blocks
        self.reset()

    def reset(self) -> None:
        self.t1 = FreeQueue(self.capacity, filled=False)     # free T1 blocks, oldest first
        self.t2 = FreeQueue(self.capacity, filled=False)
        self.b1 = ghost_list()                               # ghost hashes, oldest first
        self.b2 = ghost_list()
        self._t2_marks = bytearray(self.capacity)    # whether a block is in T2 (C loops set it)
        self.in_t2 = np.frombuffer(self._t2_marks, dtype=bool)     # (the same bytes)
        self.num_t1 = self.num_t2 = 0
        self.target_t1 = 0

    def fill_many(self, block_ids, block_hashes):
        """The fills between ghost hits join ``T1`` at once; a run of hits in one ghost list
        joins ``T2`` at once, the target moved for each hit in turn (:meth:`_adapt`)."""
        b1, b2 = self.b1, self.b2
        n, start = min(len(block_ids), len(block_hashes)), 0
        next1, next2 = b1.first_present(block_hashes, 0), b2.first_present(block_hashes, 0)
        while True:
            k = min(next1, next2, n)
            if k > start:
                set_all(self._t2_marks, block_ids[start:k], 0)
                self.num_t1 += k - start
            if k == n:
                return
            if k == next1:          # (a hash in both lists counts as in B1)
                start = b1.take_run(block_hashes, k, n)
                self._adapt(start - k, b1, b2, 1)
                next1 = b1.first_present(block_hashes, start)
            else:
                start = b2.take_run(block_hashes, k, next1)
                self._adapt(start - k, b2, b1, -1)
            if next2 < start:
                next2 = b2.first_present(block_hashes, start)
            set_all(self._t2_marks, block_ids[k:start], 1)
            self.num_t2 += start - k

    def fill_private(self, block_ids):
        set_all(self._t2_marks, block_ids, 0)
        self.num_t1 += len(block_ids)

    def _adapt(self, num_hits: int, hit: Ghost, other: Ghost, sign: int) -> None:
        """ARC's target after ``num_hits`` hashes were found in ghost list ``hit`` (and taken
        out of it), one at a time: each moves it by ``max(1, len(other) // len(hit))`` (with
        the hash still in ``hit``), up in B1 (``sign`` 1), down in B2, within ``[0, c]``."""
        target, num_other, capacity = self.target_t1, len(other), self.capacity
        for size in range(len(hit) + num_hits, len(hit), -1):
            target += sign * max(1, num_other // size)
        self.target_t1 = min(capacity, target) if sign > 0 else max(0, target)

    def hit_many(self, block_ids):
        if not block_ids:
            return
        ids = _ids(block_ids)
        promoted = ids[~self.in_t2[ids]]
        if len(promoted):
            self.in_t2[promoted] = True
            num = len(set(promoted.tolist())) if len(promoted) > 1 else 1
            self.num_t1 -= num
            self.num_t2 += num

    def release_many(self, block_ids):
        self._split(_ids(block_ids), self.t1.extend, self.t2.extend)

    def acquire_many(self, block_ids):
        self._split(_ids(block_ids), self.t1.remove, self.t2.remove)

    def _split(self, ids: np.ndarray, ones, twos) -> None:
        """``ones(ids of T1 blocks)``, ``twos(ids of T2 blocks)``, each in the order given."""
        flags = self.in_t2[ids]
        num_t2 = int(np.count_nonzero(flags))
        if num_t2 < len(ids):
            ones(ids if not num_t2 else ids[~flags])
        if num_t2:
            twos(ids if num_t2 == len(ids) else ids[flags])

    def evicts_t1(self) -> bool:
        """Whether the next victim comes from ``T1``."""
        return bool(self.t1) and (self.num_t1 > self.target_t1 or not self.t2)

    def takes_new_fills(self, block_hashes: list, num_new_blocks: int,
                        num_private: int = 0) -> bool:
        """Fills with hashes in no ghost list only add to ``num_t1``: they may be reported
        after the victims taken meanwhile, as long as those are picked with them counted."""
        return self.b1.isdisjoint(block_hashes) and self.b2.isdisjoint(block_hashes)

    def victims(self, n, fills_before=None):
        """Runs from one list at a time: from ``T1`` while it is over target (``num_t1`` drops
        with each) or ``T2`` is empty, from ``T2`` until it empties (nothing else changes).
        ``fills_before[k]``: blocks filled (into ``T1``, see :meth:`takes_new_fills`) before
        the ``k``-th victim and not reported yet: counted in ``num_t1`` for its choice."""
        if fills_before and fills_before[-1]:
            return self._victims_between_fills(n, fills_before)
        out = []
        while len(out) < n:
            left = n - len(out)
            if self.evicts_t1():
                if self.t2:
                    left = min(left, self.num_t1 - self.target_t1)
                run = self._pop(self.t1, self.b1, left)
                self.num_t1 -= len(run)
            else:
                run = self._pop(self.t2, self.b2, left)
                self.num_t2 -= len(run)
            if not run:
                raise ValueError(f"no free cached block left to evict ({len(out)} of {n})")
            out += run
        return out

    def _victims_between_fills(self, n: int, fills_before: list[int]) -> list[int]:
        """:meth:`victims` one choice at a time, ``num_t1`` raised by the fills before each:
        the counts decide the list of each victim, then each list gives its oldest."""
        num_t1, target, free_t1, free_t2 = self.num_t1, self.target_t1, len(self.t1), len(self.t2)
        from_t1, k1 = [], 0
        for k in range(n):
            first = free_t1 > k1 and (num_t1 + fills_before[k] - k1 > target
                                      or free_t2 == k - k1)
            if not first and free_t2 == k - k1:
                raise ValueError(f"no free cached block left to evict ({k} of {n})")
            from_t1.append(first)
            k1 += first
        ones = iter(self._pop(self.t1, self.b1, k1))
        twos = iter(self._pop(self.t2, self.b2, n - k1))
        self.num_t1 -= k1
        self.num_t2 -= n - k1
        return [next(ones) if first else next(twos) for first in from_t1]

    def _pop(self, queue: FreeQueue, ghost: Ghost, n: int) -> list[int]:
        """The oldest ``min(n, len(queue))`` blocks of ``queue``; their hashes go to ``ghost``
        (each insertion trims the ghost to the pool size)."""
        run = queue.popleft(min(n, len(queue))).tolist()
        ghost.add(gather(self.pool.block_hashes, run), self.capacity)
        return run

    def order(self):
        first, second = (self.t1, self.t2) if self.evicts_t1() else (self.t2, self.t1)
        return first.ids().tolist() + second.ids().tolist()
