"""A request as the scheduler sees it: how many tokens it has, computed and still to come."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from kvsim.workloads.identity import NamedSequences, block_ids, unique_block_ids

if TYPE_CHECKING:
    from kvsim.workloads.request import Request


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class RequestState:
    """Scheduling state of one :class:`~kvsim.workloads.Request`.

    A :class:`~kvsim.cache.BlockHashSource`: its blocks, prompt or generated, carry the ids of
    :func:`kvsim.workloads.identity.block_ids` at the engine block size (computed once, on first use);
    ``greedy`` is the sampling mode of generated tokens the trace does not record; ``named``:
    the run's :class:`~kvsim.workloads.identity.NamedSequences` (a continuation starts from
    its parent's ids).
    ``len(seq)`` is the number of tokens it has now (prompt plus generated).

    ``has_private_blocks``: its block ids are unique to it (a length-only request: no token
    ids, prefix hashes, recorded outputs or earlier request it continues), so no other request
    can hit them unless it continues this one. ``unreachable_when_finished``: private blocks of
    a request nothing can continue (``request.may_be_continued`` False): once it finished, no
    lookup can ever reach them. ``num_shared_blocks``: when set, only its first blocks may be
    hit by another request, the later ones by itself alone, after a preemption
    (:class:`~kvsim.workloads.sharing.SharedPrefixes`).
    """

    __slots__ = ("request", "request_id", "arrival_s", "priority", "num_prompt_tokens",
                 "max_tokens", "num_output_tokens", "num_computed_tokens", "status",
                 "num_preemptions", "num_cached_tokens", "block_size", "greedy", "_hashes",
                 "has_private_blocks", "unreachable_when_finished", "num_shared_blocks",
                 "_named")

    def __init__(self, request: "Request", block_size: int, greedy: bool = False,
                 named: NamedSequences | None = None):
        self.request = request
        self.request_id = request.request_id
        self.arrival_s = request.arrival_s
        self.priority = request.priority
        self.num_prompt_tokens = request.prompt_tokens
        self.max_tokens = request.output_tokens
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.num_preemptions = 0
        self.num_cached_tokens = -1
        self.block_size = block_size
        self.greedy = greedy
        self._hashes: list[int] | None = None
        self.has_private_blocks = (request.prompt_token_ids is None
                                   and request.prefix_hashes is None
                                   and getattr(request, "output_token_ids", None) is None
                                   and request.continues is None)
        self.unreachable_when_finished = (self.has_private_blocks
                                          and not getattr(request, "may_be_continued", True))
        self.num_shared_blocks: int | None = None   # see kvsim.workloads.sharing
        self._named = named         # the run's ids of the requests named so far

    def __len__(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    def __lt__(self, other: "RequestState") -> bool:
        """Priority order, as vLLM's: priority, then arrival, then id."""
        return ((self.priority, self.arrival_s, self.request_id)
                < (other.priority, other.arrival_s, other.request_id))

    def block_hashes(self, start: int, end: int) -> list[int]:
        hashes = self._hashes
        if hashes is None or (end > len(hashes) and len(hashes) < self._num_blocks()):
            hashes = self._hashes = self._compute_hashes(end)
        return hashes[start:end]

    def _num_blocks(self) -> int:
        """Full blocks of the whole sequence (prompt and every output token)."""
        return (self.num_prompt_tokens + self.max_tokens) // self.block_size

    def _compute_hashes(self, end: int) -> list[int]:
        """The ids of every block of the sequence; at first, with ``num_shared_blocks``, of
        those up to ``end`` or the last shared one (the others are needed only after a
        preemption)."""
        num_blocks = self._num_blocks()
        if self.num_shared_blocks is not None and self._hashes is None:
            num_blocks = min(num_blocks, max(end, self.num_shared_blocks))
        total = num_blocks * self.block_size
        if self.has_private_blocks and not self.greedy:    # block_ids' ids, in one go
            ids = unique_block_ids(self.request_id, 0, num_blocks)
        else:
            ids = block_ids(self.request, self.block_size, total, self.greedy, self._named)
        return ids.tolist()

    def release_hashes(self) -> None:
        """Drop the cached ids (a finished request no longer needs them)."""
        self._hashes = None

    def __repr__(self) -> str:
        return (f"RequestState({self.request_id}, {self.status.value}, "
                f"computed={self.num_computed_tokens}/{self.num_tokens})")
