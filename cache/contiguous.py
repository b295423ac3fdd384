"""Contiguous KV layouts: one reserved region of token slots per request, as the Orca baselines
of the vLLM paper (§6), with optional compaction.

The GPU pool of ``num_blocks * block_size`` slots is one linear slot space managed by
``allocator``: ``first-fit`` (:class:`~kvsim.cache.slot_allocator.SlotAllocator`, the default)
or ``buddy`` (:class:`~kvsim.cache.buddy_allocator.BuddyAllocator`, what the vLLM paper's Orca
re-implementation used: each region occupies a block of the next power of two slots, and the
slack between region and block is counted as external fragmentation, as the paper's Fig. 2
does). At admission a request reserves one region, sized by ``reserve``:

- ``max``: ``max_model_len`` slots (Orca (Max));
- ``pow2``: the next power of two of its final length (prompt + output, capped by
  ``max_model_len``) (Orca (Pow2));
- ``oracle``: exactly its final length (Orca (Oracle));
- ``pow2-output``: its prompt plus the next power of two of its output (capped by
  ``max_model_len``): the vLLM paper's own definition of Orca (Pow2), "over-reserves the space
  for outputs by at most 2x" (an output of 25 tokens reserves 32 slots).

Decode growth never fails inside the reservation, so requests are never preempted; admission
fails (``allocate`` returns None) when no gap fits. There is no prefix sharing: ``lookup``
finds nothing. :class:`ContiguousKVManager` has the methods the
:class:`~kvsim.cache.scheduler.Scheduler` calls on a :class:`~kvsim.cache.KVCacheManager`;
its ``block_size`` (allocation granularity seen by the scheduler) is 1 slot, so the scheduler
reports every step's growth and the token counts here are exact.

Compaction (``compaction_threshold`` F): when a new region does not fit, the free slots that
cannot serve it exceed F of the pool and there are enough free slots in all, every live region
is slid to the start of the space (order kept) and the request placed after them. The copies are
``COMPACT`` :class:`~kvsim.cache.step_plan.BlockTransfer` entries, fetched by the scheduler
with :meth:`ContiguousKVManager.take_transfers`: only the slots holding tokens are copied, in
chunks of ``block_size`` slots, each pair ``(source slot offset, destination slot offset)`` of a
chunk (the last chunk of a region may be partial; it is charged as a whole block).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.cache.buddy_allocator import BuddyAllocator, block_size_for
from kvsim.cache.prefix_hit import CacheHit, PrefixCacheStats
from kvsim.cache.slot_allocator import SlotAllocator
from kvsim.cache.step_plan import COMPACT, BlockTransfer

RESERVE_POLICIES = ("max", "pow2", "oracle", "pow2-output")
ALLOCATORS = ("first-fit", "buddy")


@dataclass(slots=True)
class Region:
    """One request's reservation: ``size`` slots at ``offset`` (occupying ``block >= size``
    slots of the pool); it will hold ``final`` tokens at most (``final <= size``) and holds
    ``num_slots`` now."""

    offset: int
    size: int
    final: int
    num_slots: int = 0
    block: int = 0


@dataclass(slots=True)
class CompactionStats:
    """Compactions done, what they moved, and the external fragmentation (share of the pool,
    for the request that triggered it) just before and just after each, summed."""

    num_compactions: int = 0
    moved_slots: int = 0
    moved_blocks: int = 0
    external_before_sum: float = 0.0
    external_after_sum: float = 0.0


class _SlotPool:
    """The ``pool`` counters a replica logs, in blocks of the engine block size (reserved slots
    / block size, so possibly fractional)."""

    def __init__(self, manager: "ContiguousKVManager"):
        self._m = manager
        self.num_blocks = manager.num_pool_slots // manager.engine_block_size
        self.num_cached_free_blocks = 0

    @property
    def num_used_blocks(self) -> float:
        return self._m.num_reserved_slots / self._m.engine_block_size

    @property
    def num_free_blocks(self) -> float:
        return self.num_blocks - self.num_used_blocks


def final_length(tokens, max_model_len: int) -> int:
    """Tokens ``tokens`` (a :class:`~kvsim.cache.request_state.RequestState`) will have at the end."""
    return min(tokens.num_prompt_tokens + tokens.max_tokens, max_model_len)


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def reservation_size(reserve: str, final: int, max_model_len: int, prompt: int = 0) -> int:
    """Slots a request of ``final`` tokens (``prompt`` of them prompt) reserves under ``reserve``.

    >>> [reservation_size(r, 300, 2048, prompt=100) for r in RESERVE_POLICIES]
    [2048, 512, 300, 356]
    """
    if reserve == "max":
        return max_model_len
    if reserve == "pow2":
        return min(next_pow2(final), max_model_len)
    if reserve == "oracle":
        return final
    if reserve == "pow2-output":
        return min(prompt + next_pow2(final - prompt), max_model_len)
    raise ValueError(f"reserve must be one of {', '.join(RESERVE_POLICIES)}, got {reserve!r}")


class ContiguousKVManager:
    """Per-request contiguous reservations over a linear slot space (see the module doc)."""

    enable_prefix_caching = False
    block_size = 1      # granularity the scheduler sees: it reports every token

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int,
                 reserve: str = "max", compaction_threshold: float | None = None,
                 allocator: str = "first-fit"):
        reservation_size(reserve, 1, 1)      # validates the name
        if allocator not in ALLOCATORS:
            raise ValueError(f"allocator must be one of {', '.join(ALLOCATORS)}, got {allocator!r}")
        if allocator == "buddy" and compaction_threshold is not None:
            raise ValueError("the buddy allocator does not compact")
        self.engine_block_size = block_size
        self.num_pool_slots = num_blocks * block_size
        self.max_model_len = max_model_len
        self.reserve = reserve
        self.compaction_threshold = compaction_threshold
        self.allocator_name = allocator
        self.allocator = (BuddyAllocator if allocator == "buddy" else SlotAllocator)(
            self.num_pool_slots)
        self.pool = _SlotPool(self)
        self.prefix_stats = PrefixCacheStats()
        self.compaction = CompactionStats()
        self.num_reserved_slots = 0     # pool slots occupied (blocks)
        self._num_region_slots = 0      # slots of the regions inside them
        self._num_tokens = 0
        self._num_final = 0
        self._regions: dict[object, Region] = {}
        self._transfers: list[BlockTransfer] = []

    # --- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> float:
        return self.pool.num_free_blocks

    def region(self, request_id) -> Region | None:
        return self._regions.get(request_id)

    def block_ids_ref(self, request_id) -> list[int]:
        """No block table: a contiguous region is ``region(request_id)``."""
        return []

    def num_slots(self, request_id) -> int:
        entry = self._regions.get(request_id)
        return entry.num_slots if entry else 0

    def has_request(self, request_id) -> bool:
        return request_id in self._regions

    def lookup(self, tokens) -> CacheHit:
        """No prefix sharing across contiguous regions: never a hit."""
        return CacheHit()

    def record_query(self, num_tokens: int, hit: CacheHit) -> None:
        self.prefix_stats.record(num_tokens, hit)

    def size_for(self, tokens) -> int:
        """Slots a new request ``tokens`` would reserve."""
        return reservation_size(self.reserve, final_length(tokens, self.max_model_len),
                                self.max_model_len, tokens.num_prompt_tokens)

    def fragmentation(self, running=None, next_request=None) -> tuple[int, int, int, int]:
        """Slot counts ``(token states, reservation, internal, external)``: tokens held,
        reserved slots still to be filled up to the final lengths, reserved slots beyond them,
        and free slots in gaps too short for ``next_request`` (0 when none waits) plus the
        buddy blocks' slack beyond their regions."""
        external = self.num_reserved_slots - self._num_region_slots
        if next_request is not None:
            external += self.allocator.unusable(self.size_for(next_request))
        return (self._num_tokens, self._num_final - self._num_tokens,
                self._num_region_slots - self._num_final, external)

    # --- allocation ----------------------------------------------------------------------

    def num_blocks_needed(self, request_id, num_new_tokens: int, hit=None) -> int:
        return 0 if request_id in self._regions else num_new_tokens

    def can_allocate(self, request_id, num_new_tokens: int, hit=None, reserve: int = 0) -> bool:
        """Growth of a request holding a region always fits. For a new request only a gap of
        ``num_new_tokens`` is checked (its reservation size needs the request:
        :meth:`allocate` decides)."""
        if request_id in self._regions:
            return True
        return self.allocator.fits(num_new_tokens + reserve) or self._compactable(
            num_new_tokens + reserve)

    def allocate(self, request_id, tokens, num_new_tokens: int, hit=None,
                 num_computed_tokens: int | None = None) -> list[int] | None:
        """Reserve the region of a new request (None, nothing changed, when none fits), then
        count ``num_new_tokens`` more tokens in it (after ``num_computed_tokens`` when given).
        Returns ``[]`` (no blocks) on success."""
        entry = self._regions.get(request_id)
        if entry is None:
            entry = self._reserve(request_id, tokens)
            if entry is None:
                return None
        base = entry.num_slots if num_computed_tokens is None else num_computed_tokens
        slots = min(base + num_new_tokens, entry.size)
        self._num_tokens += slots - entry.num_slots
        entry.num_slots = slots
        return []

    def free(self, request_id) -> None:
        entry = self._regions.pop(request_id, None)
        if entry is None:
            return
        self.allocator.free(entry.offset, entry.size)
        self.num_reserved_slots -= entry.block
        self._num_region_slots -= entry.size
        self._num_final -= entry.final
        self._num_tokens -= entry.num_slots

    def begin_step(self) -> None:
        """A new engine step starts (nothing to do here)."""

    def take_transfers(self) -> list[BlockTransfer]:
        """The compaction copies made since the last call (for this step's plan)."""
        out, self._transfers = self._transfers, []
        return out

    # --- internals -----------------------------------------------------------------------

    def _reserve(self, request_id, tokens) -> Region | None:
        final = final_length(tokens, self.max_model_len)
        size = reservation_size(self.reserve, final, self.max_model_len, tokens.num_prompt_tokens)
        offset = self.allocator.allocate(size)
        if offset is None and self._compactable(size):
            self._compact(size)
            offset = self.allocator.allocate(size)
        if offset is None:
            return None
        block = block_size_for(size) if self.allocator_name == "buddy" else size
        entry = self._regions[request_id] = Region(offset, size, min(final, size), block=block)
        self.num_reserved_slots += block
        self._num_region_slots += size
        self._num_final += entry.final
        return entry

    def _compactable(self, size: int) -> bool:
        f = self.compaction_threshold
        a = self.allocator
        return (f is not None and a.num_free >= size and not a.fits(size)
                and a.unusable(size) > f * self.num_pool_slots)

    def _compact(self, size: int) -> None:
        """Slide every live region to the start; record the copies and the statistics."""
        before = self.allocator.unusable(size) / self.num_pool_slots
        entries = list(self._regions.values())
        new = self.allocator.compact([(e.offset, e.size) for e in entries])
        bs, pairs, moved = self.engine_block_size, [], 0
        for e, to in sorted(zip(entries, new), key=lambda p: p[0].offset):
            if to != e.offset:
                pairs.extend((e.offset + i, to + i) for i in range(0, e.num_slots, bs))
                moved += e.num_slots
                e.offset = to
        if pairs:
            self._transfers.append(BlockTransfer(COMPACT, pairs))
        stats = self.compaction
        stats.num_compactions += 1
        stats.moved_slots += moved
        stats.moved_blocks += len(pairs)
        stats.external_before_sum += before
        stats.external_after_sum += self.allocator.unusable(size) / self.num_pool_slots
