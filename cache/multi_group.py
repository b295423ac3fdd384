"""vLLM v1's hybrid KV cache manager: several layer groups over ONE block pool.

Each request has one block table per :class:`~kvsim.cache.attention_groups.LayerGroup`, all
drawing from a shared LRU :class:`BlockPool` (``kv_cache_coordinator.py`` with
``single_type_kv_cache_manager.py``):

* allocation gives every group ``ceil(tokens / block_size)`` table entries; before it, each
  sliding-window or chunked-local group frees the blocks wholly before its skipped tokens
  (``remove_skipped_blocks``) and leaves a null entry (``NULL``) in their place;
* a full block is registered in the prefix index under its hash *and group* (vLLM's
  ``BlockHashWithGroupId``), so groups never share blocks. A sliding-window group registers
  only the blocks a later hit can use (vLLM 0.32's default ``prefix_cache_retention_interval``
  of 0, ``SlidingWindowManager.reachable_block_mask``): the ``cdiv(window - 1, block_size)``
  blocks that end at the prompt's last full block (at ``num_prompt_tokens - 1``, where a resend
  of the prompt resumes) and those that end at the request's shared-prefix boundary
  (:class:`GroupHit`); its other blocks, decode blocks included, are never cached;
* a prefix hit is the longest block-aligned length every group can serve: full-attention
  groups need every block before it cached, a sliding-window group only the blocks still in the
  window, a chunked-local group those of the current chunk (``find_longest_cache_hit``).

Allocation is atomic (check, then mutate). As vLLM's ``allocate_slots``, the scheduler calls
:meth:`allocate` for every scheduled request every step when a group frees skipped blocks
(:attr:`frees_skipped_blocks`), so a block is freed in the step its window leaves it. The
pool is LRU (no other eviction policy, no host tier).
"""

from __future__ import annotations

from kvsim.cache.attention_groups import FULL, SLIDING, LayerGroup, cdiv
from kvsim.cache.block_pool import BlockPool
from kvsim.cache.kv_cache_manager import _hashes
from kvsim.cache.prefix_hit import CacheHit, PrefixCacheStats

NULL = -1


class GroupHit(CacheHit):
    """A :class:`CacheHit` with one block table per group (``NULL`` for skipped blocks).

    ``shared_prefix_boundary``: where the full-attention groups' own hit ends when a windowed
    group cut the hit shorter (else 0), vLLM's ``request.shared_prefix_boundary``: a prefix
    other requests share whose sliding-window tail this request then keeps cached."""

    def __init__(self, tables=(), num_tokens: int = 0, shared_prefix_boundary: int = 0):
        flat = [b for t in tables for b in t if b != NULL]
        super().__init__(flat, num_tokens)
        self.tables = [list(t) for t in tables]
        self.shared_prefix_boundary = shared_prefix_boundary


class _Entry:
    __slots__ = ("tables", "num_slots", "num_cached", "boundaries")

    def __init__(self, num_groups: int) -> None:
        self.tables: list[list[int]] = [[] for _ in range(num_groups)]
        self.num_slots = 0
        self.num_cached = [0] * num_groups
        self.boundaries: tuple[int, ...] | None = None   # sliding groups' reachable tails


class MultiGroupKVManager:
    """Allocate, share, look up and free the blocks of ``groups`` in one pool.

    >>> from kvsim.cache.attention_groups import LayerGroup
    >>> m = MultiGroupKVManager(16, 4, (LayerGroup("full", 1), LayerGroup("sliding", 1, 4)))
    >>> m.allocate("a", list(range(12)), 12)     # 3 blocks in each group
    [0, 1, 2, 3, 4, 5]
    >>> m.allocate("a", list(range(13)), 1, num_computed_tokens=12)   # window: tokens 9..12
    [6, 7]
    >>> m.tables("a")
    [[0, 1, 2, 6], [-1, -1, 5, 7]]
    """

    def __init__(self, num_blocks: int, block_size: int, groups: tuple[LayerGroup, ...],
                 enable_prefix_caching: bool = True, max_model_len: int | None = None,
                 max_num_batched_tokens: int | None = None):
        """``max_num_batched_tokens`` (with ``max_model_len``) caps what :meth:`can_allocate`
        asks of a windowed group, as vLLM's admission gate does
        (``max_admission_blocks_per_request``): a request never holds more of its blocks."""
        if block_size < 1 or not groups:
            raise ValueError("need block_size >= 1 and at least one group")
        self.block_size, self.groups = block_size, tuple(groups)
        self.enable_prefix_caching = enable_prefix_caching
        self.max_model_len = max_model_len
        self._caps = [g.max_blocks_per_request(block_size, max_num_batched_tokens, max_model_len)
                      if g.kind != FULL and max_num_batched_tokens and max_model_len else None
                      for g in self.groups]
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        self.prefix_stats = PrefixCacheStats()
        self._requests: dict[object, _Entry] = {}
        full = [i for i, g in enumerate(self.groups) if g.kind == FULL]
        self._table_group = full[0] if full else 0
        self._table_group_is_full = bool(full)
        #: Some group frees blocks that leave its window (sliding or chunked-local): the
        #: scheduler then calls :meth:`allocate` for every scheduled request every step, as
        #: vLLM's ``allocate_slots`` (which runs ``remove_skipped_blocks`` first) is.
        self.frees_skipped_blocks = len(full) < len(self.groups)

    # --- queries -------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def tables(self, request_id) -> list[list[int]]:
        entry = self._requests.get(request_id)
        return [list(t) for t in entry.tables] if entry else []

    def block_ids(self, request_id) -> list[int]:
        return list(self.block_ids_ref(request_id))

    def block_ids_ref(self, request_id) -> list[int]:
        """The block table of the first full-attention group (group 0 when none is)."""
        entry = self._requests.get(request_id)
        return entry.tables[self._table_group] if entry else []

    def num_slots(self, request_id) -> int:
        entry = self._requests.get(request_id)
        return entry.num_slots if entry else 0

    def has_request(self, request_id) -> bool:
        return request_id in self._requests

    def num_blocks_held(self, request_id) -> int:
        entry = self._requests.get(request_id)
        return sum(b != NULL for t in entry.tables for b in t) if entry else 0

    def fragmentation(self, running, next_request=None) -> tuple[int, int, int, int]:
        """As paged: every group's last block tail is internal fragmentation."""
        bs = self.block_size
        internal = len(self.groups) * sum((-s.num_computed_tokens) % bs for s in running)
        used = self.pool.num_used_blocks * bs
        return max(used - internal, 0), 0, min(internal, used), 0

    def begin_step(self) -> None:
        """Nothing to do at a step's start (no host tier)."""

    def take_transfers(self) -> tuple:
        return ()

    def record_query(self, num_tokens: int, hit: CacheHit) -> None:
        self.prefix_stats.record(num_tokens, hit)

    # --- lookup --------------------------------------------------------------------------
    def lookup(self, tokens) -> GroupHit:
        """The longest block-aligned prefix every group can serve (never the last token):
        full-attention groups first (left to right), then each windowed group right to left,
        until all agree (vLLM's ``find_longest_cache_hit``)."""
        max_blocks = (len(tokens) - 1) // self.block_size
        if not self.enable_prefix_caching or max_blocks <= 0:
            return GroupHit()
        base = _hashes(tokens, self.block_size, 0, max_blocks)
        n, index = max_blocks, self.pool.index
        for g, group in enumerate(self.groups):
            if group.kind == FULL:
                n = len(index.find_prefix(_group_hash(h, g) for h in base[:n]))
        longest = n if self._table_group_is_full else 0
        while n:
            shorter = min(self._longest(g, base, n) for g in range(len(self.groups)))
            if shorter == n:
                break
            n = shorter
        hit = self._hit(base, n)
        if longest > n:
            hit.shared_prefix_boundary = longest * self.block_size
        return hit

    def _longest(self, g: int, base, n: int) -> int:
        """The longest hit of at most ``n`` blocks windowed group ``g`` can serve: its blocks
        from the window's (chunk's) start to ``n`` cached. A miss at block ``j`` rules out
        every length above ``j`` (their windows start at or before ``j``)."""
        group, bs, index = self.groups[g], self.block_size, self.pool.index
        if group.kind == FULL:
            return n
        m = n
        while m > 0:
            start = min(group.skipped_tokens(m * bs) // bs, m)
            miss = next((j for j in range(m - 1, start - 1, -1)
                         if index.get(_group_hash(base[j], g)) is None), None)
            if miss is None:
                return m
            m = miss
        return 0

    def _hit(self, base, n: int) -> GroupHit:
        tables, get = [], self.pool.index.get
        for g, group in enumerate(self.groups):
            skip = min(group.skipped_tokens(n * self.block_size) // self.block_size, n)
            tables.append([NULL] * skip + [get(_group_hash(h, g)) for h in base[skip:n]])
        return GroupHit(tables, n * self.block_size)

    # --- allocation ----------------------------------------------------------------------
    def num_blocks_needed(self, request_id, num_new_tokens: int,
                          hit: CacheHit | None = None) -> int:
        """New blocks plus free hit blocks :meth:`allocate` takes, less the blocks it frees."""
        entry = self._requests.get(request_id)
        return self._plan(entry, num_new_tokens, hit, None)[0]

    def can_allocate(self, request_id, num_new_tokens: int, hit: CacheHit | None = None,
                     reserve: int = 0) -> bool:
        """Whether the blocks for ``num_new_tokens`` more tokens are free, a windowed group
        counted at most at its admission cap (it frees blocks as the request advances)."""
        entry = self._requests.get(request_id)
        needed = self._plan(entry, num_new_tokens, hit, None, capped=True)[0]
        return needed + reserve <= self.pool.num_free_blocks

    def _plan(self, entry, n: int, hit, num_computed, capped: bool = False):
        """``(net blocks taken, target slots, computed tokens)`` of an allocation."""
        adopting = entry is None and hit is not None and hit.num_tokens
        base = hit.num_tokens if adopting else (entry.num_slots if entry else 0)
        if entry is not None and num_computed is not None:
            base = num_computed
        target = base + n
        if self.max_model_len is not None:
            target = min(target, self.max_model_len)
        tables = hit.tables if adopting else (entry.tables if entry else [[]] * len(self.groups))
        want = 0
        for table, cap in zip(tables, self._caps):
            blocks = cdiv(target, self.block_size)
            if capped and cap is not None:      # (the cap counts the table's null blocks too,
                blocks = min(blocks, cap)       # as vLLM 0.32's get_num_blocks_to_allocate)
            want += max(blocks - len(table), 0)
        refs = self.pool.ref_counts
        if adopting:
            want += sum(1 for b in hit.block_ids if refs[b] == 0)
        freed = sum(self._skipped(entry, base)) if entry is not None else 0
        return want - freed, target, base

    def _skipped(self, entry: _Entry, computed: int):
        """Per group, the held blocks that fall before the group's skipped tokens."""
        for g, table in enumerate(entry.tables):
            stop = min(self.groups[g].skipped_tokens(computed) // self.block_size, len(table))
            yield sum(1 for b in table[:stop] if b != NULL and self.pool.ref_counts[b] == 1)

    def allocate(self, request_id, tokens, num_new_tokens: int, hit: CacheHit | None = None,
                 num_computed_tokens: int | None = None) -> list[int] | None:
        """Slots for ``num_new_tokens`` more tokens in every group; the NEW blocks, or None
        when the pool cannot give them (then only the blocks that left a window are freed, as
        vLLM's ``allocate_slots`` frees them before it checks)."""
        entry = self._requests.get(request_id)
        net, target, computed = self._plan(entry, num_new_tokens, hit, num_computed_tokens)
        if net > self.pool.num_free_blocks:
            if entry is not None:
                self._free_skipped(entry, computed)
            return None
        if entry is None:
            entry = self._requests[request_id] = self._new_entry(hit)
            entry.boundaries = self._boundaries(tokens, hit)
        else:
            self._free_skipped(entry, computed)
        entry.num_slots = target
        new = self._grow(entry, target)
        if self.enable_prefix_caching:
            self._cache_full_blocks(entry, tokens, min(target, len(tokens)))
        return new

    def _new_entry(self, hit) -> _Entry:
        entry = _Entry(len(self.groups))
        if hit is not None and hit.num_tokens:
            self.pool.touch(hit.block_ids)
            entry.tables = [list(t) for t in hit.tables]
            entry.num_cached = [len(t) for t in hit.tables]
        return entry

    def _boundaries(self, tokens, hit) -> tuple[int, ...] | None:
        """Token positions whose sliding-window tail the request keeps cached: the prompt's
        replay boundary and the shared-prefix boundary of its admission hit (None: cache every
        block, for callers that pass plain token lists without a prompt length)."""
        prompt = getattr(tokens, "num_prompt_tokens", None)
        if prompt is None:
            return None
        shared = getattr(hit, "shared_prefix_boundary", 0) if hit is not None else 0
        return (prompt - 1, shared) if shared else (prompt - 1,)

    def _cacheable(self, g: int, entry: _Entry):
        """The block indexes group ``g`` may register (None: all of them)."""
        group = self.groups[g]
        if group.kind != SLIDING or entry.boundaries is None:
            return None
        bs = self.block_size
        need = cdiv(group.window - 1, bs)
        keep = set()
        for b in entry.boundaries:
            end = b // bs
            keep.update(range(max(end - need, 0), end))
        return keep

    def _free_skipped(self, entry: _Entry, computed: int) -> None:
        for g, table in enumerate(entry.tables):
            stop = min(self.groups[g].skipped_tokens(computed) // self.block_size, len(table))
            gone = [b for b in reversed(table[:stop]) if b != NULL]   # vLLM: last first
            if gone:
                table[:stop] = [NULL] * stop
                self.pool.free_blocks(gone)

    def _grow(self, entry: _Entry, target: int) -> list[int]:
        new: list[int] = []
        need = cdiv(target, self.block_size)
        for table in entry.tables:
            if need > len(table):
                blocks = self.pool.get_new_blocks(need - len(table))
                table.extend(blocks)
                new.extend(blocks)
        return new

    def _cache_full_blocks(self, entry: _Entry, tokens, num_tokens: int) -> None:
        num_full = num_tokens // self.block_size
        start = min(entry.num_cached)
        if num_full <= start:
            return
        base = list(_hashes(tokens, self.block_size, start, num_full))
        for g, table in enumerate(entry.tables):
            first = entry.num_cached[g]
            keep = self._cacheable(g, entry)
            pairs = [(table[i], _group_hash(base[i - start], g)) for i in range(first, num_full)
                     if table[i] != NULL and (keep is None or i in keep)]
            if pairs:
                self.pool.cache_blocks([b for b, _ in pairs], [h for _, h in pairs])
            entry.num_cached[g] = max(first, num_full)

    def free(self, request_id) -> None:
        """Release every group's blocks, each table tail first."""
        entry = self._requests.pop(request_id, None)
        if entry is not None:
            for table in entry.tables:
                self.pool.free_blocks([b for b in reversed(table) if b != NULL])

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()


def _group_hash(block_hash: int, group: int) -> int:
    """Group 0 keeps the block's hash; group g > 0 a hash of (hash, g) (vLLM's group id)."""
    return int(block_hash) if group == 0 else hash((int(block_hash), group))
