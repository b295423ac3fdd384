"""vLLM's chain touches on the host tier, applied only once they can change an eviction.

vLLM's offloading scheduler touches a request's whole chain of blocks each time it stores one
(the chain becomes the most recently used, its first block most of all): for a long prompt,
hundreds of host blocks moved again at every decode step that fills a block. A touch changes
nothing anyone sees until an eviction reaches the blocks it moved, which, for a running
request's chain, is usually never: it is touched again first.

:class:`ChainTouches` keeps each chain's latest touch *pending* instead: the stamps the touch
would give (:meth:`RecencyOrder.reserve`, one per position, so that they order exactly as an
immediate touch would) and the chain's length then. A pending chain also keeps a *floor*, a
stamp no block of its positions is older than: the oldest block it covers when it is first
touched (or that touch's stamp), the touch itself once applied; a block stored later is newer
still. Victims older than every pending floor are victims of the immediate touches too (every
pending block is newer than them either way), so an eviction needs a pending chain applied
only once it reaches the chain's floor (:meth:`ChainTouches.settle_until`); forgetting a chain
(its request ends) applies it. Applying raises each held block's stamp to the touch's (a block
stored or touched since the touch keeps its newer stamp), which is what the immediate touches
leave: the latest event orders a block.
"""

from __future__ import annotations

import math

import numpy as np

from kvsim.cache.recency import RecencyOrder


class ChainTouches:
    """Pending chain touches over ``recency`` (host block ids). ``ids_of(hashes)``: the host
    block holding each hash, -1 where none (an array), ``id_of_one(hash)`` the same for one
    hash (an int); ``version[b]`` is bumped when block ``b`` is given up (so a chain's
    remembered blocks are checked, not looked up again)."""

    def __init__(self, recency: RecencyOrder, ids_of, id_of_one, version: np.ndarray):
        self._recency, self._ids_of, self._version = recency, ids_of, version
        self._id_of_one = id_of_one
        self._known: dict[object, _ChainBlocks] = {}     # the host blocks of its positions
        self._pending: dict[object, tuple[int, int, object]] = {}   # key -> (stamp, n, hashes_at)
        self._floor: dict[object, int] = {}
        self._lowest: float | None = math.inf    # lowest floor of a pending chain (None: unknown)

    def __len__(self) -> int:
        return len(self._pending)

    def touch(self, key, n: int, hashes_at, stored: tuple[int, list[int]] | None = None) -> None:
        """Touch the first ``n`` positions of chain ``key``; ``hashes_at(positions)`` gives
        their hashes (read now for positions new to the chain, later for the rest).
        ``stored``: (first position, host blocks) of positions just stored, which then need
        no lookup when they are the positions new to the chain."""
        pending = self._pending.get(key)
        if pending is not None and pending[1] > n:
            self._apply(key)    # a shorter touch leaves the rest of the chain where it put it
        known = self._known.get(key)
        if known is None:
            known = self._known[key] = _ChainBlocks()
        stamp = self._recency.reserve(n)
        floor = self._floor.get(key, stamp)     # (a block stored from now on is newer)
        if n < known.size:      # (a shorter chain: positions past ``n`` are looked up again)
            known.size = n
        elif n == known.size + 1:       # one position more (a decode step filled a block)
            block_id = (stored[1][0] if stored is not None and stored[0] == known.size else
                        self._id_of_one(hashes_at([known.size])[0]))
            if block_id >= 0:
                floor = min(floor, int(self._recency.stamps(block_id)))
                known.append_one(block_id, int(self._version[block_id]))
            else:
                known.append_one(-1, -1)
        elif n > known.size:
            if stored is not None and stored[0] == known.size and len(stored[1]) == n - known.size:
                new = np.array(stored[1], dtype=np.int64)
            else:
                new = self._ids_of(hashes_at(list(range(known.size, n))))
            held = new[new >= 0]
            if len(held):
                floor = min(floor, int(self._recency.stamps(held).min()))
            known.append(new, np.where(new >= 0, self._version[new], -1))
        self._pending[key] = (stamp, n, hashes_at)
        self._floor[key] = floor
        if self._lowest is not None and floor < self._lowest:
            self._lowest = floor

    def forget(self, key) -> None:
        """Chain ``key`` is done (its request ended): its pending touch is applied."""
        if key in self._pending:
            self._apply(key)
        self._known.pop(key, None)
        self._floor.pop(key, None)

    def lowest_floor(self) -> float:
        """No block of a pending chain is older than this (inf when none is pending)."""
        if self._lowest is None:
            self._lowest = min((self._floor[k] for k in self._pending), default=math.inf)
        return self._lowest

    def settle_until(self, stamp: int) -> None:
        """Apply every pending chain whose floor is ``stamp`` or older."""
        for key in [k for k in self._pending if self._floor[k] <= stamp]:
            self._apply(key)

    def settle_all(self) -> None:
        for key in list(self._pending):
            self._apply(key)

    def _apply(self, key) -> None:
        """Give the held blocks of chain ``key`` its pending touch's stamps (position ``p`` of
        ``n``: ``stamp + n - 1 - p``), unless they are newer already."""
        stamp, n, hashes_at = self._pending.pop(key)
        self._lowest = None
        ids = self._current_ids(key, n, hashes_at)
        positions = np.flatnonzero(ids >= 0)
        if len(positions):
            self._recency.raise_to(ids[positions], stamp + n - 1 - positions)
        self._floor[key] = stamp

    def _current_ids(self, key, n: int, hashes_at) -> np.ndarray:
        """The host blocks holding the chain's first ``n`` positions now (-1: none); blocks
        remembered and not given up since are not looked up again."""
        known = self._known[key]
        ids = known.ids[:n]
        valid = self._version[ids] == known.versions[:n]   # (-1: never, versions are >= 0)
        if not valid.all():
            ids = np.where(valid, ids, -1)
            redo = np.flatnonzero(ids < 0)
            ids[redo] = self._ids_of(hashes_at(redo.tolist()))
            known.ids[:n] = ids
            known.versions[:n] = np.where(ids >= 0, self._version[ids], -1)
        return ids


class _ChainBlocks:
    """The host blocks a chain's first ``size`` positions were found in (-1: none), with
    the versions those had then; the arrays grow by doubling."""

    __slots__ = ("ids", "versions", "size")

    def __init__(self):
        self.ids = np.empty(64, dtype=np.int64)
        self.versions = np.empty(64, dtype=np.int64)
        self.size = 0

    def append(self, ids: np.ndarray, versions: np.ndarray) -> None:
        end = self.size + len(ids)
        self._reserve(end)
        self.ids[self.size:end] = ids
        self.versions[self.size:end] = versions
        self.size = end

    def append_one(self, block_id: int, version: int) -> None:
        self._reserve(self.size + 1)
        self.ids[self.size] = block_id
        self.versions[self.size] = version
        self.size += 1

    def _reserve(self, end: int) -> None:
        if end > len(self.ids):
            capacity = max(end, 2 * len(self.ids))
            self.ids = _grown(self.ids, self.size, capacity)
            self.versions = _grown(self.versions, self.size, capacity)


def _grown(values: np.ndarray, size: int, capacity: int) -> np.ndarray:
    """``values[:size]`` at the head of a new array of ``capacity`` entries."""
    grown = np.empty(capacity, dtype=values.dtype)
    grown[:size] = values[:size]
    return grown
