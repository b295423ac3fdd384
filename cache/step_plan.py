"""What one engine step does, as data: the seam between cache logic and executors.

The scheduler fills a :class:`StepPlan`; an executor (the cost model in ``kvsim.sim`` or real
tensors in ``kvsim.real_backend``) turns it into elapsed time; committing the step gives a
:class:`StepOutcome` (with the pool as it left it, :class:`KvUsage`). Nothing here performs
anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from kvsim.cache.request_state import RequestState

# Kinds of block copies a step may ask for.
SWAP_OUT = "swap_out"        # GPU -> CPU, a preempted request's blocks (swap preemption)
SWAP_IN = "swap_in"          # CPU -> GPU, a swapped request resuming
OFFLOAD = "offload"          # GPU -> CPU, an evicted cached block demoted to the host tier
PROMOTE = "promote"          # CPU -> GPU, a host-resident prefix hit brought back
COMPACT = "compact"          # GPU -> GPU, a live region moved by compaction
TRANSFER_KINDS = (SWAP_OUT, SWAP_IN, OFFLOAD, PROMOTE, COMPACT)
HOST_TO_DEVICE = (SWAP_IN, PROMOTE)
DEVICE_TO_HOST = (SWAP_OUT, OFFLOAD)


def _no_blocks(request_id: int) -> list[int]:
    return []


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step: ``num_new_tokens`` computed on top of
    ``num_computed_tokens`` tokens whose KV is already in the cache."""

    request_id: int
    num_new_tokens: int
    num_computed_tokens: int

    @property
    def context_len(self) -> int:
        """Tokens attended to by the last new token (cached ones plus this step's)."""
        return self.num_computed_tokens + self.num_new_tokens


@dataclass(slots=True)
class BlockTransfer:
    """Copies of whole blocks: ``pairs`` of (source block id, destination block id)."""

    kind: str
    pairs: list[tuple[int, int]]

    @property
    def num_blocks(self) -> int:
        return len(self.pairs)


@dataclass(slots=True)
class StepPlan:
    """Everything one engine step computes and copies, in scheduling order.

    ``admitted`` names the requests that joined the running batch this step (new or resumed;
    one that loaded a CPU hit first joins when it leaves the holding queue, as vLLM records it
    SCHEDULED), ``preempted`` those sent back to waiting.

    ``block_table(request_id)`` gives a scheduled request's block ids for this step (an
    executor that touches real memory needs them; read them during the step, never change
    them).
    """

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    transfers: list[BlockTransfer] = field(default_factory=list)
    block_table: Callable[[int], list[int]] = _no_blocks

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.transfers

    def num_transfer_blocks(self, kind: str) -> int:
        return sum(t.num_blocks for t in self.transfers if t.kind == kind)


@dataclass(slots=True, frozen=True)
class KvUsage:
    """The KV pool after a step: blocks in use, cached blocks no request holds, the slot counts
    of :meth:`~kvsim.cache.KVCacheManager.fragmentation`, and host blocks holding data."""

    num_used_blocks: int
    num_cached_idle_blocks: int
    num_token_slots: int
    num_reserved_slots: int
    num_internal_slots: int
    num_external_slots: int
    num_host_used_blocks: int


@dataclass(slots=True)
class StepOutcome:
    """What committing a step produced, and the cache as it left it."""

    first_tokens: list[RequestState]
    finished: list[RequestState]
    num_output_tokens: int
    usage: KvUsage
    num_prefix_queries_tokens: int = 0   # prompt tokens looked up by this step's admissions
    num_prefix_hit_tokens: int = 0       # and found cached
