"""First-fit allocation of contiguous regions over a linear space of token slots.

The contiguous layouts (:mod:`kvsim.cache.contiguous`) give each request one region
``[offset, offset + size)`` of the slot space ``[0, capacity)``. Free space is kept as a list of
*gaps* sorted by start; neighbouring gaps are always merged (coalescing), so no two gaps touch.

Placement is **first-fit**: a region goes at the start of the lowest gap long enough for it.
First-fit is what a simple contiguous allocator does; it keeps low addresses dense and leaves
the holes that finished requests open between live regions, which is the external
fragmentation the contiguous layouts are meant to show.
"""

from __future__ import annotations

from bisect import bisect_left


class SlotAllocator:
    """Gaps of a slot space ``[0, capacity)``; regions are named only by (offset, size).

    >>> a = SlotAllocator(100)
    >>> a.allocate(30), a.allocate(20), a.allocate(10)
    (0, 30, 50)
    >>> a.free(30, 20); a.gaps()
    [(30, 20), (60, 40)]
    >>> a.allocate(25)      # first fit: the gap at 30 is too short, so 60
    60
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._starts: list[int] = [0]
        self._lens: list[int] = [capacity]
        self.num_free = capacity

    # --- queries -------------------------------------------------------------------------

    def gaps(self) -> list[tuple[int, int]]:
        """Free gaps as ``(start, length)``, by start."""
        return list(zip(self._starts, self._lens))

    @property
    def largest_gap(self) -> int:
        return max(self._lens, default=0)

    def fits(self, size: int) -> bool:
        """True when some gap holds ``size`` slots."""
        return any(n >= size for n in self._lens)

    def unusable(self, size: int) -> int:
        """Free slots lying in gaps shorter than ``size`` (they cannot serve that request)."""
        return sum(n for n in self._lens if n < size)

    # --- actions -------------------------------------------------------------------------

    def allocate(self, size: int) -> int | None:
        """Offset of a new ``size``-slot region at the start of the first gap that holds it,
        or None (nothing changed) when no gap does."""
        if size < 1:
            raise ValueError(f"size must be positive, got {size}")
        for i, n in enumerate(self._lens):
            if n >= size:
                start = self._starts[i]
                if n == size:
                    del self._starts[i], self._lens[i]
                else:
                    self._starts[i] += size
                    self._lens[i] -= size
                self.num_free -= size
                return start
        return None

    def free(self, offset: int, size: int) -> None:
        """Return ``[offset, offset + size)`` to the free space, merging it with the gaps it
        touches. Raises ValueError if any of it is already free or outside the space."""
        end = offset + size
        if size < 1 or offset < 0 or end > self.capacity:
            raise ValueError(f"region [{offset}, {end}) is not inside [0, {self.capacity})")
        i = bisect_left(self._starts, offset)
        prev_end = self._starts[i - 1] + self._lens[i - 1] if i else -1
        if prev_end > offset or (i < len(self._starts) and self._starts[i] < end):
            raise ValueError(f"region [{offset}, {end}) overlaps free space")
        if prev_end == offset:              # merge with the gap before
            i -= 1
            self._lens[i] += size
        else:
            self._starts.insert(i, offset)
            self._lens.insert(i, size)
        if i + 1 < len(self._starts) and self._starts[i + 1] == end:   # and the one after
            self._lens[i] += self._lens.pop(i + 1)
            del self._starts[i + 1]
        self.num_free += size

    def compact(self, regions: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Slide the live ``regions`` (``(offset, size)``, all of them) to the start of the
        space, keeping their order; return their new offsets (in the order given). After it,
        one gap remains: ``[used, capacity)``."""
        order = sorted(range(len(regions)), key=lambda k: regions[k][0])
        new = [0] * len(regions)
        at = 0
        for k in order:
            new[k] = at
            at += regions[k][1]
        if at + self.num_free != self.capacity:
            raise ValueError("the regions given are not exactly the allocated space")
        self._starts, self._lens = ([at], [self.num_free]) if self.num_free else ([], [])
        return new
