"""Per-request KV block bookkeeping on top of a :class:`BlockPool`, as vLLM v1's
``KVCacheManager`` does it for one full-attention cache group.

A request's prompt is given either as token ids (hashed here, per full block, chained) or as a
:class:`BlockHashSource` that already knows its block ids (traces carry per-block prefix ids,
never per-token lists). Both give the same semantics.

Blocks only their own request can hit skip the prefix-cache work that cannot pay off
(:mod:`kvsim.cache.private_blocks`); nothing observable changes.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from kvsim.workloads.identity import ROOT_HASH, hash_token_blocks

from kvsim.cache.eviction import make_pool
from kvsim.cache.prefix_hit import CacheHit, PrefixCacheStats
from kvsim.cache.request_state import RequestStatus
from kvsim.cache.private_blocks import ALL, PrivateBlocks
from kvsim.cache.run_blocks import DecodeRunBlocks


class _RequestBlocks:
    """One request's block table and how much of it is hashed."""

    __slots__ = ("block_ids", "num_slots", "num_cached", "hashes", "deferred", "private",
                 "chain_mark", "at_cap", "num_filled")

    def __init__(self) -> None:
        self.block_ids: list[int] = []
        self.num_slots = 0        # tokens the request has KV slots for
        self.num_cached = 0       # leading blocks registered in the prefix index
        self.hashes: list[int] = []  # hashes computed so far (token-id input only)
        self.deferred = None      # the sequence whose full blocks wait to be registered
        self.private = None       # the sequence whose blocks after its shared ones wait
        self.chain_mark = None    # the pool's chain_mark when its first private block filled
        self.at_cap = False       # its shared blocks are registered: no more while it runs
        self.num_filled = ALL     # full blocks a pool that hears private fills heard of


class KVCacheManager(DecodeRunBlocks, PrivateBlocks):
    """Allocate, share, look up and free KV blocks for requests (and, through
    :class:`~kvsim.cache.run_blocks.DecodeRunBlocks`, for decode runs).

    >>> m = KVCacheManager(num_blocks=8, block_size=4)
    >>> m.allocate("a", list(range(10)), 10)
    [0, 1, 2]
    >>> hit = m.lookup(list(range(9)))
    >>> hit.block_ids, hit.num_tokens
    ([0, 1], 8)
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 max_model_len: int | None = None, policy=None,
                 defer_private_blocks: bool = False):
        """``policy``: a :class:`~kvsim.cache.policies.CachePolicy` (default: vLLM's LRU). A
        policy that needs the requester (priority, trace position) gets it from ``allocate``:
        its ``request_id`` and ``tokens.priority`` when ``tokens`` has one (a ``RequestState``).
        ``defer_private_blocks``: register a private sequence's full blocks late (see the
        module docstring), with a pool that allows it (``caches_unreachable``: LRU's, LFU's,
        and the lanes of ``hybrid``, ``priority`` and ``lookahead`` past a chain's first two
        blocks)."""
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.max_model_len = max_model_len
        self.pool = make_pool(num_blocks, enable_caching=enable_prefix_caching, policy=policy)
        # LRU's begin() and chain arguments are no-ops; skipping them keeps allocate fast
        self._scored = policy is not None and not policy.is_lru
        self.prefix_stats = PrefixCacheStats()
        self._requests: dict[object, _RequestBlocks] = {}
        self._defer = (defer_private_blocks and enable_prefix_caching
                       and self.pool.caches_unreachable)
        self._num_always_registered = self.pool.num_always_registered
        # a queue pool's policy hears a private block fill, without its id (ARC's, S3-FIFO's)
        self._hears_fills = self._defer and getattr(self.pool, "hears_private_fills", False)
        self._deferred: dict[object, _RequestBlocks] = {}   # entries whose registration waits

    # --- queries -------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def free_queue(self) -> list[int]:
        return self.pool.free_queue()

    def ref_count(self, block_id: int) -> int:
        return int(self.pool.ref_counts[block_id])

    def is_cached(self, block_id: int) -> bool:
        return self.pool.is_cached(block_id)

    def block_ids(self, request_id) -> list[int]:
        entry = self._requests.get(request_id)
        return list(entry.block_ids) if entry else []

    def block_ids_ref(self, request_id) -> list[int]:
        """The live block table of ``request_id`` (not a copy: read it, never change it)."""
        entry = self._requests.get(request_id)
        return entry.block_ids if entry else []

    def num_slots(self, request_id) -> int:
        """Tokens ``request_id`` holds KV slots for (0 when it holds no blocks)."""
        entry = self._requests.get(request_id)
        return entry.num_slots if entry else 0

    def has_request(self, request_id) -> bool:
        return request_id in self._requests

    def fragmentation(self, running, next_request=None) -> tuple[int, int, int, int]:
        """Slot counts ``(token states, reservation, internal, external)`` of the pool while
        ``running`` (sequences whose ``num_computed_tokens`` have KV) run: paged memory reserves
        nothing ahead and has no external fragmentation; internal is each sequence's last-block
        tail; token states are the other slots of the used blocks."""
        bs = self.block_size
        internal = sum((-s.num_computed_tokens) % bs for s in running)
        return self.pool.num_used_blocks * bs - internal, 0, internal, 0

    def begin_step(self) -> None:
        """A new engine step starts (a host tier writes through here; paged alone: nothing)."""

    def take_transfers(self) -> tuple:
        """Copies this manager wants in the next step plan (paged: none)."""
        return ()

    # --- lookup --------------------------------------------------------------------------

    def lookup(self, tokens) -> CacheHit:
        """Cached whole blocks from the start of ``tokens``, never covering the last token.

        Side-effect free. Stops at the first miss; at most ``(len(tokens) - 1) // block_size``
        blocks, so a block-aligned fully cached prompt still recomputes its last block.
        """
        found = self.pool.index.find_prefix(self._lookup_hashes(tokens))
        return CacheHit(found, len(found) * self.block_size)

    def _lookup_hashes(self, tokens, whole: bool = False) -> Sequence[int]:
        """Ids of the blocks a lookup may cover (none with prefix caching off, nor for a private
        sequence that was never preempted: nothing can hold its ids yet): those before the
        last token's block, or, ``whole``, every full block (where a CPU tier's lookup goes
        on)."""
        n = len(tokens)
        max_blocks = (n if whole else n - 1) // self.block_size
        if not self.enable_prefix_caching or max_blocks <= 0 or (
                getattr(tokens, "has_private_blocks", False) and not tokens.num_preemptions):
            return ()
        if self._defer and getattr(tokens, "num_shared_blocks", None) is not None \
                and not tokens.num_preemptions:      # its later blocks: nobody holds them yet
            max_blocks = min(max_blocks, tokens.num_shared_blocks)
        if self._deferred and n > self.block_size:     # (a GPU lookup to make)
            self._register_deferred()
        return _hashes(tokens, self.block_size, 0, max_blocks)

    def record_query(self, num_tokens: int, hit: CacheHit) -> None:
        """Count one admission's prefix lookup in :attr:`prefix_stats`."""
        self.prefix_stats.record(num_tokens, hit)

    # --- allocation ----------------------------------------------------------------------

    def num_blocks_needed(self, request_id, num_new_tokens: int,
                          hit: CacheHit | None = None) -> int:
        """Free blocks :meth:`allocate` would consume: new ones plus free hit blocks."""
        entry = self._requests.get(request_id)
        held, slots = (len(entry.block_ids), entry.num_slots) if entry else (0, 0)
        return self._num_needed(held, slots, num_new_tokens, hit)

    def _num_needed(self, held: int, slots: int, num_new_tokens: int, hit) -> int:
        if hit is None or not hit.num_tokens:
            wanted = slots + num_new_tokens
            if self.max_model_len is not None and wanted > self.max_model_len:
                wanted = self.max_model_len
            new = -(-wanted // self.block_size) - held
            return new if new > 0 else 0
        hit_blocks = hit.block_ids
        wanted = slots + hit.num_tokens + num_new_tokens
        if self.max_model_len is not None:
            wanted = min(wanted, self.max_model_len)
        new = max(-(-wanted // self.block_size) - held - len(hit_blocks), 0)
        return new + self.pool.num_free_among(hit_blocks)

    def can_allocate(self, request_id, num_new_tokens: int, hit: CacheHit | None = None,
                     reserve: int = 0) -> bool:
        needed = self.num_blocks_needed(request_id, num_new_tokens, hit)
        return needed + reserve <= self.pool.num_free_blocks

    def allocate(self, request_id, tokens, num_new_tokens: int, hit: CacheHit | None = None,
                 num_computed_tokens: int | None = None) -> list[int] | None:
        """Give ``request_id`` slots for ``num_new_tokens`` more tokens; return the NEW blocks.

        ``hit`` (from :meth:`lookup`, first allocation only) is adopted first. The new tokens
        follow the request's slots so far, or ``num_computed_tokens`` when given (as vLLM's
        ``request.num_computed_tokens``). Atomic: returns None and changes nothing when the new
        blocks plus the free hit blocks exceed the free blocks. Then every block full within
        ``min(slots, len(tokens))`` tokens is registered.
        """
        entry = self._requests.get(request_id)
        if self._deferred and not getattr(tokens, "has_private_blocks", False):
            self._register_deferred()     # a sequence that may share blocks uses the index
        if entry is not None and (hit is None or not hit.num_tokens):
            # Fast path (decode): no block boundary crossed, so nothing can fail or be taken;
            # the same effects as the general path below, with less bookkeeping.
            slots = (entry.num_slots if num_computed_tokens is None
                     else num_computed_tokens) + num_new_tokens
            if self.max_model_len is not None and slots > self.max_model_len:
                slots = self.max_model_len
            if slots <= len(entry.block_ids) * self.block_size:
                entry.num_slots = slots
                if (self.enable_prefix_caching and slots // self.block_size > entry.num_cached
                        and entry.deferred is None):
                    n = len(tokens)
                    if not entry.at_cap:
                        self._cache_full_blocks(entry, tokens, slots if slots < n else n)
                    elif slots // self.block_size > entry.num_filled:
                        self._fill_privately(entry, (slots if slots < n else n) // self.block_size)
                return []
        held, slots = (len(entry.block_ids), entry.num_slots) if entry else (0, 0)
        if num_computed_tokens is not None and entry is not None:
            num_new_tokens += num_computed_tokens - slots
        if self._num_needed(held, slots, num_new_tokens, hit) > self.pool.num_free_blocks:
            return None
        if entry is None:
            entry = self._new_entry(request_id, tokens)
        if self._scored:
            self.pool.begin(request_id, getattr(tokens, "priority", 0))
        if hit is not None and hit.num_tokens:
            self._adopt(entry, hit)
        entry.num_slots += num_new_tokens
        if self.max_model_len is not None and entry.num_slots > self.max_model_len:
            entry.num_slots = self.max_model_len
        num_new = -(-entry.num_slots // self.block_size) - len(entry.block_ids)
        new_blocks = self.pool.get_new_blocks(num_new) if num_new > 0 else []
        entry.block_ids.extend(new_blocks)
        if self.enable_prefix_caching and entry.deferred is None:
            n = len(tokens)
            self._cache_full_blocks(entry, tokens, entry.num_slots if entry.num_slots < n else n)
        return new_blocks

    def grow_slots(self, sequences: Iterable) -> None:
        """Give each sequence slots up to its ``num_computed_tokens``, within the blocks it
        holds (a decode run opened them), as :meth:`allocate` would: a request whose full blocks
        wait to be registered, or whose blocks left to fill are private, only counts them; the
        others register the blocks they filled."""
        entries, bs, cap = self._requests, self.block_size, self.max_model_len
        fast = type(self).allocate is KVCacheManager.allocate
        for seq in sequences:
            entry = entries[seq.request_id]
            slots = seq.num_computed_tokens
            if slots == entry.num_slots:
                continue
            if (fast and (entry.deferred is not None
                          or (entry.at_cap and slots // bs <= entry.num_filled))
                    and (cap is None or slots <= cap) and slots <= len(entry.block_ids) * bs):
                entry.num_slots = slots
            else:
                self.allocate(seq.request_id, seq, slots - entry.num_slots)

    def free(self, request_id) -> None:
        """Release a request's blocks, tail first (so a chain is evicted deepest first)."""
        entry = self._requests.pop(request_id, None)
        if entry is not None:
            if entry.deferred is not None:
                del self._deferred[request_id]
                seq, entry.deferred = entry.deferred, None
                self._register(entry, seq, reachable=not (seq.status is RequestStatus.FINISHED
                                                          and seq.unreachable_when_finished))
            elif entry.private is not None:     # its private blocks: as a deferred entry's
                seq, entry.private = entry.private, None
                self._register(entry, seq, reachable=seq.status is not RequestStatus.FINISHED)
            self.pool.free_blocks(reversed(entry.block_ids))

    def reset_prefix_cache(self) -> bool:
        """Forget all cached content; only possible while no block is in use."""
        return self.pool.reset_prefix_cache()

    # --- internals -----------------------------------------------------------------------

    def _new_entry(self, request_id, tokens) -> _RequestBlocks:
        entry = self._requests[request_id] = _RequestBlocks()
        if self._defer:
            self._defer_registration(request_id, entry, tokens)
        return entry

    def _adopt(self, entry: _RequestBlocks, hit: CacheHit) -> None:
        if entry.block_ids:
            raise ValueError("a prefix hit can only be adopted by a request holding no blocks")
        self.pool.touch(hit.block_ids)
        entry.block_ids.extend(hit.block_ids)
        entry.num_slots = hit.num_tokens
        entry.num_cached = len(hit.block_ids)

    def _cache_full_blocks(self, entry: _RequestBlocks, tokens, num_tokens: int) -> None:
        """Register the full blocks within ``num_tokens`` not registered yet (of a sequence
        with private blocks, only its shared ones)."""
        num_full, capped = num_tokens // self.block_size, False
        if entry.private is not None:
            cap = self._registration_cap(entry, tokens)
            filled, num_full, capped = num_full, min(num_full, cap), num_full > cap
        if num_full > entry.num_cached:
            self._cache_blocks(entry, tokens, num_full)
        if capped:          # its first private block is full
            if self._scored and entry.chain_mark is None:
                entry.chain_mark = self.pool.chain_mark(entry.block_ids[num_full - 1]
                                                        if num_full else None)
            entry.at_cap = True
            if self._hears_fills:
                self._fill_privately(entry, filled)

    def _cache_blocks(self, entry: _RequestBlocks, tokens, num_full: int) -> None:
        """Register the request's blocks from ``num_cached`` to ``num_full``."""
        start = entry.num_cached
        if hasattr(tokens, "block_hashes"):
            new_hashes = tokens.block_hashes(start, num_full)
        else:
            new_hashes = self._token_hashes(entry, tokens, num_full)
        ids = entry.block_ids[start:num_full]
        if not self._scored:
            self.pool.cache_blocks(ids, new_hashes)
        elif entry.chain_mark is None:   # a scored pool tracks chains (depth, parent)
            self.pool.cache_blocks(ids, new_hashes, start,
                                   entry.block_ids[start - 1] if start else None)
        else:       # a private tail registered late continues as its first block began
            self.pool.cache_blocks(ids, new_hashes, start, entry.block_ids[start - 1],
                                   chain_mark=entry.chain_mark)
        entry.num_cached = num_full

    def _token_hashes(self, entry: _RequestBlocks, tokens, num_full: int) -> list[int]:
        if len(entry.hashes) < num_full:
            entry.hashes = list(_hashes(tokens, self.block_size, 0, num_full))
        return entry.hashes[entry.num_cached:num_full]


def _hashes(tokens, block_size: int, start: int, end: int) -> Sequence[int]:
    """Ids of blocks ``start..end-1`` of ``tokens`` (token ids or a :class:`BlockHashSource`)."""
    if hasattr(tokens, "block_hashes"):
        return tokens.block_hashes(start, end)
    ids = hash_token_blocks(list(tokens[:end * block_size]), block_size, ROOT_HASH)
    return ids[start:end].tolist()
