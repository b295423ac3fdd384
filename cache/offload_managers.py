"""The host tier's managers built on vLLM's LRU one, and the factory that picks them.

Ports of ``vllm/v1/kv_offload/``'s :class:`ARCOffloadingManager` (``arc_manager.py``) and the
reuse gate :class:`FilterReusedOffloadingManager` (``reuse_manager.py``), with
:func:`make_offloading_manager` as ``CPUOffloadingSpec.get_manager``. The bookkeeping they
share (host ids, readiness, stores and loads) is
:class:`~kvsim.cache.cpu_offload.LRUOffloadingManager`'s.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import compress
from typing import Iterable, Sequence

import numpy as np

from kvsim.cache.cpu_offload import LRUOffloadingManager, StoreResult
from kvsim.cache.free_queue import FreeQueue

#: The host tier's eviction choices, as vLLM's ``eviction_policy`` names them.
OFFLOAD_POLICIES = ("lru", "arc")

_NO_IDS = np.zeros(0, dtype=np.int64)


class ARCOffloadingManager(LRUOffloadingManager):
    """vLLM's ARC manager: T1 (seen once) and T2 (touched again) with ghost lists B1/B2
    steering the target size of T1. T1 and T2 are recency queues of host ids, as the LRU
    manager's single one; ``t1`` and ``t2`` list their hashes, oldest first."""

    policy = "arc"

    def __init__(self, num_blocks: int):
        super().__init__(num_blocks)
        self.target_t1_size = 0
        self._t1 = FreeQueue(num_blocks, filled=False)
        self._t2 = FreeQueue(num_blocks, filled=False)
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    @property
    def t1(self) -> list[int]:
        return self._hash_of[self._t1.ids()].tolist()

    @property
    def t2(self) -> list[int]:
        return self._hash_of[self._t2.ids()].tolist()

    @property
    def blocks(self) -> list[int]:
        return self.t1 + self.t2

    def touch_chain(self, key, n: int, hashes_at, stored=None) -> None:
        """A plain :meth:`touch`: the hashes not held count too (ghost hits)."""
        self.touch(hashes_at(range(n)))

    def touch(self, block_hashes: Sequence[int]) -> None:
        """Hashes (distinct) taken last to first, as vLLM does: a ready T1 block and a T2
        block go to T2's tail, a T1 block still being stored to T1's tail; a ghost hit moves
        the target. Done as array operations per queue, in the same order."""
        ids = self._ids(reversed(block_hashes))
        held = ids >= 0
        for block_hash in compress(reversed(block_hashes), (~held).tolist()):
            self._ghost_hit(block_hash)
        ids = ids[held]
        if not len(ids):
            return
        in_t1 = self._t1.queued(ids)
        storing = in_t1 & (self._ref[ids] < 0)      # just stored: not really seen twice
        self._t1.remove(ids[in_t1])
        self._t1.extend(ids[storing])
        self._t2.remove(ids[~in_t1])
        self._t2.extend(ids[~storing])

    def _ghost_hit(self, block_hash: int) -> None:
        b1, b2 = self.b1, self.b2
        if block_hash in b1:
            delta = max(1, len(b2) // len(b1))
            self.target_t1_size = min(self.target_t1_size + delta, self.num_blocks)
        elif block_hash in b2:
            delta = max(1, len(b1) // len(b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0)

    def prepare_store(self, block_hashes: Sequence[int]) -> StoreResult | None:
        result = super().prepare_store(block_hashes)
        if result is not None and result.evicted:
            for ghosts in (self.b1, self.b2):
                while len(ghosts) > self.num_blocks:
                    ghosts.popitem(last=False)
        return result

    def _victims(self, n: int) -> np.ndarray | None:
        """ARC's choice, simulated without changing anything (the store may still fail):
        T1's oldest evictable blocks while T1 holds at least its target (one fewer after
        each), then T2's."""
        if n <= 0:
            return _NO_IDS
        ref = self._ref
        evictable = lambda ids: ref[ids] == 0      # noqa: E731
        from_t1 = min(n, len(self._t1) - self.target_t1_size + 1)
        first = (self._t1.first(from_t1, evictable, partial=True) if from_t1 > 0
                 else _NO_IDS)
        rest = self._t2.first(n - len(first), evictable)
        return None if rest is None else np.concatenate((first, rest))

    def _remember(self, hashes: list[int], ids: np.ndarray) -> None:
        self._t1.extend(ids)
        b1, b2 = self.b1, self.b2
        for block_hash in hashes:
            b1.pop(block_hash, None)
            b2.pop(block_hash, None)

    def _forget(self, ids: np.ndarray, hashes: list[int], evicted: bool) -> None:
        in_t1 = self._t1.queued(ids)
        self._t1.remove(ids[in_t1])
        self._t2.remove(ids[~in_t1])
        if evicted:
            for block_hash, was_t1 in zip(hashes, in_t1.tolist()):
                (self.b1 if was_t1 else self.b2)[block_hash] = None


class FilterReusedOffloadingManager:
    """vLLM's reuse gate: a block is stored only once lookups have seen its hash
    ``store_threshold`` times (counts kept for the ``max_tracker_size`` most recent hashes)."""

    def __init__(self, backing: LRUOffloadingManager, store_threshold: int = 2,
                 max_tracker_size: int = 64_000):
        if max_tracker_size < 1:
            raise ValueError(f"max_tracker_size must be >= 1, got {max_tracker_size}")
        self.backing = backing
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.counts: OrderedDict[int, int] = OrderedDict()

    def __getattr__(self, name):
        return getattr(self.backing, name)

    def count(self, block_hashes: Iterable[int]) -> None:
        """Record one lookup of each hash (vLLM counts inside ``lookup``)."""
        counts = self.counts
        for block_hash in block_hashes:
            if block_hash in counts:
                counts.move_to_end(block_hash)
                counts[block_hash] += 1
            else:
                if len(counts) >= self.max_tracker_size:
                    counts.popitem(last=False)
                counts[block_hash] = 1

    def prepare_store(self, block_hashes: Sequence[int]) -> StoreResult | None:
        counts, threshold = self.counts, self.store_threshold
        return self.backing.prepare_store(
            [h for h in block_hashes if counts.get(h, 0) >= threshold])


def make_offloading_manager(num_blocks: int, policy: str = "lru", store_threshold: int = 0):
    """The manager vLLM's ``CPUOffloadingSpec.get_manager`` builds: ``policy`` (lru or arc),
    behind the reuse gate when ``store_threshold >= 2``."""
    if policy not in OFFLOAD_POLICIES:
        raise ValueError(f"offloading eviction policy must be one of {OFFLOAD_POLICIES}, "
                         f"got {policy!r}")
    manager = (ARCOffloadingManager if policy == "arc" else LRUOffloadingManager)(num_blocks)
    if store_threshold >= 2:
        return FilterReusedOffloadingManager(manager, store_threshold)
    return manager
