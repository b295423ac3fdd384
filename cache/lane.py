"""A lane of the lane pools: free cached blocks in release order, each with its release clock.

A lane is a FIFO: blocks join at the tail as they are released and leave at the head as they
are evicted, a run of hundreds at a time when a long prompt needs room. An ``OrderedDict``
does that at the price of a linked-list node allocated, and later unlinked, per block, and its
nodes end up scattered over megabytes. :class:`Lane` keeps two flat lists instead (block ids,
release clocks) consumed from a head index, so a run is a slice.

A block leaves the middle of a lane when a prefix hit takes it (or lookahead protects it); it
is then dropped lazily. ``clock_of[b]`` holds the clock of ``b``'s live entry (-1 when ``b`` is
not queued here); clocks are unique per release, so an entry whose clock is not its block's is
stale and skipped when the head reaches it. Stale entries are counted; when they outnumber the
live ones the lists are rebuilt, and the consumed front is cut off as the tail grows, so memory
stays within about twice the lane's blocks.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from operator import itemgetter
from typing import Iterator, Sequence

from kvsim.cache.bulk import set_all, set_each

__all__ = ["Lane"]

_NOT_QUEUED = -1
_MIN_COMPACT = 4096         # fewest dead entries worth a rebuild or a cut of the front
_DEEP = b"\x02"             # the depth byte of a block past its chain's second block


class Lane:
    """Free cached blocks of a pool of ``num_blocks`` blocks with their release clocks
    (increasing from head to tail), head first; an ``OrderedDict`` block -> clock in the
    operations the lane pools use."""

    __slots__ = ("_ids", "_clocks", "_start", "clock_of", "_len", "_num_stale")

    def __init__(self, num_blocks: int):
        self._ids: list[int] = []
        self._clocks: list[int] = []
        self._start = 0             # entries before it are consumed
        self.clock_of = [_NOT_QUEUED] * num_blocks
        self._len = 0
        self._num_stale = 0         # dropped entries at or after ``_start``

    # --- queries -------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._len

    def __contains__(self, block_id: int) -> bool:
        return self.clock_of[block_id] != _NOT_QUEUED

    def __getitem__(self, block_id: int) -> int:
        clock = self.clock_of[block_id]
        if clock == _NOT_QUEUED:
            raise KeyError(block_id)
        return clock

    def __iter__(self) -> Iterator[int]:
        return (block_id for block_id, _ in self.items())

    def items(self) -> Iterator[tuple[int, int]]:
        """``(block, clock)`` of the queued blocks, head first."""
        clock_of = self.clock_of
        for block_id, clock in zip(self._ids[self._start:], self._clocks[self._start:]):
            if clock_of[block_id] == clock:
                yield block_id, clock

    def head(self) -> tuple[int, int] | None:
        """``(block, clock)`` at the head, left queued; None when the lane is empty."""
        if not self._len:
            return None
        self._skip_stale()
        return self._ids[self._start], self._clocks[self._start]

    # --- pushes --------------------------------------------------------------------------

    def extend(self, block_ids: list[int], clocks: Sequence[int]) -> None:
        """Queue ``block_ids`` released at ``clocks`` (increasing, after every queued one) at
        the tail, in this order."""
        self._cut_front()
        self._ids += block_ids
        self._clocks += clocks
        set_each(self.clock_of, block_ids, clocks)
        self._len += len(block_ids)

    def appendleft(self, block_id: int, clock: int) -> None:
        """Queue ``block_id`` at the head (its clock before every queued one)."""
        if self._start:
            self._start -= 1
            self._ids[self._start] = block_id
            self._clocks[self._start] = clock
        else:
            self._ids.insert(0, block_id)
            self._clocks.insert(0, clock)
        self.clock_of[block_id] = clock
        self._len += 1

    # --- pops ----------------------------------------------------------------------------

    def popleft(self) -> tuple[int, int] | None:
        """Take the head: ``(block, clock)``, or None when the lane is empty."""
        if not self._len:
            return None
        self._skip_stale()
        start = self._start
        block_id = self._ids[start]
        self._start = start + 1
        self._len -= 1
        self.clock_of[block_id] = _NOT_QUEUED
        return block_id, self._clocks[start]

    def pop(self, block_id: int, default=None):
        """Take ``block_id`` wherever it is: its clock, or ``default`` if it is not here."""
        clock = self.clock_of[block_id]
        if clock == _NOT_QUEUED:
            return default
        self.clock_of[block_id] = _NOT_QUEUED
        self._len -= 1
        self._num_stale += 1
        if self._num_stale > max(self._len, _MIN_COMPACT):
            self._rebuild()
        return clock

    def take_run(self, n: int, bound: int | None, inclusive: bool, depth) -> list[int]:
        """Take up to ``n`` blocks from the head while each is past its chain's second block
        (``depth[b] == 2``) and its clock is below ``bound`` (at most ``bound`` if
        ``inclusive``; no limit when None); they are returned in order."""
        if self._num_stale:
            return self._take_run_skipping(n, bound, inclusive, depth)
        start, ids = self._start, self._ids
        end = min(start + n, len(ids))
        if bound is not None:
            end = (bisect_right if inclusive else bisect_left)(self._clocks, bound, start, end)
        if end - start > 1:
            depths = bytes(itemgetter(*ids[start:end])(depth))
            end = start + len(depths) - len(depths.lstrip(_DEEP))   # (up to the first shallow)
        elif end > start and depth[ids[start]] != 2:
            end = start
        run = ids[start:end]
        set_all(self.clock_of, run, _NOT_QUEUED)
        self._start = end
        self._len -= len(run)
        return run

    def clear(self) -> None:
        set_all(self.clock_of, list(self), _NOT_QUEUED)
        self._ids, self._clocks = [], []
        self._start = self._len = self._num_stale = 0

    # --- internals -----------------------------------------------------------------------

    def _take_run_skipping(self, n: int, bound: int | None, inclusive: bool,
                           depth) -> list[int]:
        """:meth:`take_run` entry by entry, skipping dropped entries."""
        ids, clocks, clock_of, run = self._ids, self._clocks, self.clock_of, []
        i, end = self._start, len(ids)
        while i < end and len(run) < n:
            block_id, clock = ids[i], clocks[i]
            if clock_of[block_id] != clock:
                self._num_stale -= 1
            elif depth[block_id] != 2 or (bound is not None and (
                    clock > bound or (clock == bound and not inclusive))):
                break
            else:
                clock_of[block_id] = _NOT_QUEUED
                run.append(block_id)
            i += 1
        self._start = i
        self._len -= len(run)
        return run

    def _skip_stale(self) -> None:
        """Move the head past dropped entries (the lane is not empty)."""
        ids, clocks, clock_of, start = self._ids, self._clocks, self.clock_of, self._start
        while clock_of[ids[start]] != clocks[start]:
            start += 1
            self._num_stale -= 1
        self._start = start

    def _cut_front(self) -> None:
        """Drop the consumed entries once they are most of the lists."""
        if self._start > _MIN_COMPACT and 2 * self._start > len(self._ids):
            del self._ids[:self._start], self._clocks[:self._start]
            self._start = 0

    def _rebuild(self) -> None:
        """Keep only the live entries."""
        live = list(self.items())
        self._ids = [block_id for block_id, _ in live]
        self._clocks = [clock for _, clock in live]
        self._start = self._num_stale = 0
