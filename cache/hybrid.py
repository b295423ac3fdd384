"""Hybrid KV layout: short requests get a contiguous region, long ones are paged, in ONE pool.

A request whose final length (prompt + output, capped by ``max_model_len``) is below
``threshold`` tokens reserves one contiguous region of whole blocks at admission, sized by
``reserve`` as in :mod:`kvsim.cache.contiguous` with the threshold as the longest length
(``max`` reserves ``threshold`` slots) and rounded up to blocks; every other request is
paged by a :class:`~kvsim.cache.KVCacheManager` (vLLM's, LRU, with prefix caching).

How the memory is shared: the paged manager's :class:`~kvsim.cache.BlockPool` owns all
``num_blocks`` blocks, and block ``b`` is the slots ``[b * block_size, (b + 1) * block_size)``
of the linear space. A region is a run of consecutive block ids free in that pool (reference
count 0; cached-idle content is evicted), taken with :meth:`BlockPool.claim` and given back with
:meth:`BlockPool.release` (to the tail of the free queue, so the paged side reuses them last).
Placement is *highest fit*: the region ends at the top of the highest free run that holds it,
since the paged pool hands out low block ids first, which keeps the two kinds apart. Free
blocks outside every run long enough for the next short request are external fragmentation.
Short requests never share prefixes (their lookups find nothing); a short request at the head
of the queue that finds no run blocks admission (FCFS), even when paged blocks are free. There
is no compaction (paged blocks would have to move too).
"""

from __future__ import annotations

import numpy as np

from kvsim.cache.contiguous import Region, final_length, reservation_size
from kvsim.cache.kv_cache_manager import KVCacheManager
from kvsim.cache.prefix_hit import CacheHit


def free_runs(refs, min_len: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each run of zeros in ``refs`` at least ``min_len`` long.

    >>> free_runs([0, 0, 1, 0, 0, 0, 1, 0], 2)
    [(0, 2), (3, 3)]
    """
    free = np.concatenate([[0], np.asarray(refs) == 0, [0]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(free))
    starts, ends = edges[0::2], edges[1::2]
    keep = ends - starts >= min_len
    return list(zip(starts[keep].tolist(), (ends - starts)[keep].tolist()))


class HybridKVManager:
    """Contiguous regions for short requests, paged blocks for the others (module doc)."""

    enable_prefix_caching = True

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int,
                 threshold: int = 256, reserve: str = "max",
                 enable_prefix_caching: bool = True):
        reservation_size(reserve, 1, 1)      # validates the name
        self.paged = KVCacheManager(num_blocks, block_size, enable_prefix_caching,
                                    max_model_len)
        self.enable_prefix_caching = enable_prefix_caching
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.threshold = threshold
        self.reserve = reserve
        self.pool = self.paged.pool
        self.prefix_stats = self.paged.prefix_stats
        self._regions: dict[object, Region] = {}
        self._region_blocks = 0
        self._region_final = 0     # sum of the regions' final lengths (tokens)

    # --- which side ----------------------------------------------------------------------

    def is_short(self, tokens) -> bool:
        """True when ``tokens`` (a RequestState) ends below the threshold: a contiguous region."""
        return final_length(tokens, self.max_model_len) < self.threshold

    def _blocks_for(self, tokens) -> tuple[int, int]:
        final = final_length(tokens, self.max_model_len)
        size = reservation_size(self.reserve, final, min(self.threshold, self.max_model_len),
                                tokens.num_prompt_tokens)
        return -(-size // self.block_size), final

    # --- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def region(self, request_id) -> Region | None:
        """A short request's region (offset and size in slots)."""
        return self._regions.get(request_id)

    def block_ids_ref(self, request_id) -> list[int]:
        entry = self._regions.get(request_id)
        if entry is None:
            return self.paged.block_ids_ref(request_id)
        first = entry.offset // self.block_size
        return list(range(first, first + entry.size // self.block_size))

    def num_slots(self, request_id) -> int:
        entry = self._regions.get(request_id)
        return entry.num_slots if entry else self.paged.num_slots(request_id)

    def has_request(self, request_id) -> bool:
        return request_id in self._regions or self.paged.has_request(request_id)

    def lookup(self, tokens) -> CacheHit:
        return CacheHit() if self.is_short(tokens) else self.paged.lookup(tokens)

    def record_query(self, num_tokens: int, hit: CacheHit) -> None:
        self.paged.record_query(num_tokens, hit)

    def fragmentation(self, running, next_request=None) -> tuple[int, int, int, int]:
        """Slot counts ``(token states, reservation, internal, external)``: paged requests as
        :meth:`KVCacheManager.fragmentation`; a region holds ``num_computed_tokens`` tokens,
        reserves up to its final length, and the rest of its blocks is internal; external is
        the free slots outside runs long enough for ``next_request`` when it is short."""
        bs, regions = self.block_size, self._regions
        region_tokens = paged_internal = 0
        for s in running:
            if s.request_id in regions:
                region_tokens += s.num_computed_tokens
            else:
                paged_internal += (-s.num_computed_tokens) % bs
        finals = self._region_final
        paged_slots = (self.pool.num_used_blocks - self._region_blocks) * bs
        external = 0
        if next_request is not None and self.is_short(next_request):
            k = self._blocks_for(next_request)[0]
            usable = sum(n for _, n in free_runs(self.pool.ref_counts, k))
            external = (self.pool.num_free_blocks - usable) * bs
        return (paged_slots - paged_internal + region_tokens, finals - region_tokens,
                paged_internal + self._region_blocks * bs - finals, external)

    def begin_step(self) -> None:
        """A new engine step starts (nothing to do here)."""

    def take_transfers(self) -> tuple:
        return ()

    # --- allocation ----------------------------------------------------------------------

    def num_blocks_needed(self, request_id, num_new_tokens: int, hit=None) -> int:
        if request_id in self._regions:
            return 0
        return self.paged.num_blocks_needed(request_id, num_new_tokens, hit)

    def can_allocate(self, request_id, num_new_tokens: int, hit=None, reserve: int = 0) -> bool:
        """A region's growth always fits; otherwise the paged check (a new short request's
        region is checked by :meth:`allocate`, which knows the request)."""
        if request_id in self._regions:
            return True
        return self.paged.can_allocate(request_id, num_new_tokens, hit, reserve)

    def allocate(self, request_id, tokens, num_new_tokens: int, hit=None,
                 num_computed_tokens: int | None = None) -> list[int] | None:
        """Paged requests: :meth:`KVCacheManager.allocate`. Short ones: reserve the region on
        the first call (None, nothing changed, when no free run holds it), then count tokens;
        returns the region's blocks when it is new, else ``[]``."""
        entry = self._regions.get(request_id)
        new: list[int] = []
        if entry is None:
            if self.paged.has_request(request_id) or not self.is_short(tokens):
                return self.paged.allocate(request_id, tokens, num_new_tokens, hit,
                                           num_computed_tokens)
            entry, new = self._reserve(request_id, tokens)
            if entry is None:
                return None
        base = entry.num_slots if num_computed_tokens is None else num_computed_tokens
        entry.num_slots = min(base + num_new_tokens, entry.size)
        return new

    def free(self, request_id) -> None:
        entry = self._regions.pop(request_id, None)
        if entry is None:
            self.paged.free(request_id)
            return
        first, n = entry.offset // self.block_size, entry.size // self.block_size
        self.pool.release(range(first, first + n))
        self._region_blocks -= n
        self._region_final -= entry.final

    def _reserve(self, request_id, tokens):
        k, final = self._blocks_for(tokens)
        runs = free_runs(self.pool.ref_counts, k)
        if not runs:
            return None, []
        start, length = runs[-1]
        blocks = list(range(start + length - k, start + length))
        self.pool.claim(blocks)
        self._region_blocks += k
        size = k * self.block_size
        entry = self._regions[request_id] = Region(blocks[0] * self.block_size, size,
                                                   min(final, size))
        self._region_final += entry.final
        return entry, blocks
