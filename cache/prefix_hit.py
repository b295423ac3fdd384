"""What a prefix lookup works on and returns: a sequence known by its block ids
(:class:`BlockHashSource`), the hit (:class:`CacheHit`) and the running counts of lookups
(:class:`PrefixCacheStats`), shared by every KV manager."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable


@runtime_checkable
class BlockHashSource(Protocol):
    """A token sequence known by its block ids rather than its tokens."""

    def __len__(self) -> int:
        """Number of tokens the sequence has now."""

    def block_hashes(self, start: int, end: int) -> Sequence[int]:
        """Ids of full blocks ``start..end-1`` (all within ``len(self)``)."""


@dataclass(slots=True)
class CacheHit:
    """Result of :meth:`KVCacheManager.lookup`: cached blocks from the start of a prompt.

    ``num_tokens`` counts every token the hit covers: those of the GPU ``block_ids`` and, with a
    host tier (:mod:`kvsim.cache.tiered`), those of the ``host_block_ids`` that follow them
    (copied to the GPU on allocation). ``swapped`` marks a swapped-out request's own blocks;
    ``load_async`` a hit whose host part loads before the request runs (vLLM's offloading
    connector: the request waits for the load, see :mod:`kvsim.cache.offloading`);
    ``deferred`` a lookup that cannot tell yet (the connector waits for a copy): the request
    is skipped this step, and the requests behind it may be admitted.
    """

    block_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0
    host_block_ids: list[int] = field(default_factory=list)
    swapped: bool = False
    load_async: bool = False
    deferred: bool = False


@dataclass(slots=True)
class PrefixCacheStats:
    """Prompt tokens looked up and found, counted once per admission."""

    num_queries_tokens: int = 0
    num_hit_tokens: int = 0
    num_host_hit_tokens: int = 0     # of the hit tokens, those found in a host tier

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queries_tokens if self.num_queries_tokens else 0.0

    def record(self, num_tokens: int, hit: CacheHit) -> None:
        """Count one admission's lookup of ``num_tokens`` prompt tokens that found ``hit``."""
        self.num_queries_tokens += num_tokens
        self.num_hit_tokens += hit.num_tokens
