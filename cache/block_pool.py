"""The physical KV block pool: reference counts, the free queue and the prefix index.

Semantics follow vLLM v1's ``BlockPool`` (``vllm/v1/core/block_pool.py``):

- blocks ``0..N-1`` start free, in ascending order;
- new blocks are taken from the head of the free queue; a reused block loses its old hash;
- freeing a block whose count drops to 0 puts it at the *head* of the queue when it has no hash
  (reused first, for locality) and at the *tail* when it has one (kept as long as possible, so
  the free queue is an LRU list of cached blocks);
- a cached block with count 0 stays findable by hash until it is reused.

The free queue (:class:`~kvsim.cache.free_queue.FreeQueue`) is vLLM's doubly linked list kept as
segments, and the reference counts and "holds content" marks are arrays: a long prompt's
hundreds of blocks are taken, given back and counted a run at a time. Only the prefix index
(:class:`~kvsim.cache.prefix_index.PrefixIndex`, a ``dict``) and the hashes themselves (a list
of ints) stay per block.

That is the ``lru`` eviction policy. Other policies run on a subclass
(:class:`~kvsim.cache.policy_pool.PolicyPool`); :func:`kvsim.cache.eviction.make_pool` picks the
pool class for a policy.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from kvsim.cache.bulk import gather, set_all, set_each
from kvsim.cache.free_queue import FreeQueue
from kvsim.cache.prefix_index import PrefixIndex

# What an LRU pool's block holds besides nothing (0): content in the prefix index, or content
# no lookup can reach (:meth:`BlockPool.cache_unreachable`), which has no id and no index entry.
_INDEXED, _UNREACHABLE = 1, 2


#: Most KV blocks a pool may be given: a pool keeps tens of bytes per block (2 x 10^9 blocks
#: ran out of memory instead of answering), and no GPU holds more at block size 1.
MAX_POOL_BLOCKS = 50_000_000


def _array(block_ids: list[int]) -> np.ndarray:
    """A list of block ids as an index array (``np.fromiter``: faster than numpy's own
    conversion of a list used as an index)."""
    return np.fromiter(block_ids, np.intp, len(block_ids))


class BlockPool:
    """``num_blocks`` KV blocks with reference counts, a free queue and a prefix index.

    ``policy`` (None or ``lru``) is kept for the callers' information: this class is vLLM's LRU
    code path; :func:`kvsim.cache.eviction.make_pool` builds the pool of any other policy.

    ``ref_counts`` is an ``int32`` array here (a list in the policy pools, whose loops read it
    one block at a time). ``block_hashes[b]``: the id block ``b`` is findable under (None
    otherwise, also for content no lookup can reach).

    ``opens_in_bulk``: when a decode run may take its new blocks in one call and register the
    blocks they fill afterwards (:meth:`KVCacheManager.opens_blocks_in_bulk`): ``"always"``
    here (registering a held block moves nothing in the free queue); ``"new_chains"`` for the
    scored and lane pools (the same only while the blocks filled are new content continuing
    from their chain's holder); ``"new_fills"`` for a queue pool whose policy can hear of the
    fills late (ARC, S3-FIFO: while the blocks filled are new content its victims do not
    depend on, see :meth:`QueuePool.takes_new_fills`), ``"never"`` for another (its fill
    hooks change the victims).
    """

    opens_in_bulk = "always"
    #: Whether :meth:`cache_unreachable` is exact here, so that a manager may leave blocks no
    #: other request can hit out of the index (``defer_private_blocks``), and how many leading
    #: blocks of a chain it must still register as they fill (their place in a chain counts).
    caches_unreachable = True
    num_always_registered = 0

    def __init__(self, num_blocks: int, enable_caching: bool = True, policy=None):
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.block_hashes: list[int | None] = [None] * num_blocks
        self.index = PrefixIndex()
        self.num_cached_free_blocks = 0
        self.num_evictions = 0
        self.policy = policy
        # (block id, hash) of every eviction of content a lookup can reach, when someone wants
        # them (a host tier demotes them); None keeps the hot path free of the bookkeeping
        self.evicted: list[tuple[int, int]] | None = None
        self._init_free_blocks(num_blocks)

    def _init_free_blocks(self, num_blocks: int) -> None:
        self.ref_counts = np.zeros(num_blocks, dtype=np.int32)
        # what a block holds: nothing, content in the index, or content nothing can reach
        self._content = np.zeros(num_blocks, dtype=np.int8)
        self._held_unreachable = False      # whether a block ever held content nothing reaches
        self._free = FreeQueue(num_blocks)
        # whether every free block holding nothing is ahead of every free cached one in the
        # queue (freed empty blocks go to its head, cached ones to its tail), so that taking
        # ``n`` blocks evicts exactly those past the empty ones; an empty block released or
        # refreshed to the tail behind cached ones ends it, until the free blocks are all
        # empty or all cached again
        self._empty_first = True

    # --- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def free_queue(self) -> list[int]:
        """Free block ids, head (next to be reused) first."""
        return self._free.ids().tolist()

    def num_free_among(self, block_ids: list[int]) -> int:
        """How many of ``block_ids`` are free (held by nobody)."""
        return int(np.count_nonzero(self.ref_counts[_array(block_ids)] == 0)) if block_ids else 0

    def cached_block(self, block_hash: int) -> int | None:
        return self.index.get(block_hash)

    def is_cached(self, block_id: int) -> bool:
        """Whether the block holds content (findable or not)."""
        return bool(self._content[block_id])

    # --- actions -------------------------------------------------------------------------

    def begin(self, request_id, priority: int = 0) -> None:
        """Blocks are about to be taken or touched for ``request_id`` (LRU ignores it)."""

    def can_get_new_blocks(self, n: int) -> bool:
        return n <= len(self._free)

    def get_new_blocks(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue, evicting their cached content."""
        taken = self._take(n)
        self.ref_counts[taken] = 1
        return taken.tolist()

    def _take(self, n: int) -> np.ndarray:
        """The ``n`` blocks at the head of the free queue, out of it, their content evicted."""
        num_free = len(self._free)
        if n > num_free:
            raise ValueError(f"cannot get {n} free blocks: only {num_free} are free")
        taken = self._free.popleft(n)
        if self._empty_first:           # (the empty ones come first: the rest is cached)
            cached = n - (num_free - self.num_cached_free_blocks)
            if cached > 0:
                self._forget_content(taken[n - cached:], cached)
        else:
            self._evict(taken)
            cached = self.num_cached_free_blocks        # (all empty or all cached: again)
            self._empty_first = not cached or cached == len(self._free)
        return taken

    def _evict(self, block_ids: np.ndarray) -> None:
        """Forget the cached content of ``block_ids`` (just taken from the free queue)."""
        content = self._content[block_ids]
        num_evicted = np.count_nonzero(content)
        if num_evicted:
            self._forget_content(block_ids, num_evicted, content)

    def _forget_content(self, block_ids: np.ndarray, num_evicted: int,
                        content: np.ndarray | None = None) -> None:
        """Evict the ``num_evicted`` cached blocks among ``block_ids``: given their marks
        (``content``), those marked; else all of them."""
        if content is None and self._held_unreachable and self.index._map:
            content = self._content[block_ids]
        self._content[block_ids] = 0
        self.num_cached_free_blocks -= num_evicted
        self.num_evictions += num_evicted
        if not self.index._map:      # (nothing is indexed: every cached block is unreachable)
            return
        # (no marks: all cached, and none unreachable in a pool that never held one)
        indexed = (block_ids if content is None else block_ids[content == _INDEXED]).tolist()
        if indexed:
            hashes = self.block_hashes
            found = gather(hashes, indexed)
            set_all(hashes, indexed, None)
            self.index.remove_many(found, indexed)
            if self.evicted is not None:
                self.evicted.extend(zip(indexed, found))

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take another reference on each block (distinct), pulling free (cached) ones out of
        the queue."""
        ids = np.fromiter(block_ids, dtype=np.int64)
        if not len(ids):
            return
        free = ids[self.ref_counts[ids] == 0]
        if len(free) and np.count_nonzero(self._content[free]) < len(free):
            raise ValueError("a free block to touch holds nothing: only a prefix hit's "
                             "cached blocks are touched")
        self.ref_counts[ids] += 1
        if len(free):
            self._free.remove(free)
            self.num_cached_free_blocks -= len(free)

    def free_blocks(self, ordered_block_ids: Iterable[int]) -> None:
        """Drop one reference from each block (distinct), given in eviction order (first
        evicted first)."""
        ids = np.fromiter(ordered_block_ids, dtype=np.int64)
        refs = self.ref_counts
        left = refs[ids] - 1
        refs[ids] = left
        released = ids[left == 0] if np.count_nonzero(left) else ids
        holding = self._content[released] != 0
        if np.count_nonzero(holding) == len(holding):    # (``all()``: three times as long)
            last = released
        else:
            self._free.extendleft(released[~holding])
            last = released[holding]
        self._free.extend(last)
        self.num_cached_free_blocks += len(last)

    def cache_block(self, block_id: int, block_hash: int) -> None:
        """Register a full, held block under ``block_hash``."""
        self.block_hashes[block_id] = block_hash
        self._content[block_id] = _INDEXED
        self.index.insert(block_hash, block_id)

    def cache_blocks(self, block_ids, block_hashes, depth: int = 0, parent=None) -> None:
        """Register several full, held blocks (``cache_block`` for each pair): consecutive
        blocks of one chain, the first at ``depth`` (blocks before it) after block ``parent``
        (None at the root). LRU needs no chain information and ignores both."""
        block_ids, block_hashes = list(block_ids), list(block_hashes)
        if block_ids:
            set_each(self.block_hashes, block_ids, block_hashes)
            self._content[_array(block_ids)] = _INDEXED
            self.index.insert_many(block_hashes, block_ids)

    def cache_unreachable(self, block_ids: list[int], parent: int | None = None,
                          chain_mark=None) -> None:
        """Count full, held blocks as cached content that no lookup can reach (a finished
        request's blocks that nothing can continue): freed, they queue and count as cached
        blocks, exactly as registered ones would, and their eviction skips the index. They
        continue block ``parent``'s chain; ``chain_mark``: what :meth:`chain_mark` said when
        the first of them filled (LRU needs neither)."""
        if block_ids:
            self._content[_array(block_ids)] = _UNREACHABLE
            self._held_unreachable = True

    def chain_mark(self, parent: int | None):
        """What a pool remembers of a chain's state for the blocks registered next after held
        block ``parent`` (None: nothing, as here)."""
        return None

    def put_cached(self, block_hash: int) -> int:
        """Fill the next free block with ``block_hash`` and leave it free and cached, as the
        most recently used (``get_new_blocks(1)``, ``cache_block``, ``free_blocks`` in one
        step: a host tier storing a copy, which it checked it does not hold: a hash cached
        here already is not put again). Returns the block id."""
        return self.put_cached_run([block_hash])[0]

    def put_cached_run(self, block_hashes: list[int]) -> list[int]:
        """``put_cached`` of each hash in turn, in one pass: the hashes are distinct, none
        is cached here, and at most as many as the free blocks (so no block is taken twice,
        and none of the blocks taken holds one of them). Returns the block ids."""
        n = len(block_hashes)
        if n > len(self._free):
            raise ValueError(f"cannot put {n} cached blocks: only {len(self._free)} are free")
        taken = self._take(n)
        self.num_cached_free_blocks += n
        block_ids = taken.tolist()
        set_each(self.block_hashes, block_ids, block_hashes)
        self._content[taken] = _INDEXED
        self.index.insert_new(block_hashes, block_ids)
        self._free.extend(taken)
        return block_ids

    def refresh(self, block_id: int) -> None:
        """Count a cached block as just used (a free one moves to the LRU tail)."""
        self.refresh_many([block_id])

    def refresh_many(self, block_ids: list[int]) -> None:
        """``refresh`` of each block in turn (a block named twice ends where the last puts
        it)."""
        if len(set(block_ids)) < len(block_ids):
            block_ids = list(dict.fromkeys(reversed(block_ids)))[::-1]
        ids = _array(block_ids)
        free = ids[self.ref_counts[ids] == 0]
        if len(free):
            if self.num_cached_free_blocks and not self._content[free].all():
                self._empty_first = False         # (an empty block behind cached ones)
            self._free.move_many_to_end(free)

    def claim(self, block_ids) -> None:
        """Take the given free blocks (distinct) out of the queue, wherever they are,
        evicting their cached content; each ends with one reference (a contiguous region of
        the hybrid layout)."""
        ids = np.array(list(block_ids), dtype=np.int64)
        used = ids[self.ref_counts[ids] != 0]
        if len(used):
            raise ValueError(f"block {used[0]} is in use")
        self._free.remove(ids)
        self.ref_counts[ids] = 1
        self._evict(ids)

    def release(self, block_ids) -> None:
        """Give back blocks taken with :meth:`claim` to the TAIL of the free queue."""
        ids = np.array(list(block_ids), dtype=np.int64)
        wrong = ids[(self.ref_counts[ids] != 1) | (self._content[ids] != 0)]
        if len(wrong):
            raise ValueError(f"block {wrong[0]} was not claimed")
        self.ref_counts[ids] = 0
        if self.num_cached_free_blocks:       # (empty blocks behind cached ones)
            self._empty_first = False
        self._free.extend(ids)

    def can_reset(self) -> bool:
        return len(self._free) == self.num_blocks

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is held."""
        if not self.can_reset():
            return False
        self.index.clear()
        self.block_hashes = [None] * self.num_blocks
        self._content[:] = 0
        self.num_cached_free_blocks = 0
        self._empty_first = True
        return True
