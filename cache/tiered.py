"""A paged KV cache with a host tier behind it: demotion, promotion and swapping.

:class:`TieredKVCacheManager` is the vLLM-exact :class:`~kvsim.cache.KVCacheManager` plus a
:class:`~kvsim.cache.host_tier.HostTier`. Every decision of the GPU pool is unchanged; what the
tier adds is a second chance for content the GPU gives up, and the copies that costs:

- *demotion* (``OFFLOAD``, device -> host): a cached GPU block that is evicted (reused for new
  content) is first copied to the host, unless the host already holds its hash
  (**write-back**, the default). With **write-through** every block is copied to the host in
  the step after it becomes full (the copy waits for the forward pass that fills it), so an
  eviction finds its content already there and costs nothing;
- *promotion* (``PROMOTE``, host -> device): a prefix lookup that ends on the GPU continues
  into the host; the host blocks found are copied into fresh GPU blocks before the prefill,
  so their tokens count as hits (``prefix_stats.num_host_hit_tokens`` of them);
- *swapping* (``SWAP_OUT`` / ``SWAP_IN``): :meth:`swap_out` moves a preempted request's blocks
  (those holding computed tokens) into pinned host blocks; resuming (:meth:`swapped_hit`, then
  ``allocate``) adopts whatever of its prefix is still cached on the GPU and copies the rest
  back.

Copies accumulate in order and :meth:`take_transfers` hands them to the step plan. An executor
performs them in that order, before the step's forward pass: a block is always read before a
later copy (or the forward) overwrites it, because each copy is recorded when the block that it
reads or writes changes hands.
"""

from __future__ import annotations

from contextlib import contextmanager
from itertools import groupby
from operator import itemgetter
from typing import Sequence

from kvsim.cache.host_tier import HostTier
from kvsim.cache.kv_cache_manager import KVCacheManager, _RequestBlocks
from kvsim.cache.prefix_hit import CacheHit
from kvsim.cache.step_plan import OFFLOAD, PROMOTE, SWAP_IN, SWAP_OUT, TRANSFER_KINDS, BlockTransfer

WRITE_POLICIES = ("back", "through")


class TieredKVCacheManager(KVCacheManager):
    """A :class:`KVCacheManager` whose evicted cached blocks go to a host tier.

    >>> from kvsim.cache.host_tier import HostTier
    >>> m = TieredKVCacheManager(2, 4, host=HostTier(4))
    >>> m.allocate("a", list(range(8)), 8)
    [0, 1]
    >>> m.free("a")
    >>> m.allocate("b", [7] * 8, 8)             # evicts a's two cached blocks: demoted
    [1, 0]
    >>> [(t.kind, t.pairs) for t in m.take_transfers()]
    [('offload', [(1, 0), (0, 1)])]
    >>> m.free("b"); hit = m.lookup(list(range(9)))
    >>> hit.block_ids, hit.host_block_ids, hit.num_tokens
    ([], [1, 0], 8)
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 max_model_len: int | None = None, policy=None, *, host: HostTier,
                 write: str = "back"):
        super().__init__(num_blocks, block_size, enable_prefix_caching, max_model_len, policy)
        if write not in WRITE_POLICIES:
            raise ValueError(f"write must be one of {WRITE_POLICIES}, got {write!r}")
        self.host = host
        self.write_through = write == "through"
        self.pool.evicted = []
        self._host_scored = host.pool.policy is not None and not host.pool.policy.is_lru
        self.num_transferred_blocks = dict.fromkeys(TRANSFER_KINDS, 0)
        self._transfers: list[BlockTransfer] = []
        self._written: set[int] = set()     # destinations of the last transfer
        # (GPU block, hash, the request that filled it, its priority) to write
        self._pending_writes: list[tuple[int, int, object, int]] = []
        self._swapped: dict[object, tuple[list[int], int]] = {}   # id -> (host ids, tokens)
        self._holding_demotions = False

    # --- lookup --------------------------------------------------------------------------

    def lookup(self, tokens) -> CacheHit:
        """The GPU prefix hit, continued by the host blocks that follow it."""
        hashes = self._lookup_hashes(tokens)
        gpu = self.pool.index.find_prefix(hashes)
        host = self.host.lookup(hashes[len(gpu):]) if len(gpu) < len(hashes) else []
        return CacheHit(gpu, (len(gpu) + len(host)) * self.block_size, host)

    def record_query(self, num_tokens: int, hit: CacheHit) -> None:
        super().record_query(num_tokens, hit)
        self.prefix_stats.num_host_hit_tokens += len(hit.host_block_ids) * self.block_size

    # --- allocation ----------------------------------------------------------------------

    def allocate(self, request_id, tokens, num_new_tokens: int, hit: CacheHit | None = None,
                 num_computed_tokens: int | None = None) -> list[int] | None:
        """As :meth:`KVCacheManager.allocate`; host blocks of ``hit`` are copied into the first
        new blocks (promotion, or swap-in for a :meth:`swapped_hit`), and evicted cached blocks
        are demoted."""
        host_ids = hit.host_block_ids if hit is not None else ()
        swapped = hit is not None and hit.swapped
        if self._host_scored:
            self.host.pool.begin(request_id, getattr(tokens, "priority", 0))
        if host_ids:
            if self.num_blocks_needed(request_id, num_new_tokens, hit) > self.num_free_blocks:
                return None
            if not swapped:
                self.host.pin(host_ids)     # no demotion below may evict what we read
        new_blocks = super().allocate(request_id, tokens, num_new_tokens, hit,
                                      num_computed_tokens)
        if new_blocks is None:
            return None
        if self.pool.evicted and not self._holding_demotions:
            self._demote(self.pool.evicted)
        if host_ids or swapped:
            self._bring_in(request_id, host_ids, new_blocks[:len(host_ids)], swapped)
        return new_blocks

    def free(self, request_id) -> None:
        super().free(request_id)
        if request_id in self._swapped:
            self.host.release(self._swapped.pop(request_id)[0])

    # --- swapping ------------------------------------------------------------------------

    def is_swapped(self, request_id) -> bool:
        return request_id in self._swapped

    def can_swap_out(self, request_id, num_tokens: int) -> bool:
        """Whether the blocks holding the first ``num_tokens`` tokens fit in the host."""
        n = -(-num_tokens // self.block_size)
        return 0 < n <= len(self.block_ids_ref(request_id)) and self.host.can_hold(n)

    def swap_out(self, request_id, num_tokens: int) -> None:
        """Copy the blocks holding ``num_tokens`` computed tokens to the host, free the GPU
        blocks (cached ones stay cached there) and remember where the request went."""
        if not self.can_swap_out(request_id, num_tokens):
            raise ValueError(f"cannot swap out {num_tokens} tokens of {request_id!r}")
        n = -(-num_tokens // self.block_size)
        host_ids = self.host.hold(n)
        self._record(SWAP_OUT, list(zip(self._requests[request_id].block_ids[:n], host_ids)))
        super().free(request_id)
        self._swapped[request_id] = (host_ids, num_tokens)

    def swapped_hit(self, tokens, request_id) -> CacheHit:
        """What resuming a swapped request starts from: the part of its prefix still cached on
        the GPU, then its host blocks; ``allocate`` with it swaps the request back in."""
        host_ids, num_tokens = self._swapped[request_id]
        gpu = super().lookup(tokens).block_ids[:num_tokens // self.block_size]
        return CacheHit(gpu, num_tokens, host_ids[len(gpu):], swapped=True)

    # --- copies for the step plan --------------------------------------------------------

    @contextmanager
    def demotions_held(self):
        """Within it, the blocks the allocations evict are demoted together when it ends:
        one store into the host, which takes them as it would one at a time, and the same
        copies in the same order (for a decode run's step: its allocations touch the host
        only by demoting). Not where the host keys blocks by the request each store is for
        (a scored host pool): there each allocation demotes its own."""
        if self._host_scored or self._holding_demotions:
            yield
            return
        self._holding_demotions = True
        try:
            yield
        finally:
            self._holding_demotions = False
        if self.pool.evicted:
            self._demote(self.pool.evicted)

    def begin_step(self) -> None:
        """A new step starts: write through the blocks the last step filled, each stored for
        the request that filled it (a host pool that keys blocks by priority reads it; it read
        whichever request the last step allocated for last, which a decode run, allocating
        only where blocks change, does not repeat)."""
        if not self._pending_writes:
            return
        hashes = self.pool.block_hashes
        still = [w for w in self._pending_writes if hashes[w[0]] == w[1]]   # (else evicted
        self._pending_writes.clear()                                        # before its copy)
        if not self._host_scored:
            self._store([(block_id, block_hash) for block_id, block_hash, _, _ in still])
            return
        for (request_id, priority), writes in groupby(still, key=itemgetter(2, 3)):
            self.host.pool.begin(request_id, priority)
            self._store([(block_id, block_hash) for block_id, block_hash, _, _ in writes])

    def take_transfers(self) -> list[BlockTransfer]:
        """The copies recorded since the last call, in the order they must run."""
        transfers, self._transfers = self._transfers, []
        return transfers

    # --- internals -----------------------------------------------------------------------

    def _demote(self, evicted: list[tuple[int, int]]) -> None:
        self._store(evicted)
        evicted.clear()

    def _store(self, blocks: list[tuple[int, int]]) -> None:
        """Copy the content of ``(GPU block, hash)`` pairs to the host, in order, where the
        host takes it."""
        host_ids = self.host.store_many([block_hash for _, block_hash in blocks])
        self._record(OFFLOAD, [(block_id, host_id) for (block_id, _), host_id
                               in zip(blocks, host_ids) if host_id is not None])

    def _bring_in(self, request_id, host_ids, gpu_ids, swapped: bool) -> None:
        self._record(SWAP_IN if swapped else PROMOTE, list(zip(host_ids, gpu_ids)))
        if swapped:
            self.host.release(self._swapped.pop(request_id)[0])
        else:
            self.host.unpin(host_ids)

    def _record(self, kind: str, pairs: list[tuple[int, int]],
                destinations: Sequence[int] | None = None) -> None:
        """Append copies to the last transfer while it has the same kind and no destination
        repeats (a block written twice needs two transfers, in order). ``destinations``: the
        pairs' second blocks, when the caller has them."""
        if not pairs:
            return
        self.num_transferred_blocks[kind] += len(pairs)
        transfers = self._transfers
        last = transfers[-1] if transfers and transfers[-1].kind == kind else None
        if destinations is None:
            destinations = [d for _, d in pairs]
        if last is None:
            written = set(destinations)
            if len(written) == len(pairs):      # (each destination once: one new transfer)
                transfers.append(BlockTransfer(kind, list(pairs)))
                self._written = written
                return
            written = set()
        else:
            written = self._written
            if written.isdisjoint(destinations) and len(set(destinations)) == len(pairs):
                last.pairs.extend(pairs)        # (every destination new to it: they join it)
                written.update(destinations)
                return
        for source, destination in pairs:
            if last is None or destination in written:
                last, written = BlockTransfer(kind, []), set()
                transfers.append(last)
            last.pairs.append((source, destination))
            written.add(destination)
        self._written = written

    def _cache_full_blocks(self, entry: _RequestBlocks, tokens, num_tokens: int) -> None:
        start = entry.num_cached
        super()._cache_full_blocks(entry, tokens, num_tokens)
        if self.write_through and entry.num_cached > start:
            hashes, priority = self.pool.block_hashes, getattr(tokens, "priority", 0)
            owner = getattr(tokens, "request_id", None)
            self._pending_writes.extend(
                (b, hashes[b], owner, priority) for b in entry.block_ids[start:entry.num_cached])
