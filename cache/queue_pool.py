"""Queue-structured eviction over a :class:`~kvsim.cache.BlockPool`: the pool and the hooks of
its policies, ARC (:mod:`kvsim.cache.arc`) and S3-FIFO (:mod:`kvsim.cache.s3fifo`).

Some classical policies are not a score fixed when a block is released (what
:class:`~kvsim.cache.scored_pool.ScoredBlockPool` orders by) but a few queues whose roles change
as the cache learns: ARC's recency and frequency lists with an adaptive target, S3-FIFO's small
probation queue and main queue. :class:`QueuePool` runs such a :class:`QueuePolicy`:

- free blocks without a hash are reused first, as vLLM (the ``OrderedDict`` of
  :class:`BlockPool`);
- every *cached* block (held or free) belongs to the policy, which hears when blocks are
  filled (``fill_many``), looked up and taken again (``hit_many``), released
  (``release_many``) and taken while free (``acquire_many``), and picks the free cached blocks
  to evict (``victims``);
- ghost lists (hashes of evicted blocks, no KV) are the policy's own, bounded by the pool size;
- a policy that ``hears_private_fills`` is told of blocks only their own request can reach
  when they fill (``fill_private``), without their hashes: a request's private tail (see
  :mod:`kvsim.workloads.sharing`) costs no hashing and no index work, and once the request
  finished its blocks are content no lookup can reach (``UNREACHABLE``), which leaves an
  anonymous ghost entry when evicted (:mod:`kvsim.cache.ghost`).

Requests hold hundreds to thousands of blocks, so every hook takes a request's batch: one
Python call per batch, bulk work in C where it can (``map`` over bound methods, ``dict``
updates), with the same effect as the blocks one at a time, in order (the tests replay the
one-at-a-time policies of ``tests/queue_reference.py`` against them).

The chain rule of the scored pool (evict only chain leaves) is not enforced here, as in vLLM's
own ARC offloading manager: a request releases its blocks tail first, so within a queue the
deeper blocks of a chain sit nearer the eviction end, and a parent hit again moves with its
children. An orphaned child is unreachable and ages out.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

from kvsim.cache.bulk import set_all, set_each
from kvsim.cache.policy_pool import UNREACHABLE, PolicyPool


class QueuePolicy:
    """Hooks a :class:`QueuePool` calls; see the module docstring. Each hook takes a batch (a
    request's blocks): one Python call per batch, not per block.

    ``takes_late_fills``: a decode run may take its blocks in one call and report the blocks
    it filled meanwhile afterwards, when :meth:`takes_new_fills` allows it; :meth:`victims`
    is then told how many fills came before each victim, and, with ``orders_fills``,
    :meth:`order_fills` the order the fills came in."""

    name = "queue"
    is_lru = False
    pool_class = "queue"
    takes_late_fills = False
    orders_fills = False
    hears_private_fills = False

    def attach(self, pool: "QueuePool") -> None:
        self.pool = pool

    def begin(self, request_id) -> None:
        """Blocks are about to be taken or touched for ``request_id``."""

    def fill_many(self, block_ids: list[int], block_hashes: list[int]) -> None:
        """Held, uncached blocks got these hashes (pairwise, in chain order)."""
        raise NotImplementedError

    def fill_private(self, block_ids: list[int]) -> None:
        """Held, uncached blocks filled with content only their request can reach (in
        order): as ``fill_many`` with hashes in no ghost list (``hears_private_fills``)."""
        raise NotImplementedError

    def hit_many(self, block_ids: list[int]) -> None:
        """Cached blocks were looked up and taken (a block may come twice: two hits)."""
        raise NotImplementedError

    def release_many(self, block_ids: list[int]) -> None:
        """Cached blocks became free, in this order (distinct)."""
        raise NotImplementedError

    def acquire_many(self, block_ids: list[int]) -> None:
        """Free cached blocks were taken (distinct; before ``hit_many`` for the same touch)."""
        raise NotImplementedError

    def victims(self, n: int, fills_before: list[int] | None = None) -> list[int]:
        """The next ``n`` free cached blocks to evict, in order (the pool has that many);
        ``fills_before[k]`` (``takes_late_fills`` policies): blocks filled with new hashes,
        not reported yet, before the ``k``-th victim is taken."""
        raise NotImplementedError

    def takes_new_fills(self, block_hashes: list, num_new_blocks: int,
                        num_private: int = 0) -> bool:
        """Whether blocks filled with these new, distinct hashes (and ``num_private``
        private blocks, see :meth:`fill_private`) may be reported after the (at most
        ``num_new_blocks``) blocks taken meanwhile."""
        return False

    def order_fills(self, block_ids: list[int]) -> None:
        """The blocks just reported late were filled in this order (``orders_fills``)."""

    def order(self) -> list[int]:
        """Free cached blocks, roughly in the order they would be evicted."""
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class QueuePool(PolicyPool):
    """A :class:`~kvsim.cache.policy_pool.PolicyPool` whose free cached blocks are evicted by a
    :class:`QueuePolicy`. The loops over a request's blocks are inlined, as in
    :class:`~kvsim.cache.block_pool.BlockPool`; the policy hears of each batch once."""

    def __init__(self, num_blocks: int, enable_caching: bool = True, policy=None):
        super().__init__(num_blocks, enable_caching, policy)
        policy.attach(self)
        if policy.takes_late_fills:
            self.opens_in_bulk = "new_fills"
        self.hears_private_fills = self.caches_unreachable = policy.hears_private_fills

    @property
    def orders_fills(self) -> bool:
        return self.policy.orders_fills

    def takes_new_fills(self, block_hashes: list, num_new_blocks: int,
                        num_private: int = 0) -> bool:
        """Whether blocks filled with these distinct hashes (and ``num_private`` private
        blocks) may be registered after the (at most ``num_new_blocks``) blocks taken
        meanwhile (:meth:`get_new_blocks` told how many came before each): no block holds
        any of them and the policy allows it."""
        return self.index._map.keys().isdisjoint(block_hashes) and (
            self.policy.takes_new_fills(block_hashes, num_new_blocks, num_private))

    def order_fills(self, block_ids: list[int]) -> None:
        """The blocks just registered late were filled in this order."""
        self.policy.order_fills(block_ids)

    # --- queries -------------------------------------------------------------------------

    def cached_free_order(self) -> list[int]:
        return self.policy.order()

    # --- actions -------------------------------------------------------------------------

    def begin(self, request_id, priority: int = 0) -> None:
        self.policy.begin(request_id)

    def get_new_blocks(self, n: int, fills_before: list[int] | None = None) -> list[int]:
        """``n`` blocks, unhashed ones first; ``fills_before`` (a decode run's, see
        :meth:`takes_new_fills`): blocks filled before each, to be registered later."""
        taken = self._take_unhashed(n)
        if n > len(taken):
            taken += self._evict_many(n - len(taken), fills_before and fills_before[len(taken):])
        set_all(self.ref_counts, taken, 1)
        return taken

    def touch(self, block_ids: Iterable[int]) -> None:
        refs, hashes, free = self.ref_counts, self.block_hashes, self._free
        hit, acquired = [], []
        for block_id in block_ids:
            if hashes[block_id] is None:
                if refs[block_id] == 0:
                    del free[block_id]
            else:
                if refs[block_id] == 0:
                    acquired.append(block_id)
                hit.append(block_id)
            refs[block_id] += 1
        if hit:
            self.num_cached_free_blocks -= len(acquired)
            self.policy.acquire_many(acquired)
            self.policy.hit_many(hit)

    def free_blocks(self, ordered_block_ids: Iterable[int]) -> None:
        released, first = self._drop_refs(ordered_block_ids)
        self._prepend(first)
        if released:
            self.num_cached_free_blocks += len(released)
            self.policy.release_many(released)

    def cache_blocks(self, block_ids, block_hashes, depth: int = 0, parent=None) -> None:
        block_ids, block_hashes = list(block_ids), list(block_hashes)
        if len(block_ids) != len(block_hashes):        # zip's pairs
            n = min(len(block_ids), len(block_hashes))
            block_ids, block_hashes = block_ids[:n], block_hashes[:n]
        set_each(self.block_hashes, block_ids, block_hashes)
        self.index.insert_many(block_hashes, block_ids)
        self.policy.fill_many(block_ids, block_hashes)

    def fill_private(self, block_ids: list[int]) -> None:
        """Held blocks filled with content only their request can reach (not indexed: see
        the module docstring); the policy hears of it now."""
        self.policy.fill_private(block_ids)

    def register_filled(self, block_ids: list[int], block_hashes: list[int]) -> None:
        """Index held blocks whose fill the policy heard of (:meth:`fill_private`): their
        request was preempted and may look them up."""
        set_each(self.block_hashes, block_ids, block_hashes)
        self.index.insert_many(block_hashes, block_ids)

    def cache_unreachable(self, block_ids: list[int], parent: int | None = None,
                          chain_mark=None) -> None:
        """Held blocks whose fill the policy heard of (:meth:`fill_private`) became content
        no lookup can reach: cached, in no index."""
        set_all(self.block_hashes, block_ids, UNREACHABLE)

    def reset_prefix_cache(self) -> bool:
        if not self.can_reset():
            return False
        self._free = OrderedDict.fromkeys(list(self._free) + self.policy.order())
        self.policy.reset()
        self.index.clear()
        self.block_hashes = [None] * self.num_blocks
        self.num_cached_free_blocks = 0
        return True

    # --- internals -----------------------------------------------------------------------

    def _evict_many(self, n: int, fills_before: list[int] | None = None) -> list[int]:
        """The policy's next ``n`` victims, uncached."""
        victims = self.policy.victims(n, fills_before)
        self._forget_hashes(victims)
        self.num_cached_free_blocks -= n
        self.num_evictions += n
        return victims
