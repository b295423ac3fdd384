"""The cache engine: pure logic, no simpy, no torch, no I/O.

It decides what happens to KV blocks and returns physical effects as data
(:class:`~kvsim.cache.step_plan.StepPlan`).
"""

from kvsim.cache.block_pool import BlockPool, PrefixIndex
from kvsim.cache.host_tier import HostTier
from kvsim.cache.kv_cache_manager import KVCacheManager
from kvsim.cache.prefix_hit import BlockHashSource, CacheHit, PrefixCacheStats
from kvsim.cache.step_plan import BlockTransfer, ScheduledRequest, StepPlan
from kvsim.cache.tiered import TieredKVCacheManager

__all__ = [
    "BlockHashSource", "BlockPool", "BlockTransfer", "CacheHit", "HostTier", "KVCacheManager",
    "PrefixCacheStats", "PrefixIndex", "ScheduledRequest", "StepPlan", "TieredKVCacheManager",
]
