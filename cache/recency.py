"""A recency order of block ids kept as last-use stamps: the host tier's LRU list.

vLLM's LRU offloading manager moves a request's whole chain to the most recent end each time
it stores a block, so a long prompt's hundreds of host blocks are moved again at every decode
step that fills a block. As a :class:`~kvsim.cache.free_queue.FreeQueue` every such move leaves
hundreds of stale entries to skip and rebuild. :class:`RecencyOrder` keeps the same order as
one stamp per block instead (a counter value, larger is more recent): moving blocks to the end
is a single array write, and removing them is another.

Finding the oldest blocks then needs a search, done lazily: a *candidate list* holds the
oldest ``k`` blocks as they were when it was made, with the stamps they had. A candidate whose
stamp is still the same is *valid*; any block that is not a valid candidate was newer than
every candidate when the list was made, or was moved (or added) after that, so it is newer
still. Hence the valid candidates, in list order, are exactly the head of the order; the list
is rebuilt (an ``argpartition`` over the queued blocks) only when a request needs more of the
head than its valid candidates cover.

Same order and same answers as the :class:`~kvsim.cache.free_queue.FreeQueue` operations it
replaces (:meth:`extend`, :meth:`move_many_to_end`, :meth:`remove`, :meth:`first`,
:meth:`ids`); ids go in and come out as ``int64`` arrays.

Where ``cache/_recency.c`` was built, :func:`recency_order` gives a :class:`CompiledRecency`
instead: the same order as a doubly linked list in two arrays (each change a few writes per
block, the victims found by walking from the head, in C), for the operations the CPU tier
uses (:meth:`RecencyOrder.first_free` for :meth:`RecencyOrder.first`).
"""

from __future__ import annotations

import numpy as np

from kvsim.cache.intmap import PURE_PYTHON

try:
    from kvsim.cache._recency import RecencyList
except ImportError:         # (not built: no C compiler at install time)
    RecencyList = None
if PURE_PYTHON:
    RecencyList = None

_NOT_QUEUED = -1
_NONE = np.zeros(0, dtype=np.int64)
#: Fewest candidates a rebuilt list holds (a rebuild costs one pass over the queued blocks, so
#: it holds a quarter of them when that is more: a store takes one block at a time, so a
#: longer list is rebuilt less often).
MIN_CANDIDATES = 4096
#: Candidates :meth:`RecencyOrder.oldest` reads one at a time before it scans arrays.
_PROBES = 4


class RecencyOrder:
    """Block ids of a pool of ``num_blocks`` blocks, least recently used first; starts empty."""

    __slots__ = ("_stamp", "_clock", "_len", "_candidates", "_stamps", "_pos", "_complete")

    def __init__(self, num_blocks: int):
        self._stamp = np.full(num_blocks, _NOT_QUEUED, dtype=np.int64)
        self._clock = 0
        self._len = 0
        self._candidates, self._stamps, self._pos = _NONE, _NONE, 0
        self._complete = False      # the list held every queued block when it was made

    def __len__(self) -> int:
        return self._len

    def __contains__(self, block_id: int) -> bool:
        return bool(self._stamp[block_id] != _NOT_QUEUED)

    def ids(self) -> np.ndarray:
        """The queued blocks, least recent first."""
        queued = np.flatnonzero(self._stamp != _NOT_QUEUED)
        return queued[np.argsort(self._stamp[queued])]

    # --- changes -------------------------------------------------------------------------

    def extend(self, block_ids: np.ndarray) -> None:
        """Add blocks (none queued) as the most recent, the last of them most of all."""
        if (self._stamp[block_ids] != _NOT_QUEUED).any():
            raise ValueError("a block to add is queued already")
        self._len += len(block_ids)
        self._restamp(block_ids)

    def move_many_to_end(self, block_ids: np.ndarray) -> None:
        """Make queued blocks (distinct) the most recent, in this order."""
        if (self._stamp[block_ids] == _NOT_QUEUED).any():
            raise ValueError("a block to move is not queued")
        self._restamp(block_ids)

    def append(self, block_id: int) -> None:
        """:meth:`extend` with one block (a scalar write: a decode step stores one)."""
        if self._stamp[block_id] != _NOT_QUEUED:
            raise ValueError("a block to add is queued already")
        self._len += 1
        self._stamp[block_id] = self._clock
        self._clock += 1

    def discard(self, block_id: int) -> None:
        """:meth:`remove` with one block."""
        if self._stamp[block_id] == _NOT_QUEUED:
            raise ValueError("a block to remove is not queued")
        self._stamp[block_id] = _NOT_QUEUED
        self._len -= 1

    def remove(self, block_ids: np.ndarray) -> None:
        """Drop queued blocks (distinct)."""
        if (self._stamp[block_ids] == _NOT_QUEUED).any():
            raise ValueError("a block to remove is not queued")
        self._stamp[block_ids] = _NOT_QUEUED
        self._len -= len(block_ids)

    def reserve(self, k: int) -> int:
        """Set aside ``k`` stamps, newer than any given so far and older than any given
        later; returns the first (see :meth:`raise_to`)."""
        self._clock += k
        return self._clock - k

    def stamps(self, block_ids: np.ndarray) -> np.ndarray:
        """The blocks' stamps (larger: more recent)."""
        return self._stamp[block_ids]

    def raise_to(self, block_ids: np.ndarray, stamps: np.ndarray) -> None:
        """Give queued blocks (distinct) the ``stamps`` (reserved ones) where those are newer
        than theirs. A block raised to below the candidate list's newest would belong inside
        the list: then it is rebuilt at the next request."""
        current = self._stamp[block_ids]
        if (current == _NOT_QUEUED).any():
            raise ValueError("a block to raise is not queued")
        raised = stamps > current
        if not raised.any():
            return
        block_ids, stamps = block_ids[raised], stamps[raised]
        self._stamp[block_ids] = stamps
        if len(self._stamps) and stamps.min() < self._stamps[-1]:
            self._candidates, self._stamps, self._pos = _NONE, _NONE, 0
            self._complete = False

    def _restamp(self, block_ids: np.ndarray) -> None:
        k = len(block_ids)
        self._stamp[block_ids] = np.arange(self._clock, self._clock + k)
        self._clock += k

    # --- the head ------------------------------------------------------------------------

    def first(self, n: int, eligible, partial: bool = False) -> np.ndarray | None:
        """The ``n`` least recent queued blocks for which ``eligible`` (a function of an id
        array returning a bool array) holds, least recent first, left queued; when fewer
        are, None (or those there are, with ``partial``)."""
        if n <= 0:
            return _NONE
        rebuilt, k = False, max(MIN_CANDIDATES, 4 * n, self._len // 4)
        while True:
            found = self._scan(n, eligible)
            if len(found) == n or (rebuilt and self._complete):
                return found if len(found) == n or partial else None
            self._rebuild(k)
            rebuilt, k = True, 2 * k

    def first_free(self, n: int, ref: np.ndarray, offered: np.ndarray | None = None
                   ) -> np.ndarray | None:
        """:meth:`first` with the CPU tier's test: ``ref[b] == 0`` and, with ``offered`` (a
        bool per block), not ``offered[b]``."""
        if offered is None:
            return self.first(n, lambda ids: ref[ids] == 0)
        return self.first(n, lambda ids: (ref[ids] == 0) & ~offered[ids])

    def oldest(self, eligible, eligible_one) -> int | None:
        """``first(1, eligible)`` as an int (None when no block is eligible), with
        ``eligible_one`` the same test of one id: the first few candidates are read one at a
        time (a store of one block usually finds its victim there), then :meth:`first`."""
        candidates, stamps, current = self._candidates, self._stamps, self._stamp
        start, at_head = self._pos, True
        for pos in range(start, min(start + _PROBES, len(candidates))):
            block_id = int(candidates[pos])
            if current[block_id] != stamps[pos]:
                if at_head:
                    self._pos = pos + 1         # (as _scan: invalid leaders dropped)
                continue
            if at_head:
                self._pos, at_head = pos, False     # (as _scan: invalid leaders dropped)
            if eligible_one(block_id):
                return block_id
        found = self.first(1, eligible)
        return None if found is None else int(found[0])

    def _scan(self, n: int, eligible) -> np.ndarray:
        """Up to ``n`` eligible valid candidates, in order, read a chunk at a time; the
        invalid candidates ahead of the first valid one are dropped for good."""
        candidates, stamps, current = self._candidates, self._stamps, self._stamp
        found, want, start, at_head = [], n, self._pos, True
        while want and start < len(candidates):
            end = min(len(candidates), start + max(4 * want, 256))
            ids = candidates[start:end]
            valid = current[ids] == stamps[start:end]
            if at_head:
                lead = int(valid.argmax()) if valid.any() else len(valid)
                self._pos, at_head = start + lead, lead == len(valid)
            part = ids[valid]
            part = part[eligible(part)][:want]
            found.append(part)
            want -= len(part)
            start = end
        if not found:
            return _NONE
        return found[0] if len(found) == 1 else np.concatenate(found)

    def _rebuild(self, k: int) -> None:
        """A new candidate list: the ``k`` least recent queued blocks (all, if fewer)."""
        queued = np.flatnonzero(self._stamp != _NOT_QUEUED)
        stamps = self._stamp[queued]
        self._complete = len(queued) <= k
        if not self._complete:
            oldest = np.argpartition(stamps, k - 1)[:k]
            queued, stamps = queued[oldest], stamps[oldest]
        order = np.argsort(stamps)
        self._candidates, self._stamps, self._pos = queued[order], stamps[order], 0


def recency_order(num_blocks: int):
    """A new, empty recency order of ``num_blocks`` blocks: a :class:`CompiledRecency` where
    ``cache/_recency.c`` was built, else a :class:`RecencyOrder`."""
    return RecencyOrder(num_blocks) if RecencyList is None else CompiledRecency(num_blocks)


class CompiledRecency:
    """:class:`RecencyOrder`'s operations of the CPU tier on the compiled linked list."""

    __slots__ = ("_list",)

    def __init__(self, num_blocks: int):
        self._list = RecencyList(num_blocks)

    def __len__(self) -> int:
        return len(self._list)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._list

    def ids(self) -> np.ndarray:
        return np.frombuffer(self._list.ids(), dtype=np.int64)

    def extend(self, block_ids: np.ndarray) -> None:
        self._list.extend(np.ascontiguousarray(block_ids, dtype=np.int64))

    def move_many_to_end(self, block_ids: np.ndarray) -> None:
        self._list.move_many_to_end(np.ascontiguousarray(block_ids, dtype=np.int64))

    def remove(self, block_ids: np.ndarray) -> None:
        self._list.remove(np.ascontiguousarray(block_ids, dtype=np.int64))

    def first_free(self, n: int, ref: np.ndarray, offered: np.ndarray | None = None
                   ) -> np.ndarray | None:
        found = self._list.first(n, ref, offered)
        return None if found is None else np.frombuffer(found, dtype=np.int64)
