"""The physical KV block pool: reference counts, the free queue and the prefix index.

Semantics follow vLLM v1's ``BlockPool`` (``vllm/v1/core/block_pool.py``):

- blocks ``0..N-1`` start free, in ascending order;
- new blocks are taken from the head of the free queue; a reused block loses its old hash;
- freeing a block whose count drops to 0 puts it at the *head* of the queue when it has no hash
  (reused first, for locality) and at the *tail* when it has one (kept as long as possible, so
  the free queue is an LRU list of cached blocks);
- a cached block with count 0 stays findable by hash until it is reused.

The free queue is an ``OrderedDict`` used as a doubly linked list: popping the head, pushing at
either end and removing from the middle are all O(1), whatever the pool size.

That is the ``lru`` eviction policy. Other policies run on a subclass
(:class:`~kvsim.cache.policy_pool.PolicyPool`); :func:`kvsim.cache.eviction.make_pool` picks the
pool class for a policy.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

#: The hash of a cached block that no lookup can reach (:meth:`BlockPool.cache_unreachable`):
#: outside the 64-bit range of every block id scheme, and never in the prefix index.
UNREACHABLE = 1 << 64


class PrefixIndex:
    """Hash -> blocks holding that content. Identical blocks are not merged (block tables are
    append-only), so one hash may name several blocks; the oldest is returned first."""

    __slots__ = ("_map",)

    def __init__(self) -> None:
        self._map: dict[int, int | dict[int, None]] = {}

    def __len__(self) -> int:
        return len(self._map)

    def get(self, block_hash: int) -> int | None:
        found = self._map.get(block_hash)
        if found is None or isinstance(found, int):
            return found
        return next(iter(found))

    def find_prefix(self, block_hashes) -> list[int]:
        """Blocks holding the leading run of ``block_hashes`` (stops at the first miss)."""
        found, get = [], self._map.get
        for block_hash in block_hashes:
            block_id = get(block_hash)
            if block_id is None:
                break
            found.append(block_id if block_id.__class__ is int else next(iter(block_id)))
        return found

    def insert(self, block_hash: int, block_id: int) -> None:
        found = self._map.get(block_hash)
        if found is None:
            self._map[block_hash] = block_id
        elif isinstance(found, int):
            self._map[block_hash] = {found: None, block_id: None}
        else:
            found[block_id] = None

    def remove(self, block_hash: int, block_id: int) -> None:
        """Forget ``block_id`` as a holder of ``block_hash`` (a last copy left is stored
        alone again, as an int)."""
        found = self._map[block_hash]
        if isinstance(found, int):
            del self._map[block_hash]
            return
        del found[block_id]
        if len(found) == 1:
            self._map[block_hash] = next(iter(found))

    def clear(self) -> None:
        self._map.clear()


class BlockPool:
    """``num_blocks`` KV blocks with reference counts, a free queue and a prefix index.

    ``policy`` (None or ``lru``) is kept for the callers' information: this class is vLLM's LRU
    code path; :func:`kvsim.cache.eviction.make_pool` builds the pool of any other policy.

    ``opens_in_bulk``: when a decode run may take its new blocks in one call and register the
    blocks they fill afterwards (:meth:`KVCacheManager.opens_blocks_in_bulk`): ``"always"``
    here (registering a held block moves nothing in the free queue); ``"new_chains"`` for the
    scored and lane pools (the same only while the blocks filled are new content continuing
    from their chain's holder); ``"never"`` for the queue pools (their fill hooks change the
    victims).
    """

    opens_in_bulk = "always"

    def __init__(self, num_blocks: int, enable_caching: bool = True, policy=None):
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_counts: list[int] = [0] * num_blocks
        self.block_hashes: list[int | None] = [None] * num_blocks
        self.index = PrefixIndex()
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.num_cached_free_blocks = 0
        self.num_evictions = 0
        self.policy = policy
        # (block id, hash) of every eviction of content a lookup can reach, when someone wants
        # them (a host tier demotes them); None keeps the hot path free of the bookkeeping
        self.evicted: list[tuple[int, int]] | None = None

    # --- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def free_queue(self) -> list[int]:
        """Free block ids, head (next to be reused) first."""
        return list(self._free)

    def cached_block(self, block_hash: int) -> int | None:
        return self.index.get(block_hash)

    def is_cached(self, block_id: int) -> bool:
        return self.block_hashes[block_id] is not None

    # --- actions -------------------------------------------------------------------------

    def begin(self, request_id, priority: int = 0) -> None:
        """Blocks are about to be taken or touched for ``request_id`` (LRU ignores it)."""

    def can_get_new_blocks(self, n: int) -> bool:
        return n <= len(self._free)

    def get_new_blocks(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue, evicting their cached content."""
        if n > len(self._free):
            raise ValueError(f"cannot get {n} free blocks: only {len(self._free)} are free")
        popitem, hashes, refs = self._free.popitem, self.block_hashes, self.ref_counts
        index, evicted = self.index._map, self.evicted
        taken = []
        take = taken.append
        num_evicted = 0
        for _ in range(n):
            block_id = popitem(False)[0]
            block_hash = hashes[block_id]
            if block_hash is not None:
                # evict (inlined: this loop is the hottest in a long-prompt simulation)
                if block_hash is not UNREACHABLE:
                    found = index[block_hash]
                    if found.__class__ is int:
                        del index[block_hash]
                    else:
                        self.index.remove(block_hash, block_id)
                    if evicted is not None:
                        evicted.append((block_id, block_hash))
                hashes[block_id] = None
                num_evicted += 1
            refs[block_id] = 1
            take(block_id)
        if num_evicted:
            self.num_cached_free_blocks -= num_evicted
            self.num_evictions += num_evicted
        return taken

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take another reference on each block, pulling free (cached) ones out of the queue."""
        refs = self.ref_counts
        for block_id in block_ids:
            if refs[block_id] == 0:
                del self._free[block_id]
                self.num_cached_free_blocks -= 1
            refs[block_id] += 1

    def free_blocks(self, ordered_block_ids: Iterable[int]) -> None:
        """Drop one reference from each block, given in eviction order (first evicted first)."""
        refs, hashes = self.ref_counts, self.block_hashes
        first, last = [], []
        to_head, to_tail = first.append, last.append
        for block_id in ordered_block_ids:
            left = refs[block_id] - 1
            refs[block_id] = left
            if not left:
                if hashes[block_id] is None:
                    to_head(block_id)
                else:
                    to_tail(block_id)
        self._prepend(first)
        self._free.update(dict.fromkeys(last))
        self.num_cached_free_blocks += len(last)

    def cache_block(self, block_id: int, block_hash: int) -> None:
        """Register a full, held block under ``block_hash``."""
        self.block_hashes[block_id] = block_hash
        self.index.insert(block_hash, block_id)

    def cache_blocks(self, block_ids, block_hashes, depth: int = 0, parent=None) -> None:
        """Register several full, held blocks (``cache_block`` for each pair): consecutive
        blocks of one chain, the first at ``depth`` (blocks before it) after block ``parent``
        (None at the root). LRU needs no chain information and ignores both."""
        hashes, index = self.block_hashes, self.index._map
        for block_id, block_hash in zip(block_ids, block_hashes):
            hashes[block_id] = block_hash
            if block_hash in index:
                self.index.insert(block_hash, block_id)
            else:
                index[block_hash] = block_id

    def cache_unreachable(self, block_ids: Iterable[int]) -> None:
        """Count full, held blocks as cached content that no lookup can reach (a finished
        request's blocks that nothing can continue): freed, they queue and count as cached
        blocks, exactly as registered ones would, and their eviction skips the index."""
        hashes = self.block_hashes
        for block_id in block_ids:
            hashes[block_id] = UNREACHABLE

    def put_cached(self, block_hash: int) -> int:
        """Fill the next free block with ``block_hash`` and leave it free and cached, as the
        most recently used (``get_new_blocks(1)``, ``cache_block``, ``free_blocks`` in one
        step: a host tier storing a copy). Returns the block id."""
        if not self._free:
            raise ValueError("cannot put a cached block: no block is free")
        block_id = self._free.popitem(last=False)[0]
        old, index = self.block_hashes[block_id], self.index._map
        if old is None:
            self.num_cached_free_blocks += 1
        else:       # evict (index operations inlined, as in get_new_blocks)
            if old is not UNREACHABLE:
                if index[old].__class__ is int:
                    del index[old]
                else:
                    self.index.remove(old, block_id)
                if self.evicted is not None:
                    self.evicted.append((block_id, old))
            self.num_evictions += 1
        self.block_hashes[block_id] = block_hash
        if block_hash in index:
            self.index.insert(block_hash, block_id)
        else:
            index[block_hash] = block_id
        self._free[block_id] = None
        return block_id

    def refresh(self, block_id: int) -> None:
        """Count a cached block as just used (a free one moves to the LRU tail)."""
        if self.ref_counts[block_id] == 0:
            self._free.move_to_end(block_id)

    def can_reset(self) -> bool:
        return len(self._free) == self.num_blocks

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is held."""
        if not self.can_reset():
            return False
        self.index.clear()
        self.block_hashes = [None] * self.num_blocks
        self.num_cached_free_blocks = 0
        return True

    # --- internals -----------------------------------------------------------------------

    def _prepend(self, block_ids: list[int]) -> None:
        free = self._free
        for block_id in reversed(block_ids):
            free[block_id] = None
            free.move_to_end(block_id, last=False)
