"""The cache engine: pure logic, no simpy, no torch, no I/O.

It decides what happens to KV blocks and returns physical effects as data
(:class:`~kvsim.cache.step_plan.StepPlan`).
"""

from .block_pool import BlockPool, PrefixIndex
from .host_tier import HostTier
from .kv_cache_manager import BlockHashSource, CacheHit, KVCacheManager, PrefixCacheStats
from .step_plan import BlockTransfer, ScheduledRequest, StepPlan
from .tiered import TieredKVCacheManager

__all__ = [
    "BlockHashSource", "BlockPool", "BlockTransfer", "CacheHit", "HostTier", "KVCacheManager",
    "PrefixCacheStats", "PrefixIndex", "ScheduledRequest", "StepPlan", "TieredKVCacheManager",
]
