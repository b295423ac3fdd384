"""Eviction policies by name, and the block pool each one runs on.

The two factories of :mod:`kvsim.cache`'s eviction code, kept apart from the policy and pool
classes so that none of those modules imports another in a circle:

- :func:`make_policy`: a fresh policy of :data:`~kvsim.cache.policies.POLICY_NAMES`;
- :func:`make_pool`: the pool for a policy, by its ``pool_class``: the plain
  :class:`~kvsim.cache.block_pool.BlockPool` for LRU (vLLM's code path), a
  :class:`~kvsim.cache.queue_pool.QueuePool` for the queue policies (ARC, S3-FIFO), the FIFO
  lanes of a :class:`~kvsim.cache.lane_pool.LanePool` for ``hybrid`` and ``priority`` (a
  :class:`~kvsim.cache.lookahead_pool.LookaheadPool` for ``lookahead``), and a
  :class:`~kvsim.cache.scored_pool.ScoredBlockPool` for every other scored policy (``lfu``).
"""

from __future__ import annotations

from kvsim.cache.block_pool import BlockPool
from kvsim.cache.lane_pool import LanePool
from kvsim.cache.lookahead import LookaheadPolicy
from kvsim.cache.lookahead_pool import LookaheadPool
from kvsim.cache.policies import (POLICY_NAMES, BeladyOracle, BeladyPolicy, CachePolicy, HybridPolicy,
                       LFUPolicy, LRUPolicy, PriorityPolicy)
from kvsim.cache.arc import ARCPolicy
from kvsim.cache.queue_pool import QueuePool
from kvsim.cache.s3fifo import S3FIFOPolicy
from kvsim.cache.scored_pool import ScoredBlockPool

POLICY_CLASSES = {"lru": LRUPolicy, "lfu": LFUPolicy, "priority": PriorityPolicy,
                  "hybrid": HybridPolicy, "arc": ARCPolicy, "s3fifo": S3FIFOPolicy,
                  "lookahead": LookaheadPolicy}
POOL_CLASSES = {"queue": QueuePool, "lanes": LanePool, "lookahead": LookaheadPool}


def make_policy(name: str, oracle: BeladyOracle | None = None) -> CachePolicy:
    """A fresh policy (policies hold state: make one per pool)."""
    if name == "belady":
        if oracle is None:
            raise ValueError("the belady policy needs an oracle built from the whole trace")
        return BeladyPolicy(oracle)
    if name not in POLICY_CLASSES:
        raise ValueError(f"unknown eviction policy {name!r}; expected one of "
                         f"{', '.join(POLICY_NAMES)}")
    return POLICY_CLASSES[name]()


def make_pool(num_blocks: int, enable_caching: bool = True, policy=None) -> BlockPool:
    """A pool of ``num_blocks`` blocks evicting in ``policy``'s order (None: LRU)."""
    if policy is None or policy.is_lru:
        return BlockPool(num_blocks, enable_caching, policy)
    pool_class = POOL_CLASSES.get(getattr(policy, "pool_class", None), ScoredBlockPool)
    return pool_class(num_blocks, enable_caching, policy)
