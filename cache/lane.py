"""A lane of the lane pools: free cached blocks in release order, each with its release clock.

A lane is a FIFO: blocks join at the tail as they are released and leave at the head as they
are evicted, a run of hundreds at a time when a long prompt needs room. An ``OrderedDict``
does that at the price of a linked-list node allocated, and later unlinked, per block, and
``OrderedDict.update`` takes the generic mapping path. :class:`Lane` keeps the order in two
flat lists (block ids, release clocks) consumed from a head index, so a run is a slice, and
membership in a map (``clock_of``: queued block -> its clock; :mod:`kvsim.cache.intmap`'s),
updated in C.

A block leaves the middle of a lane when a prefix hit takes it (or lookahead protects it); its
entry in the lists is then dropped lazily: clocks are unique per release, so an entry whose
clock is not its block's in ``clock_of`` is stale and skipped when the head reaches it. Stale
entries are counted and the lists rebuilt when they outnumber the live ones, the consumed front
is cut off when it is most of the lists and the tail grows, and a lane left empty forgets its
entries: the lists hold a small multiple of the lane's blocks plus a few thousand entries.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from operator import itemgetter
from typing import Iterator, Sequence

from kvsim.cache.bulk import delete_all
from kvsim.cache.intmap import COMPILED, hash_map

__all__ = ["Lane"]

_MIN_COMPACT = 4096         # fewest dead entries worth a rebuild or a cut of the front
_DEEP = b"\x02"             # the depth byte of a block past its chain's second block


class Lane:
    """Free cached blocks with their release clocks (increasing from head to tail), head
    first; an ``OrderedDict`` block -> clock in the operations the lane pools use."""

    __slots__ = ("_ids", "_clocks", "_start", "clock_of", "_num_stale")

    def __init__(self):
        self._ids: list[int] = []
        self._clocks: list[int] = []
        self._start = 0             # entries before it are consumed
        self.clock_of: dict[int, int] = hash_map()   # queued block -> its live entry's clock
        self._num_stale = 0         # dropped entries at or after ``_start``

    # --- queries -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.clock_of)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.clock_of

    def __getitem__(self, block_id: int) -> int:
        return self.clock_of[block_id]

    def __iter__(self) -> Iterator[int]:
        return (block_id for block_id, _ in self.items())

    def items(self) -> Iterator[tuple[int, int]]:
        """``(block, clock)`` of the queued blocks, head first."""
        clock_of = self.clock_of
        for block_id, clock in zip(self._ids[self._start:], self._clocks[self._start:]):
            if clock_of.get(block_id) == clock:
                yield block_id, clock

    def head(self) -> tuple[int, int] | None:
        """``(block, clock)`` at the head, left queued; None when the lane is empty."""
        if not self.clock_of:
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
        if COMPILED:
            self.clock_of.set_many(block_ids, clocks)
        else:
            self.clock_of.update(zip(block_ids, clocks))

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

    # --- pops ----------------------------------------------------------------------------

    def popleft(self) -> tuple[int, int] | None:
        """Take the head: ``(block, clock)``, or None when the lane is empty."""
        if not self.clock_of:
            return None
        self._skip_stale()
        start = self._start
        block_id = self._ids[start]
        self._start = start + 1
        del self.clock_of[block_id]
        clock = self._clocks[start]
        if not self.clock_of:
            self._forget()
        return block_id, clock

    def pop(self, block_id: int, default=None):
        """Take ``block_id`` wherever it is: its clock, or ``default`` if it is not here."""
        clock = self.clock_of.pop(block_id, None)
        if clock is None:
            return default
        self._num_stale += 1
        if self._num_stale > max(len(self.clock_of), _MIN_COMPACT):
            self._rebuild()
        if not self.clock_of:
            self._forget()
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
        delete_all(self.clock_of, run)
        self._start = end
        if not self.clock_of:
            self._forget()
        return run

    def clear(self) -> None:
        self.clock_of.clear()
        self._forget()

    # --- internals -----------------------------------------------------------------------

    def _take_run_skipping(self, n: int, bound: int | None, inclusive: bool,
                           depth) -> list[int]:
        """:meth:`take_run` entry by entry, skipping dropped entries."""
        ids, clocks, clock_of, run = self._ids, self._clocks, self.clock_of, []
        i, end = self._start, len(ids)
        while i < end and len(run) < n:
            block_id, clock = ids[i], clocks[i]
            if clock_of.get(block_id) != clock:
                self._num_stale -= 1
            elif depth[block_id] != 2 or (bound is not None and (
                    clock > bound or (clock == bound and not inclusive))):
                break
            else:
                del clock_of[block_id]
                run.append(block_id)
            i += 1
        self._start = i
        if not self.clock_of:
            self._forget()
        return run

    def _skip_stale(self) -> None:
        """Move the head past dropped entries (the lane is not empty)."""
        ids, clocks, clock_of, start = self._ids, self._clocks, self.clock_of, self._start
        while clock_of.get(ids[start]) != clocks[start]:
            start += 1
            self._num_stale -= 1
        self._start = start

    def _forget(self) -> None:
        """Drop every entry (no block is queued: a lane left empty keeps nothing)."""
        self._ids, self._clocks = [], []
        self._start = self._num_stale = 0

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
