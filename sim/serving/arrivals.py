"""The trace's requests reaching the replicas, each at its arrival time.

:class:`Arrivals` is the SimPy process that routes every request when it arrives (the request
log records it, a long prompt is cut or rejected as vLLM would, the router picks a replica,
which queues it). It is also what a replica's decode run reads as its horizon: the next request
not yet routed (:class:`~kvsim.sim.serving.replica.NextArrival`). A run may take that request
over before its time (:meth:`Arrivals.hand_over`): with one replica and nobody watching the
request log, where its arrival changes nothing but the one replica's queue, the run can admit
it at the step where the scheduler would, and the process then skips it when its time comes.
"""

from __future__ import annotations

import math

from kvsim.cache.request_state import RequestState
from kvsim.workloads.identity import NamedSequences
from kvsim.workloads.truncate import truncate

from kvsim.sim.serving.replica import NextArrival


_DONE = object()        # (no request follows)


class Arrivals(NextArrival):
    """Routes ``requests`` (in arrival order; an iterator is read as the run goes) to
    ``replicas`` at their arrival times; start :meth:`process` as a SimPy process."""

    def __init__(self, env, requests, replicas, router, log, config, max_model_len: int,
                 sharing=None) -> None:
        self.env, self.replicas, self.router, self.log = env, replicas, router, log
        self.block_size, self.max_model_len, self.sharing = (config.block_size, max_model_len,
                                                            sharing)
        self.truncating = config.long_prompt == "truncate"
        self.greedy = config.sampling == "greedy"
        self.named = NamedSequences()       # (a continuation's ids start from its parent's)
        self._requests = iter(requests)
        self._pending = None        # the next request not routed yet (read once started)
        self._after = None          # the one after it, once read ahead (_DONE: none)
        self._state: RequestState | None = None     # its RequestState, once built
        self.time_s = 0.0

    def process(self):
        """Route each request at its arrival time, unless a run took it over meanwhile."""
        self._advance()
        while self._pending is not None:
            request = self._pending
            if request.arrival_s > self.env.now:
                yield self.env.timeout(request.arrival_s - self.env.now)
            if request is self._pending:
                index, seq = self._route()
                if seq is not None:
                    self.replicas[index].submit(seq)
        self.named = None       # (the requests still running hold it; it goes with them)

    def hand_over(self, replica) -> RequestState | None:
        """The next request, for ``replica``'s decode run to admit before its time (the run
        then calls :meth:`take`): only with one replica and no watch on the request log, and
        only a request that no lookup can hit and that is neither cut nor rejected. None
        otherwise (the run ends before the step that would admit it)."""
        request = self._pending
        if (request is None or len(self.replicas) != 1 or self.log.watch is not None
                or request.prompt_tokens >= self.max_model_len
                or (self.truncating and request.prompt_tokens + request.output_tokens
                    > self.max_model_len)):
            return None
        if self._state is None:
            self._state = RequestState(request, self.block_size, self.greedy, self.named)
        return self._state if self._state.has_private_blocks else None

    def following_s(self) -> float:
        """When the request after the next one arrives (``inf`` when none does)."""
        if self._after is None and self._pending is not None:
            self._after = next(self._requests, _DONE)
        return math.inf if self._after is None or self._after is _DONE else self._after.arrival_s

    def take(self) -> RequestState:
        """Route the request :meth:`hand_over` offered to the run that admits it now."""
        index, seq = self._route()
        self.replicas[index].outstanding_tokens += seq.num_prompt_tokens + seq.max_tokens
        return seq

    def _route(self) -> tuple[int, RequestState | None]:
        """Log, cut, name and route the pending request, and move on to the next one; the
        replica's index and the request (None: rejected)."""
        request, seq = self._pending, self._state
        self._advance()
        log = self.log
        log.on_arrival(request, -1)
        if self.truncating and truncate(request, self.max_model_len):
            log.on_truncated(request)
            seq = None
        if seq is None:
            seq = RequestState(request, self.block_size, self.greedy, self.named)
        if self.sharing is not None:
            seq.num_shared_blocks = self.sharing.num_shared_blocks(request, self.block_size,
                                                                   self.greedy)
        index = self.router.choose(self.replicas, seq)  # a replica answers the rejection
        log.on_routed(request.request_id, index)
        if request.prompt_tokens >= self.max_model_len:
            log.on_rejected(request.request_id)
            return index, None
        return index, seq

    def _advance(self) -> None:
        after, self._after, self._state = self._after, None, None
        self._pending = next(self._requests, None) if after is None else (
            None if after is _DONE else after)
        self.time_s = math.inf if self._pending is None else self._pending.arrival_s
