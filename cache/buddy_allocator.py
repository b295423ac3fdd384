"""Binary buddy allocation of contiguous regions over a linear space of token slots.

The vLLM paper's Orca baselines (Kwon et al., SOSP'23, §6.1: "We assume Orca uses the buddy
allocation algorithm to determine the memory address to store KV cache") place each request's
reservation with a buddy allocator. A region of ``size`` slots gets a *block* of the next power
of two; blocks are split in halves (buddies) on demand and merged again when both halves are
free. The slack between the region and its block is lost to every other request, and a free
block serves only requests whose power of two fits it.

The space ``[0, capacity)`` need not be a power of two: it is cut, largest first, into the
power-of-two blocks of its binary representation (15,712 = 8,192 + 4,096 + 2,048 + 1,024 + 256 +
64 + 32), each aligned to its size, so buddies (``offset ^ size``) never straddle two of them.

Placement: the smallest free block that holds the region, lowest offset among equals; it is
halved down to the region's power of two, keeping the lower half. Same interface as
:class:`~kvsim.cache.slot_allocator.SlotAllocator` (no compaction).
"""

from __future__ import annotations


def block_size_for(size: int) -> int:
    """The power of two a ``size``-slot region occupies.

    >>> [block_size_for(n) for n in (1, 2, 3, 300, 512, 513)]
    [1, 2, 4, 512, 512, 1024]
    """
    if size < 1:
        raise ValueError(f"size must be positive, got {size}")
    return 1 << (size - 1).bit_length()


class BuddyAllocator:
    """Free blocks per power of two; regions are named by (offset, size).

    >>> a = BuddyAllocator(16)
    >>> a.allocate(3), a.allocate(5), a.allocate(2)
    (0, 8, 4)
    >>> a.gaps()
    [(6, 2)]
    >>> a.free(0, 3); a.gaps()
    [(0, 4), (6, 2)]
    >>> a.free(4, 2); a.gaps()          # 4..6 merges with 6..8, then with 0..4
    [(0, 8)]
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._free: dict[int, set[int]] = {}     # block size -> offsets of free blocks
        self._top: dict[int, int] = {}           # offset of each top-level block -> its size
        at = 0
        for bit in reversed(range(capacity.bit_length())):
            if capacity >> bit & 1:
                self._top[at] = 1 << bit
                self._free.setdefault(1 << bit, set()).add(at)
                at += 1 << bit
        self.num_free = capacity

    # --- queries -------------------------------------------------------------------------

    def gaps(self) -> list[tuple[int, int]]:
        """Free blocks as ``(start, length)``, by start (buddies are never both free)."""
        return sorted((o, n) for n, offs in self._free.items() for o in offs)

    @property
    def largest_gap(self) -> int:
        return max((n for n, offs in self._free.items() if offs), default=0)

    def fits(self, size: int) -> bool:
        """True when some free block holds ``size`` slots' power of two."""
        return self.largest_gap >= block_size_for(size)

    def unusable(self, size: int) -> int:
        """Free slots in blocks too small for a ``size``-slot region."""
        need = block_size_for(size)
        return sum(n * len(offs) for n, offs in self._free.items() if n < need)

    # --- actions -------------------------------------------------------------------------

    def allocate(self, size: int) -> int | None:
        """Offset of a new region of ``size`` slots (its block: :func:`block_size_for`), or
        None (nothing changed) when no free block is large enough."""
        need = block_size_for(size)
        fitting = [n for n, offs in self._free.items() if offs and n >= need]
        if not fitting:
            return None
        n = min(fitting)
        offset = min(self._free[n])
        self._free[n].discard(offset)
        while n > need:                       # split, keep the lower half
            n //= 2
            self._free.setdefault(n, set()).add(offset + n)
        self.num_free -= need
        return offset

    def free(self, offset: int, size: int) -> None:
        """Return the block of the region ``(offset, size)``, merging it with its free buddy
        as long as there is one. Raises ValueError for a block outside the space or free."""
        n = block_size_for(size)
        if offset < 0 or offset + n > self.capacity or offset % n:
            raise ValueError(f"no block of {n} slots at {offset} in [0, {self.capacity})")
        if any(self._covers(offset, m) for m in self._free):
            raise ValueError(f"block [{offset}, {offset + n}) overlaps free space")
        self.num_free += n
        while self._top.get(offset) != n and offset ^ n in self._free.get(n, ()):
            self._free[n].discard(offset ^ n)
            offset, n = min(offset, offset ^ n), 2 * n
        self._free.setdefault(n, set()).add(offset)

    def _covers(self, offset: int, n: int) -> bool:
        """True when a free block of size ``n`` contains slot ``offset``."""
        return (offset - offset % n) in self._free[n]
