"""vLLM's CPU offloading managers: which block hashes the host holds, and which it gives up.

Ports of the scheduler-side bookkeeping of vLLM's native KV offloading
(``vllm/v1/kv_offload/``): :class:`LRUOffloadingManager` (``lru_manager.py``) here; ARC's
manager, the reuse gate and the factory that picks them are in
:mod:`kvsim.cache.offload_managers`. A manager knows hashes and host block ids only;
:mod:`kvsim.cache.offloading` decides when to call it and turns its answers into copies in the
step plan.

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

from dataclasses import dataclass, field
from itertools import repeat
from typing import Iterable, Sequence

import numpy as np

from kvsim.cache.bulk import delete_all
from kvsim.cache.chain_touch import ChainTouches
from kvsim.cache.recency import RecencyOrder


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
    """What :meth:`prepare_store` decided: the hashes to copy and the host block each goes
    into (``stored``: the pairs), and the hashes evicted to make room."""

    hashes: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)

    @property
    def stored(self) -> list[tuple[int, int]]:
        return list(zip(self.hashes, self.block_ids))


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

    def take(self, n: int) -> list[int]:
        """``n`` (<= ``num_free``) ids, one after the other as vLLM takes them."""
        fresh = min(n, self.num_blocks - self._next)
        ids = list(range(self._next, self._next + fresh))
        self._next += fresh
        if fresh < n:
            reused = self._freed[fresh - n:]
            del self._freed[fresh - n:]
            ids.extend(reversed(reused))
        return ids

    def give_back(self, block_ids: list[int]) -> None:
        self._freed.extend(block_ids)


class LRUOffloadingManager:
    """Host blocks by hash, evicted least recently used first (vLLM's LRU manager).

    The host blocks' state lives in arrays indexed by host block id (the hash each holds and
    vLLM's ``ref_cnt``), found by hash through one ``dict``; the recency order is a
    :class:`~kvsim.cache.recency.RecencyOrder` of host ids (a stamp each), and the touch of a
    request's whole chain, which vLLM does each time it stores a block, waits until an
    eviction could tell (:class:`~kvsim.cache.chain_touch.ChainTouches`). Subclasses keep
    another order (ARC) through the recency hooks at the end."""

    policy = "lru"

    def __init__(self, num_blocks: int):
        self.backend = _HostBlocks(num_blocks)
        self._id_of: dict[int, int] = {}                  # hash -> host block holding it
        self._hash_of = np.zeros(num_blocks, dtype=np.int64)
        self._ref = np.zeros(num_blocks, dtype=np.int32)  # of held blocks: vLLM's ref_cnt
        self._recency = RecencyOrder(num_blocks)
        self._version = np.zeros(num_blocks, dtype=np.int64)  # bumped when a block is given up
        self._chains = ChainTouches(self._recency, self._ids,  # see touch_chain
                                    lambda block_hash: self._id_of.get(block_hash, -1),
                                    self._version)
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

    @property
    def blocks(self) -> list[int]:
        """The held hashes, least recently used first."""
        self._chains.settle_all()
        return self._hash_of[self._recency.ids()].tolist()

    def get(self, block_hash: int) -> HostBlock | None:
        """The host block holding ``block_hash`` (a snapshot), or None."""
        block_id = self._id_of.get(block_hash)
        return None if block_id is None else HostBlock(block_id, int(self._ref[block_id]))

    def lookup(self, block_hashes: Iterable[int]) -> int:
        """Length of the leading run of ``block_hashes`` that is offloaded and ready."""
        hits, get, ref = 0, self._id_of.get, self._ref
        for block_hash in block_hashes:
            block_id = get(block_hash)
            if block_id is None or ref[block_id] < 0:
                break
            hits += 1
        return hits

    def block_ids(self, block_hashes: Iterable[int]) -> list[int]:
        """The host blocks holding ``block_hashes`` (all held)."""
        return list(map(self._id_of.__getitem__, block_hashes))

    def prepare_load(self, block_hashes: Sequence[int]) -> list[int]:
        """Pin the (ready, distinct) blocks of ``block_hashes`` for reading; their host ids."""
        ids = self.block_ids(block_hashes)
        self._ref[ids] += 1
        return ids

    def complete_load(self, block_hashes: Iterable[int]) -> None:
        self._ref[self.block_ids(block_hashes)] -= 1

    def touch(self, block_hashes: Sequence[int]) -> None:
        """Mark as recently used (distinct hashes), the first most recently (a chain's tail
        goes first)."""
        ids = self._ids(reversed(block_hashes))
        ids = ids[ids >= 0]
        if len(ids):
            self._recency.move_many_to_end(ids)

    def touch_chain(self, key, n: int, hashes_at, stored=None) -> None:
        """``touch`` the first ``n`` blocks of the chain ``key`` (a request's blocks, touched
        again each time it stores one), where ``hashes_at(positions)`` gives the hashes at
        those positions: applied once an eviction reaches the chain, or when it is forgotten,
        with the same victims and order (:mod:`kvsim.cache.chain_touch`). ``stored``: (first
        position, host blocks) of the positions the last store took, if known."""
        self._chains.touch(key, n, hashes_at, stored)

    def forget_chain(self, key) -> None:
        """The chain's request ended (call before its blocks' hashes change)."""
        self._chains.forget(key)

    def prepare_store(self, block_hashes: Sequence[int]) -> StoreResult | None:
        """Reserve host blocks for the hashes not yet offloaded, evicting what must go; None
        (and nothing changes) when too few blocks can be evicted."""
        if len(block_hashes) == 1 and self._stores_one_by_scalars:
            return self._store_one(block_hashes[0])
        held = self._id_of
        new = list(dict.fromkeys(block_hashes))
        if not held.keys().isdisjoint(new):
            new = [h for h in new if h not in held]
        result = StoreResult()
        if not new:
            return result
        victims = self._victims(len(new) - self.backend.num_free)
        if victims is None:
            self.num_dropped_blocks += len(new)
            return None
        if len(victims):
            result.evicted = self._release(victims, evicted=True)
        ids = self.backend.take(len(new))
        held.update(zip(new, ids))
        at = np.array(ids, dtype=np.int64)
        self._hash_of[at] = new
        self._ref[at] = -1
        self._remember(new, at)
        result.hashes, result.block_ids = new, ids
        return result

    def _store_one(self, block_hash: int) -> StoreResult | None:
        """:meth:`prepare_store` of one hash (a decode step that fills a block: most calls),
        the same steps on scalars."""
        if block_hash in self._id_of:
            return StoreResult()
        result = StoreResult()
        if not self.backend.num_free:
            victim = self._victim()
            if victim is None:
                self.num_dropped_blocks += 1
                return None
            result.evicted = [self._release_one(victim)]
        block_id = self.backend.take(1)[0]
        self._id_of[block_hash] = block_id
        self._hash_of[block_id] = block_hash
        self._ref[block_id] = -1
        self._recency.append(block_id)
        result.hashes, result.block_ids = [block_hash], [block_id]
        return result

    def complete_store(self, block_hashes: Iterable[int], success: bool = True) -> None:
        """The copies are done: the blocks become loadable (and evictable); or they failed
        (never ran): the blocks are given up."""
        ids = self._ids(dict.fromkeys(block_hashes))
        self.complete_store_blocks(ids[ids >= 0], success)

    def complete_store_blocks(self, block_ids: np.ndarray, success: bool = True) -> None:
        """:meth:`complete_store` by host block (distinct ids that :meth:`prepare_store` gave:
        a block being stored keeps its hash until then); those already complete are left."""
        ids = block_ids[self._ref[block_ids] < 0]
        if success:
            self._ref[ids] = 0
        elif len(ids):
            self._release(ids, evicted=False)

    def _ids(self, block_hashes: Iterable[int]) -> np.ndarray:
        """The host block holding each of ``block_hashes``, -1 where none does."""
        return np.fromiter(map(self._id_of.get, block_hashes, repeat(-1)), dtype=np.int64)

    def _release(self, ids: np.ndarray, evicted: bool) -> list[int]:
        """Give up the blocks ``ids`` (in this order); their hashes."""
        hashes = self._hash_of[ids].tolist()
        delete_all(self._id_of, hashes)
        self._version[ids] += 1
        self._forget(ids, hashes, evicted)
        self.backend.give_back(ids.tolist())
        return hashes

    def _release_one(self, block_id: int) -> int:
        """:meth:`_release` of one evicted block; its hash."""
        block_hash = int(self._hash_of[block_id])
        del self._id_of[block_hash]
        self._version[block_id] += 1
        self._recency.discard(block_id)
        self.backend.give_back([block_id])
        return block_hash

    # --- recency hooks -------------------------------------------------------------------

    #: Whether :meth:`prepare_store` takes one hash through :meth:`_store_one`, which
    #: assumes the LRU hooks below: a subclass overriding any of them does not.
    _stores_one_by_scalars = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if any(getattr(cls, hook) is not getattr(LRUOffloadingManager, hook)
               for hook in ("_victims", "_remember", "_forget")):
            cls._stores_one_by_scalars = False

    def _victim(self) -> int | None:
        """``_victims(1)`` as an int (or None)."""
        ref, chains, recency = self._ref, self._chains, self._recency
        while True:
            victim = recency.oldest(lambda ids: ref[ids] == 0, lambda b: ref[b] == 0)
            if victim is None or not len(chains):
                return victim
            newest = int(recency.stamps(victim))
            if newest < chains.lowest_floor():
                return victim
            chains.settle_until(newest)

    def _victims(self, n: int) -> np.ndarray | None:
        """The ``n`` blocks to evict (ready, not being loaded), in order; None if too few.
        Pending chain touches that could move one of them are applied first."""
        ref, chains = self._ref, self._chains
        while True:
            victims = self._recency.first(n, lambda ids: ref[ids] == 0)
            if victims is None or not len(victims) or not len(chains):
                return victims
            newest = int(self._recency.stamps(victims[-1:])[0])
            if newest < chains.lowest_floor():
                return victims
            chains.settle_until(newest)

    def _remember(self, hashes: list[int], ids: np.ndarray) -> None:
        """New blocks, just reserved: the most recently used."""
        self._recency.extend(ids)

    def _forget(self, ids: np.ndarray, hashes: list[int], evicted: bool) -> None:
        """Blocks given up: evicted, or their store failed."""
        self._recency.remove(ids)
