"""A request as the scheduler sees it: how many tokens it has, computed and still to come."""

from __future__ import annotations

import enum

from kvsim.workloads.request import Request

# Salt of the ids of blocks holding generated tokens: no trace names those tokens, so such a
# block is unique to its request (Python's hash of a tuple of ints is stable across runs).
_GENERATED = 0x3B5D7F91


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class Sequence:
    """Scheduling state of one :class:`~kvsim.workloads.Request`.

    A :class:`~kvsim.cache.BlockHashSource`: its prompt blocks carry the trace's prefix ids at the
    engine block size (computed once, on first use); a block reaching into generated tokens
    gets an id unique to the request. ``len(seq)`` is the number of tokens it has now (prompt plus generated).
    """

    __slots__ = ("request", "request_id", "arrival_s", "priority", "num_prompt_tokens",
                 "max_tokens", "num_output_tokens", "num_computed_tokens", "status",
                 "num_preemptions", "num_cached_tokens", "block_size", "_prompt_hashes")

    def __init__(self, request: Request, block_size: int):
        self.request = request
        self.request_id = request.request_id
        self.arrival_s = request.arrival_s
        self.priority = request.priority
        self.num_prompt_tokens = request.prompt_tokens
        self.max_tokens = request.output_tokens
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.status = SequenceStatus.WAITING
        self.num_preemptions = 0
        self.num_cached_tokens = -1
        self.block_size = block_size
        self._prompt_hashes: list[int] | None = None

    def __len__(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def is_prefill(self) -> bool:
        """True while the tokens it has are not all computed beyond the latest one."""
        return self.num_computed_tokens < self.num_tokens - 1

    def __lt__(self, other: "Sequence") -> bool:
        """Priority order, as vLLM's: priority, then arrival, then id."""
        return ((self.priority, self.arrival_s, self.request_id)
                < (other.priority, other.arrival_s, other.request_id))

    def block_hashes(self, start: int, end: int) -> list[int]:
        prompt = self._prompt_hashes
        if prompt is None:
            prompt = self._prompt_hashes = self.request.block_hashes(self.block_size).tolist()
        if end <= len(prompt):
            return prompt[start:end]
        rid = self.request_id
        extra = [hash((_GENERATED, rid, i)) for i in range(max(start, len(prompt)), end)]
        return prompt[start:] + extra if start < len(prompt) else extra

    def release_hashes(self) -> None:
        """Drop the cached prompt ids (a finished request no longer needs them)."""
        self._prompt_hashes = None

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id}, {self.status.value}, "
                f"computed={self.num_computed_tokens}/{self.num_tokens})")
