"""The LRU pool's free queue: block ids in reuse order, pushed and popped a run at a time.

vLLM keeps its free blocks in a doubly linked list; an ``OrderedDict`` is the same in Python,
at the price of a linked-list node allocated and freed per block. A long prompt takes and gives
back hundreds of blocks at once, so :class:`FreeQueue` keeps *segments* instead (one array per
push, consumed from the front) and removes a block from the middle lazily: each queued block
carries the serial number of its live entry, and an entry whose serial is no longer its
block's is stale and skipped when the head reaches it. Stale entries are counted, in all and
per segment (a pop reads a segment without stale entries as it is); when they outnumber the
live ones the queue is rebuilt, so memory stays within about twice the pool.

The order is exactly the linked list's: :meth:`popleft` takes from the head, :meth:`extend`
pushes at the tail, :meth:`extendleft` at the head, :meth:`remove` drops blocks wherever they
are. Block ids go in and come out as ``int64`` arrays.
"""

from __future__ import annotations

from collections import deque

import numpy as np

_NOT_QUEUED = -1
_NONE = np.zeros(0, dtype=np.int64)
_FIRST = np.zeros(1, dtype=np.int64)     # (a segment without stale entries: its first is live)
_WINDOW = 256           # fewest entries a pop reads past stale ones at a time


class FreeQueue:
    """Free block ids of a pool of ``num_blocks`` blocks, head (next reused) first; starts
    as ``0..num_blocks-1`` in ascending order, or empty (``filled=False``: a recency list
    that blocks join as they get content, as the host tier's LRU uses it)."""

    __slots__ = ("_segments", "_serial", "_next", "_len", "_num_stale", "_owner", "_by_s0")

    def __init__(self, num_blocks: int, filled: bool = True):
        # [ids, serial of ids[0], next index, stale entries from there on]
        self._segments: deque[list] = deque()
        self._serial = np.full(num_blocks, _NOT_QUEUED, dtype=np.int64)
        self._owner = np.zeros(num_blocks, dtype=np.int64)  # s0 of its live entry's segment
        self._by_s0: dict[int, list] = {}      # the segments not yet consumed, by s0
        self._next = 0
        self._len = 0
        self._num_stale = 0
        if filled:
            self.extend(np.arange(num_blocks, dtype=np.int64))

    def __len__(self) -> int:
        return self._len

    def __iter__(self):
        return iter(self.ids().tolist())

    def __contains__(self, block_id: int) -> bool:
        return bool(self._serial[block_id] != _NOT_QUEUED)

    def ids(self) -> np.ndarray:
        """The queued blocks, head first."""
        parts = [self._live(ids, s0, start, stale) for ids, s0, start, stale in self._segments]
        return np.concatenate(parts) if parts else _NONE

    def _live(self, ids: np.ndarray, s0: int, start: int, stale: int) -> np.ndarray:
        rest = ids[start:]
        if not stale:
            return rest
        return rest[self._serial[rest] == np.arange(s0 + start, s0 + len(ids))]

    # --- pushes --------------------------------------------------------------------------

    def extend(self, block_ids: np.ndarray) -> None:
        """Push ``block_ids`` at the tail, in this order (none may be queued; the array is
        kept, so the caller must not change it)."""
        if len(block_ids):
            self._segments.append(self._stamp(block_ids))

    def extendleft(self, block_ids: np.ndarray) -> None:
        """Push ``block_ids`` at the head, the first of them becoming the head."""
        if len(block_ids):
            self._segments.appendleft(self._stamp(block_ids))

    def _stamp(self, block_ids: np.ndarray) -> list:
        s0, k = self._next, len(block_ids)
        self._serial[block_ids] = np.arange(s0, s0 + k)
        self._owner[block_ids] = s0
        self._next = s0 + k
        self._len += k
        segment = self._by_s0[s0] = [block_ids, s0, 0, 0]
        return segment

    # --- pops and removals -----------------------------------------------------------------

    def popleft(self, n: int) -> np.ndarray:
        """Take the ``n`` blocks at the head (``n`` <= ``len(self)``)."""
        if n > self._len:
            raise ValueError(f"cannot take {n} blocks: only {self._len} are queued")
        if n <= 0:
            return _NONE
        taken = self._take_from_first(n)
        if len(taken) < n:          # (the first segment ran out: on to the next ones)
            parts, want = [taken], n - len(taken)
            while want:
                part = self._take_from_first(want)
                parts.append(part)
                want -= len(part)
            taken = np.concatenate(parts)
        self._serial[taken] = _NOT_QUEUED
        self._len -= n
        return taken

    def _take_from_first(self, want: int) -> np.ndarray:
        """Up to ``want`` live blocks from the first segment, consumed from it. With stale
        entries, a window of the segment is read (the whole first segment can be the pool:
        a one-block pop must not read all of it)."""
        segment = self._segments[0]
        ids, s0, start, stale = segment
        if not stale:
            end = min(start + want, len(ids))
            part = ids[start:end]
        else:
            end = min(len(ids), start + max(2 * want, _WINDOW))
            live = np.flatnonzero(self._serial[ids[start:end]] == np.arange(s0 + start, s0 + end))
            if len(live) >= want:           # consumed up to the last live entry taken
                live = live[:want]
                end = start + int(live[-1]) + 1
            part = ids[start + live]
            self._skipped(segment, (end - start) - len(part))
        if end >= len(ids):
            self._pop_segment()
        else:
            segment[2] = end
        return part

    def _skipped(self, segment: list, num_stale: int) -> None:
        """``num_stale`` stale entries of ``segment`` were passed."""
        segment[3] -= num_stale
        self._num_stale -= num_stale

    def _pop_segment(self) -> None:
        del self._by_s0[self._segments.popleft()[1]]

    def queued(self, block_ids: np.ndarray) -> np.ndarray:
        """For each of ``block_ids`` (valid ids), whether it is queued."""
        return self._serial[block_ids] != _NOT_QUEUED

    def first(self, n: int, eligible, partial: bool = False) -> np.ndarray | None:
        """The first ``n`` queued blocks, head first, for which ``eligible`` (a function of
        an id array returning a bool array) holds, left queued; when fewer are, None (or
        those there are, with ``partial``). Stale entries at the head are dropped on the way,
        so repeated scans do not see them again."""
        if n <= 0:
            return _NONE
        self._drop_stale_head()
        found, want = [], n
        for ids, s0, start, stale in self._segments:
            while start < len(ids):
                end = min(len(ids), start + max(4 * want, 256))
                part = self._live(ids[:end], s0, start, stale)
                part = part[eligible(part)][:want]
                found.append(part)
                want -= len(part)
                if not want:
                    return found[0] if len(found) == 1 else np.concatenate(found)
                start = end
        if partial:
            return np.concatenate(found) if found else _NONE
        return None

    def _drop_stale_head(self) -> None:
        serial = self._serial
        while self._num_stale and self._segments:
            segment = self._segments[0]
            ids, s0, start, stale = segment
            end = min(len(ids), start + 1024)
            live = (np.flatnonzero(serial[ids[start:end]] == np.arange(s0 + start, s0 + end))
                    if stale else _FIRST)
            skip = int(live[0]) if len(live) else end - start
            self._skipped(segment, skip)
            if start + skip < len(ids):
                segment[2] = start + skip
                if len(live):
                    return
            else:
                self._pop_segment()

    def move_many_to_end(self, block_ids: np.ndarray) -> None:
        """Move queued blocks (distinct) to the tail, in this order."""
        self.remove(block_ids)
        self.extend(block_ids)

    def remove(self, block_ids: np.ndarray) -> None:
        """Drop queued blocks (distinct ids) from wherever they are: their entries go stale."""
        serial = self._serial
        if np.count_nonzero(serial[block_ids] == _NOT_QUEUED):
            raise ValueError("a block to remove is not in the free queue")
        serial[block_ids] = _NOT_QUEUED
        self._len -= len(block_ids)
        self._num_stale += len(block_ids)
        self._count_stale(self._owner[block_ids])
        if self._num_stale > self._len + 1024:
            self._rebuild()

    def _count_stale(self, owners: np.ndarray) -> None:
        """One more stale entry in the segment ``s0`` for each ``s0`` of ``owners``."""
        if not len(owners):
            return
        if len(owners) == 1 or not np.count_nonzero(owners != owners[0]):
            self._by_s0[int(owners[0])][3] += len(owners)
            return
        segments, counts = np.unique(owners, return_counts=True)
        for s0, count in zip(segments.tolist(), counts.tolist()):
            self._by_s0[s0][3] += count

    def move_to_end(self, block_id: int) -> None:
        """Move a queued block to the tail."""
        self.move_many_to_end(np.array([block_id], dtype=np.int64))

    def _rebuild(self) -> None:
        live = self.ids()
        self._segments.clear()
        self._by_s0.clear()
        self._serial[:] = _NOT_QUEUED
        self._len = self._num_stale = 0
        self.extend(live)
