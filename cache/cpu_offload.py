"""vLLM's CPU offloading manager: which block hashes the host holds, and which it gives up.

A port of the scheduler-side bookkeeping of vLLM 0.32's native KV offloading
(``vllm/v1/kv_offload/cpu/manager.py``, ``CPUOffloadingManager``, with its LRU cache policy,
``cpu/policies/lru.py``): :class:`LRUOffloadingManager` here; the ARC policy and the factory
that picks one are in :mod:`kvsim.cache.offload_managers`. A manager knows hashes and host
block ids only; :mod:`kvsim.cache.offloading` decides when to call it and turns its answers
into copies in the step plan.

- A stored block is *not ready* (``ref_cnt == -1``) from :meth:`prepare_store` until
  :meth:`complete_store`: a lookup that reaches it is *pending* (the request waits for it), and
  no eviction takes it. A block being loaded is pinned (``ref_cnt > 0``) from
  :meth:`prepare_load` to :meth:`complete_load`. Only blocks with ``ref_cnt == 0`` are evicted,
  and never one the same store offers.
- Recency is set when a block is stored, and again when a request finishes
  (:meth:`request_finished`): every block the request stored, offered when already held, or
  loaded becomes the most recent, its first block most of all. Lookups and stores touch
  nothing.
- ``store_threshold`` >= 2: a block is stored only once it was offered that many times
  (counts kept for the ``max_tracker_size`` most recently offered hashes).

>>> m = LRUOffloadingManager(2)
>>> m.prepare_store([11, 22], "a").stored
[(11, 0), (22, 1)]
>>> print(m.lookup([11, 22]))          # being stored: the lookup must wait
None
>>> m.complete_store([11, 22]); m.lookup([11, 22, 33])
2
>>> m.prepare_store([33], "b").evicted     # 11 is the least recently used
[11]
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import repeat
from typing import Iterable, Sequence

import numpy as np

from kvsim.cache.bulk import delete_all
from kvsim.cache.intmap import COMPILED, hash_map
from kvsim.cache.offload_records import NO_IDS, HostBlocks, Offer, RequestAccess
from kvsim.cache.recency import recency_order

@dataclass(slots=True)
class HostBlock:
    """A host block holding one hash: its id and vLLM's ``ref_cnt``."""

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
    #: which of the offered hashes are ``hashes`` (None: all of them, or not known)
    stored_mask: list[bool] | None = None

    @property
    def stored(self) -> list[tuple[int, int]]:
        return list(zip(self.hashes, self.block_ids))


class LRUOffloadingManager:
    """Host blocks by hash, evicted least recently used first (vLLM's manager, LRU policy).

    The host blocks' state lives in arrays indexed by host block id (the hash each holds and
    vLLM's ``ref_cnt``), found by hash through one ``dict``; the recency order is a
    :func:`~kvsim.cache.recency.recency_order` of host ids (vLLM's ranks). Subclasses keep
    another order (ARC) through the policy hooks at the end."""

    policy = "lru"
    #: Whether the policy reads which of a request's hashes it inserted and which it reused.
    _weighs_reuse = False

    def __init__(self, num_blocks: int, store_threshold: int = 0,
                 max_tracker_size: int = 64_000):
        if max_tracker_size < 1:
            raise ValueError(f"max_tracker_size must be >= 1, got {max_tracker_size}")
        self.backend = HostBlocks(num_blocks)
        self._id_of: dict[int, int] = hash_map()          # hash -> host block holding it
        self._hash_of = np.zeros(num_blocks, dtype=np.int64)  # (kept when given up: see _held)
        self._held = np.zeros(num_blocks, dtype=bool)
        self._ref = np.zeros(num_blocks, dtype=np.int32)  # of held blocks: vLLM's ref_cnt
        self._recency = recency_order(num_blocks)
        self._num_evictable = 0                           # held blocks with ref_cnt 0
        self._access: dict[object, RequestAccess] = {}
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.counts: OrderedDict[int, int] | None = (OrderedDict() if store_threshold >= 2
                                                     else None)
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
        return self._hash_of[self._recency.ids()].tolist()

    def get(self, block_hash: int) -> HostBlock | None:
        """The host block holding ``block_hash`` (a snapshot), or None."""
        block_id = self._id_of.get(block_hash)
        return None if block_id is None else HostBlock(block_id, int(self._ref[block_id]))

    # --- lookups and loads ---------------------------------------------------------------

    def lookup(self, block_hashes: Iterable[int]) -> int | None:
        """Length of the leading run of ``block_hashes`` that is offloaded; None when a block
        of that run is still being stored (vLLM's ``HIT_PENDING``: the request waits)."""
        hits, get, ref, pending = 0, self._id_of.get, self._ref, False
        for block_hash in block_hashes:
            block_id = get(block_hash)
            if block_id is None:
                break
            if ref[block_id] < 0:
                pending = True
            hits += 1
        return None if pending else hits

    def block_ids(self, block_hashes: Iterable[int]) -> list[int]:
        """The host blocks holding ``block_hashes`` (all held)."""
        return list(map(self._id_of.__getitem__, block_hashes))

    def prepare_load(self, block_hashes: Sequence[int], request=None,
                     first_position: int = 0) -> list[int]:
        """Pin the (ready, distinct) blocks of ``block_hashes`` for reading, for ``request``
        (whose blocks from ``first_position`` they are); their host ids."""
        ids = self.block_ids(block_hashes)
        at = np.array(ids, dtype=np.int64)
        self._num_evictable -= int(np.count_nonzero(self._ref[at] == 0))
        self._ref[at] += 1
        access = self._access_of(request)
        access.add(np.array(block_hashes, dtype=np.int64),
                   np.arange(first_position, first_position + len(ids)), at)
        if self._weighs_reuse:
            access.reused.update(h for h in block_hashes if h not in access.inserted)
        return ids

    def complete_load(self, block_hashes: Iterable[int]) -> None:
        at = np.array(self.block_ids(block_hashes), dtype=np.int64)
        self._ref[at] -= 1
        self._num_evictable += int(np.count_nonzero(self._ref[at] == 0))

    # --- stores --------------------------------------------------------------------------

    def prepare_store(self, block_hashes: Sequence[int], request=None,
                      first_position: int = 0) -> StoreResult | None:
        """Reserve host blocks for the offered hashes (``request``'s blocks from
        ``first_position``) not held yet, evicting what must go; None (no block stored) when
        too few blocks can be evicted. The request's hashes stored or already held and ready
        count as used by it (:meth:`request_finished`)."""
        offer = self._sort_out(block_hashes, first_position)
        access = self._access_of(request)
        if self._weighs_reuse:
            self._note_reuse(access, offer)
        result = self._store(offer) if offer.new else StoreResult()
        if result is not None and self._weighs_reuse:
            access.inserted.update(result.hashes)
        self._note_use(access, offer)
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
            self._num_evictable += len(ids)
        elif len(ids):
            self._release(ids, evicted=False)

    def request_finished(self, request) -> None:
        """``request`` is done: the hashes it used become the most recent, its first block
        most of all (vLLM's ``on_request_finished``)."""
        access = self._access.pop(request, None)
        if access is not None and access.parts:
            self._touch_finished(access)

    # --- internals -----------------------------------------------------------------------

    def _access_of(self, request) -> RequestAccess:
        access = self._access.get(request)
        if access is None:
            access = self._access[request] = RequestAccess()
        return access

    def _note_reuse(self, access: RequestAccess, offer: Offer) -> None:
        """For a policy that weighs reuse: the offer's new hashes missed (once per request),
        its held and ready ones reused."""
        misses = [h for h in offer.new if h not in access.store_misses]
        if misses:
            self._store_miss(misses)
            access.store_misses.update(misses)
        if offer.ready is not None:
            access.reused.update(h for h, r in zip(offer.hashes, offer.ready.tolist())
                                 if r and h not in access.inserted)

    def _note_use(self, access: RequestAccess, offer: Offer) -> None:
        """The request uses the hashes of the offer it may store and those held and ready
        (:meth:`Offer.used`), each with where it is now."""
        hashes = np.array(offer.hashes, dtype=np.int64)
        positions = np.arange(offer.first, offer.first + len(hashes))
        ids, used = offer.host_ids(self._ids), offer.used()
        if used is None:
            access.add(hashes, positions, ids)
        else:
            access.add(hashes[used], positions[used], ids[used])

    def _sort_out(self, block_hashes: Sequence[int], first: int) -> Offer:
        """The offer, its hashes counted by the reuse gate and sorted out against those
        held (only when one is)."""
        if self.counts is not None:
            self._count_offers(block_hashes)
        offer = Offer(block_hashes, first)
        if not self._id_of.keys().isdisjoint(block_hashes):
            offer.sort_out(self._ids(block_hashes), self._ref)
        if self.counts is not None:
            counts, threshold = self.counts, self.store_threshold
            offer.new = [h for h in offer.new if counts.get(h, 0) >= threshold]
        return offer

    def _store(self, offer: Offer) -> StoreResult | None:
        """Make room for the offer's new hashes and reserve their blocks, not ready."""
        new = offer.new
        victims = self._make_room(len(new), offer.held_ids)
        if victims is None:
            self.num_dropped_blocks += len(new)
            return None
        result = StoreResult()
        if len(victims):
            result.evicted = self._release(victims)
        block_ids = self.backend.take(len(new))
        if COMPILED:
            self._id_of.set_many(new, block_ids)
        else:
            self._id_of.update(zip(new, block_ids))
        at = np.array(block_ids, dtype=np.int64)
        self._hash_of[at] = new
        self._held[at] = True
        self._ref[at] = -1
        self._insert(new, at)
        offer.stored_at = at
        result.hashes, result.block_ids = new, block_ids
        if offer.held is not None and self.counts is None:
            result.stored_mask = (~offer.held).tolist()
        return result

    def _count_offers(self, block_hashes: Sequence[int]) -> None:
        """One more offer of each hash; a hash offered again is kept, the tracker's oldest
        other hashes give way to new ones (vLLM's ``_record_accesses``)."""
        counts = self.counts
        protected = set()
        for block_hash in block_hashes:
            if block_hash in counts:
                counts.move_to_end(block_hash)
                counts[block_hash] += 1
                protected.add(block_hash)
        num_unprotected = len(counts) - len(protected)
        for block_hash in block_hashes:
            if block_hash in counts:
                continue
            if len(counts) >= self.max_tracker_size:
                if num_unprotected == 0:
                    continue
                counts.popitem(last=False)
                num_unprotected -= 1
            counts[block_hash] = 1

    def _make_room(self, n: int, offered: np.ndarray) -> np.ndarray | None:
        """The blocks to evict so that ``n`` fit (None: too few evictable); never one of
        ``offered`` (host ids of the offer's held hashes)."""
        n -= self.backend.num_free
        if n <= 0:
            return NO_IDS
        if n > self._num_evictable:
            return None
        return self._victims(n, offered)

    def _ids(self, block_hashes: Iterable[int]) -> np.ndarray:
        """The host block holding each of ``block_hashes``, -1 where none does."""
        if COMPILED:
            return np.array(self._id_of.get_many(block_hashes, -1), dtype=np.int64)
        return np.fromiter(map(self._id_of.get, block_hashes, repeat(-1)), dtype=np.int64)

    def _release(self, ids: np.ndarray, evicted: bool = True) -> list[int]:
        """Give up the blocks ``ids`` (in this order); their hashes."""
        hashes = self._hash_of[ids].tolist()
        delete_all(self._id_of, hashes)
        self._held[ids] = False
        if evicted:
            self._num_evictable -= len(ids)
        self._forget(ids, hashes, evicted)
        self.backend.give_back(ids.tolist())
        return hashes

    # --- policy hooks --------------------------------------------------------------------

    def _victims(self, n: int, offered: np.ndarray) -> np.ndarray | None:
        """The ``n`` least recently used blocks with ``ref_cnt`` 0, not ``offered``; None if
        fewer are."""
        if not len(offered):
            return self._recency.first_free(n, self._ref)
        offered_mark = np.zeros(len(self._ref), dtype=bool)
        offered_mark[offered] = True
        return self._recency.first_free(n, self._ref, offered_mark)

    def _insert(self, hashes: list[int], ids: np.ndarray) -> None:
        """New blocks, just reserved: the most recent, the last of them most of all."""
        self._recency.extend(ids)

    def _forget(self, ids: np.ndarray, hashes: list[int], evicted: bool) -> None:
        """Blocks given up: evicted, or their store failed."""
        self._recency.remove(ids)

    def _store_miss(self, hashes: list[int]) -> None:
        """Hashes a request offers that are not held (once per request): LRU ignores them."""

    def _touch_finished(self, access: RequestAccess) -> None:
        """A finished request's hashes, still held, become the most recent, first last."""
        hashes, ids = access.head_to_tail()
        ids = self._held_ids(hashes, ids)[::-1]
        ids = ids[ids >= 0]
        if len(ids):
            self._recency.move_many_to_end(ids)

    def _held_ids(self, hashes: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The host blocks holding ``hashes`` now (-1: none), given where they were: those
        still there checked at once, the others looked up."""
        ids = ids.copy()
        moved = (ids < 0) | ~self._held[ids] | (self._hash_of[ids] != hashes)
        if moved.any():
            ids[moved] = self._ids(hashes[moved].tolist())
        return ids

