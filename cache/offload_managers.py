"""The host tier's ARC policy and the factory that picks a manager.

A port of vLLM 0.32's ARC cache policy (``vllm/v1/kv_offload/cpu/policies/arc.py``) over the
bookkeeping of :class:`~kvsim.cache.cpu_offload.LRUOffloadingManager` (host ids, readiness,
stores and loads, the reuse gate), with :func:`make_offloading_manager` as
``CPUOffloadingSpec.get_manager``.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from kvsim.cache.cpu_offload import LRUOffloadingManager
from kvsim.cache.offload_records import RequestAccess

#: The host tier's eviction choices, as vLLM's ``eviction_policy`` names them.
OFFLOAD_POLICIES = ("lru", "arc")


class ARCOffloadingManager(LRUOffloadingManager):
    """vLLM's ARC policy: T1 (stored, not reused yet) and T2 (reused by a request) with ghost
    lists B1/B2 of their evicted hashes steering the target size of T1. A request's reuse
    (a hash it offered when held and ready, or loaded) counts when it finishes; a store that
    misses a ghost moves the target at once. ``t1``, ``t2``, ``b1``, ``b2``: hashes, oldest
    first."""

    policy = "arc"
    _weighs_reuse = True

    def __init__(self, num_blocks: int, store_threshold: int = 0,
                 max_tracker_size: int = 64_000):
        super().__init__(num_blocks, store_threshold, max_tracker_size)
        self.target_t1_size = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    @property
    def blocks(self) -> list[int]:
        return [*self.t1, *self.t2]

    def _insert(self, hashes: list[int], ids: np.ndarray) -> None:
        t1, b1, b2 = self.t1, self.b1, self.b2
        for block_hash in hashes:
            t1[block_hash] = None
            b1.pop(block_hash, None)
            b2.pop(block_hash, None)

    def _victims(self, n: int, offered: np.ndarray) -> np.ndarray | None:
        """ARC's choice, without changing anything: from T1 while it holds at least its
        target (counting those already chosen), else from T2, else from T1 again; each the
        oldest with ``ref_cnt`` 0 not offered."""
        skip = set(offered.tolist())
        from_t1, from_t2 = self._evictable(self.t1, skip), self._evictable(self.t2, skip)
        chosen, t1_size, target = [], len(self.t1), int(self.target_t1_size)
        for _ in range(n):
            victim = next(from_t1, None) if t1_size >= target else None
            if victim is not None:
                t1_size -= 1
            elif (victim := next(from_t2, None)) is None:
                if (victim := next(from_t1, None)) is None:
                    return None
                t1_size -= 1
            chosen.append(victim)
        return np.array(chosen, dtype=np.int64)

    def _evictable(self, queue: OrderedDict, skip: set):
        """The host blocks of ``queue`` with ``ref_cnt`` 0 not in ``skip``, oldest first."""
        id_of, ref = self._id_of, self._ref
        for block_hash in queue:
            block_id = id_of[block_hash]
            if ref[block_id] == 0 and block_id not in skip:
                yield block_id

    def _forget(self, ids: np.ndarray, hashes: list[int], evicted: bool) -> None:
        t1, t2 = self.t1, self.t2
        for block_hash in hashes:
            if block_hash in t1:
                del t1[block_hash]
                if evicted:
                    self.b1[block_hash] = None
            else:
                del t2[block_hash]
                if evicted:
                    self.b2[block_hash] = None
        if evicted:
            for ghosts in (self.b1, self.b2):
                for _ in range(len(ghosts) - self.num_blocks):
                    ghosts.popitem(last=False)

    def _store_miss(self, hashes: list[int]) -> None:
        """A hash found in a ghost list moves the target: B1 (evicted while seen once)
        grows T1, B2 shrinks it."""
        b1, b2 = self.b1, self.b2
        for block_hash in reversed(hashes):
            if block_hash in b1:
                delta = max(1, len(b2) / len(b1))
                self.target_t1_size = min(self.target_t1_size + delta, self.num_blocks)
                b1.move_to_end(block_hash)
            elif block_hash in b2:
                delta = max(1, len(b1) / len(b2))
                self.target_t1_size = max(self.target_t1_size - delta, 0)
                b2.move_to_end(block_hash)

    def _touch_finished(self, access: RequestAccess) -> None:
        """Last block first: a hash the request only inserted goes to its queue's tail; one
        it reused moves from T1 to T2's tail, or to T2's tail."""
        t1, t2, reused = self.t1, self.t2, access.reused
        inserted_only = access.inserted - reused
        hashes, _ = access.head_to_tail()
        for block_hash in reversed(hashes.tolist()):
            if block_hash in inserted_only:
                if block_hash in t1:
                    t1.move_to_end(block_hash)
                elif block_hash in t2:
                    t2.move_to_end(block_hash)
            elif block_hash in reused:
                if block_hash in t1:
                    del t1[block_hash]
                    t2[block_hash] = None
                elif block_hash in t2:
                    t2.move_to_end(block_hash)


def make_offloading_manager(num_blocks: int, policy: str = "lru", store_threshold: int = 0):
    """The manager vLLM's ``CPUOffloadingSpec.get_manager`` builds: ``policy`` (lru or arc),
    storing a block only once it was offered ``store_threshold`` times when that is >= 2."""
    if policy not in OFFLOAD_POLICIES:
        raise ValueError(f"offloading eviction policy must be one of {OFFLOAD_POLICIES}, "
                         f"got {policy!r}")
    manager = ARCOffloadingManager if policy == "arc" else LRUOffloadingManager
    return manager(num_blocks, store_threshold)
