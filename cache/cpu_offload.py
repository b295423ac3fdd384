"""vLLM's CPU offloading managers: which block hashes the host holds, and which it gives up.

Ports of the scheduler-side bookkeeping of vLLM's native KV offloading
(``vllm/v1/kv_offload/``): :class:`LRUOffloadingManager` (``lru_manager.py``),
:class:`ARCOffloadingManager` (``arc_manager.py``) and the reuse gate
:class:`FilterReusedOffloadingManager` (``reuse_manager.py``). A manager knows hashes and host
block ids only; :mod:`kvsim.cache.offloading` decides when to call it and turns its answers into
copies in the step plan.

A stored block is *not ready* (``ref_cnt == -1``) from :meth:`prepare_store` until
:meth:`complete_store`: a lookup stops at it and no eviction takes it. A block being loaded is
pinned (``ref_cnt > 0``) from :meth:`prepare_load` to :meth:`complete_load`. Only blocks with
``ref_cnt == 0`` are evicted, oldest first (LRU), or by ARC's adaptive split.

>>> m = LRUOffloadingManager(2)
>>> m.prepare_store([11, 22]).stored
[(11, 0), (22, 1)]
>>> m.lookup([11, 22])          # not ready until the store completes
0
>>> m.complete_store([11, 22]); m.lookup([11, 22, 33])
2
>>> m.prepare_store([33]).evicted     # 11 is the least recently used
[11]
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

#: The host tier's eviction choices, as vLLM's ``eviction_policy`` names them.
OFFLOAD_POLICIES = ("lru", "arc")


@dataclass(slots=True)
class HostBlock:
    """A host block holding one hash: its id and vLLM's ``BlockStatus.ref_cnt``."""

    block_id: int
    ref_cnt: int = -1          # -1: being stored (not ready); >0: being loaded

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0


@dataclass(slots=True)
class StoreResult:
    """What :meth:`prepare_store` decided: (hash, host block) pairs to copy into, and the
    hashes evicted to make room."""

    stored: list[tuple[int, int]] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)


class _HostBlocks:
    """Free host block ids as vLLM's ``CPUBackend`` hands them out: never-used ids first, in
    order, then the most recently freed one."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._next = 0
        self._freed: list[int] = []

    @property
    def num_free(self) -> int:
        return self.num_blocks - self._next + len(self._freed)

    def take(self) -> int:
        if self._next < self.num_blocks:
            self._next += 1
            return self._next - 1
        return self._freed.pop()

    def give_back(self, block_id: int) -> None:
        self._freed.append(block_id)


class LRUOffloadingManager:
    """Host blocks by hash, evicted least recently used first (vLLM's LRU manager)."""

    policy = "lru"

    def __init__(self, num_blocks: int):
        self.backend = _HostBlocks(num_blocks)
        self.blocks: OrderedDict[int, HostBlock] = OrderedDict()
        self.num_dropped_blocks = 0    # blocks a store could not make room for

    @property
    def num_blocks(self) -> int:
        return self.backend.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Host blocks holding (or being written with) a hash."""
        return self.num_blocks - self.backend.num_free

    @property
    def num_pinned_blocks(self) -> int:
        """Swap space: none here (vLLM v1 does not swap); see :mod:`kvsim.cache.host_tier`."""
        return 0

    def get(self, block_hash: int) -> HostBlock | None:
        return self.blocks.get(block_hash)

    def lookup(self, block_hashes: Iterable[int]) -> int:
        """Length of the leading run of ``block_hashes`` that is offloaded and ready."""
        hits, get = 0, self.get
        for block_hash in block_hashes:
            block = get(block_hash)
            if block is None or block.ref_cnt < 0:
                break
            hits += 1
        return hits

    def prepare_load(self, block_hashes: Sequence[int]) -> list[int]:
        """Pin the (ready) blocks of ``block_hashes`` for reading; their host block ids."""
        ids = []
        for block_hash in block_hashes:
            block = self.get(block_hash)
            block.ref_cnt += 1
            ids.append(block.block_id)
        return ids

    def complete_load(self, block_hashes: Iterable[int]) -> None:
        for block_hash in block_hashes:
            self.get(block_hash).ref_cnt -= 1

    def touch(self, block_hashes: Sequence[int]) -> None:
        """Mark as recently used, the first hash most recently (a chain's tail goes first)."""
        blocks = self.blocks
        # a whole prefix at every step: filtered and moved in C, no Python loop
        deque(map(blocks.move_to_end, filter(blocks.__contains__, reversed(block_hashes))),
              maxlen=0)

    def prepare_store(self, block_hashes: Sequence[int]) -> StoreResult | None:
        """Reserve host blocks for the hashes not yet offloaded, evicting what must go; None
        (and nothing changes) when too few blocks can be evicted."""
        new = [h for h in dict.fromkeys(block_hashes) if h not in self.blocks]
        result = StoreResult()
        if not new:
            return result
        victims = self._victims(len(new) - self.backend.num_free)
        if victims is None:
            self.num_dropped_blocks += len(new)
            return None
        for block_hash in victims:
            self._drop(block_hash)
        result.evicted = victims
        for block_hash in new:
            block = HostBlock(self.backend.take())
            self._insert(block_hash, block)
            result.stored.append((block_hash, block.block_id))
        return result

    def complete_store(self, block_hashes: Iterable[int], success: bool = True) -> None:
        """The copies are done: the blocks become loadable (and evictable); or they failed
        (never ran): the blocks are given up."""
        for block_hash in block_hashes:
            block = self.get(block_hash)
            if block is None or block.ref_cnt >= 0:
                continue
            if success:
                block.ref_cnt = 0
            else:
                self._remove(block_hash)
                self.backend.give_back(block.block_id)

    # --- policy hooks --------------------------------------------------------------------

    def _victims(self, n: int) -> list[int] | None:
        if n <= 0:
            return []
        victims = []
        for block_hash, block in self.blocks.items():
            if block.ref_cnt == 0:
                victims.append(block_hash)
                if len(victims) == n:
                    return victims
        return None

    def _drop(self, block_hash: int) -> None:
        self.backend.give_back(self.blocks.pop(block_hash).block_id)

    def _remove(self, block_hash: int) -> None:
        del self.blocks[block_hash]

    def _insert(self, block_hash: int, block: HostBlock) -> None:
        self.blocks[block_hash] = block


class ARCOffloadingManager(LRUOffloadingManager):
    """vLLM's ARC manager: T1 (seen once) and T2 (touched again) with ghost lists B1/B2
    steering the target size of T1."""

    policy = "arc"

    def __init__(self, num_blocks: int):
        super().__init__(num_blocks)
        self.target_t1_size = 0
        self.t1: OrderedDict[int, HostBlock] = OrderedDict()
        self.t2: OrderedDict[int, HostBlock] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.blocks = _Union(self.t1, self.t2)

    def get(self, block_hash: int) -> HostBlock | None:
        return self.t1.get(block_hash) or self.t2.get(block_hash)

    def touch(self, block_hashes: Sequence[int]) -> None:
        t1, t2, b1, b2 = self.t1, self.t2, self.b1, self.b2
        for block_hash in reversed(block_hashes):
            if block_hash in t1:
                block = t1.pop(block_hash)
                if block.ref_cnt < 0:        # just stored: not really seen twice
                    t1[block_hash] = block
                else:
                    t2[block_hash] = block
            elif block_hash in t2:
                t2.move_to_end(block_hash)
            elif block_hash in b1:
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

    def _victims(self, n: int) -> list[int] | None:
        """ARC's choice, simulated without changing anything (the store may still fail)."""
        if n <= 0:
            return []
        t1_left = len(self.t1)
        it1, it2 = iter(self.t1.items()), iter(self.t2.items())
        victims = []
        while len(victims) < n:
            found = None
            if t1_left >= self.target_t1_size:
                found = next((h for h, b in it1 if b.ref_cnt == 0), None)
            if found is not None:
                t1_left -= 1
            else:
                found = next((h for h, b in it2 if b.ref_cnt == 0), None)
                if found is None:
                    return None
            victims.append(found)
        return victims

    def _drop(self, block_hash: int) -> None:
        if block_hash in self.t1:
            block, ghosts = self.t1.pop(block_hash), self.b1
        else:
            block, ghosts = self.t2.pop(block_hash), self.b2
        ghosts[block_hash] = None
        self.backend.give_back(block.block_id)

    def _remove(self, block_hash: int) -> None:
        if self.t1.pop(block_hash, None) is None:
            del self.t2[block_hash]

    def _insert(self, block_hash: int, block: HostBlock) -> None:
        self.t1[block_hash] = block
        self.b1.pop(block_hash, None)
        self.b2.pop(block_hash, None)


class _Union:
    """``in`` and ``values()`` over T1 and T2 (what the LRU base class reads)."""

    def __init__(self, *parts: OrderedDict):
        self.parts = parts

    def __contains__(self, key) -> bool:
        return any(key in p for p in self.parts)

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def values(self):
        for p in self.parts:
            yield from p.values()


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
