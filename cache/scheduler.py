"""Continuous batching with vLLM v1's decisions (``vllm/v1/core/sched/scheduler.py``).

Each :meth:`Scheduler.schedule` call plans one engine step:

1. running requests, in queue order, each get the tokens they still need (1 when decoding; a
   prefill chunk otherwise), capped by the token budget and ``long_prefill_token_threshold``;
   when one cannot get a block, the scheduler preempts (by recompute) the last running request
   (FCFS) or the worst by (priority, arrival) (priority policy) until it fits or is itself the
   victim. With ``preemption_mode="swap"`` and a host tier (:mod:`kvsim.cache.tiered`), a
   victim's computed blocks are swapped out instead and swapped back in when it resumes (by
   recompute when the host has no room);
2. only if nobody was preempted, waiting requests are admitted in queue order while the budget,
   ``max_num_seqs`` and the KV pool allow: a prefix lookup, a check that the whole sequence fits
   (vLLM's ``scheduler_reserve_full_isl``), then allocation; the first one that does not fit
   stops admission.

:meth:`Scheduler.update_from_output` then commits the step: requests that reached the end of
their tokens emit one output token; those done are freed, in scheduling order. Its
:class:`~kvsim.cache.step_plan.StepOutcome` carries what the step log needs of the cache (its
:class:`~kvsim.cache.step_plan.KvUsage`, the prefix lookups of the step), so nobody outside
the scheduler reads the KV manager.

:meth:`Scheduler.plan_decode_run` and :meth:`Scheduler.commit_decode_run` take a stretch of
decode-only steps at once (:mod:`kvsim.cache.decode_run`, planned and committed by the
scheduler's base :class:`~kvsim.cache.run_planning.DecodeRunPlanning`), with the same decisions,
block ids and copies as planning them one step at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from itertools import chain

from kvsim.cache.kv_cache_manager import KVCacheManager
from kvsim.cache.prefix_hit import CacheHit
from kvsim.cache.request_queue import make_queue
from kvsim.cache.request_state import RequestState, RequestStatus
from kvsim.cache.run_planning import DecodeRunPlanning
from kvsim.cache.step_plan import KvUsage, ScheduledRequest, StepOutcome, StepPlan

PREEMPTION_MODES = ("recompute", "swap")


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling knobs, named as vLLM's."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    enable_chunked_prefill: bool = True
    reserve_full_sequence: bool = True
    preemption_mode: str = "recompute"

    def __post_init__(self) -> None:
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, "
                             f"got {self.preemption_mode!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        make_queue(self.policy)


class Scheduler(DecodeRunPlanning):
    """Decides every step which requests run, with how many tokens, and who is preempted."""

    def __init__(self, kv: KVCacheManager, config: SchedulerConfig | None = None):
        self.kv = kv
        self.config = config or SchedulerConfig()
        self.waiting = make_queue(self.config.policy)
        # vLLM's kv_holding_waiting: admitted requests holding their blocks while a CPU hit
        # loads; drained before the waiting queue once loaded (the next step), as new ones
        self.holding = make_queue(self.config.policy)
        self.running: list[RequestState] = []
        self.num_preemptions = 0
        self._last: dict[RequestState, int] = {}
        policy = getattr(getattr(kv, "pool", None), "policy", None)
        # a policy that reads the waiting queue (lookahead) is told who waits; it looks as
        # far ahead as one step could admit
        self._queue_reader = policy if hasattr(policy, "enqueue") else None
        if self._queue_reader is not None and self._queue_reader.window is None:
            self._queue_reader.window = self.config.max_num_seqs
        self._queries_at_schedule = (0, 0)    # prefix stats when the last step was planned
        self._run = None        # the decode run planned last (until a step is)
        # external fragmentation depends on the next waiting request (not in paged layouts)
        self._external = not isinstance(kv, KVCacheManager)
        self._host = getattr(kv, "host", None)
        # a KV connector makes its offers once a step is planned (vLLM's build_connector_meta)
        self._end_schedule = getattr(kv, "end_schedule", None)

    # --- queries -------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.holding)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.running) or bool(self.waiting) or bool(self.holding)

    # --- actions -------------------------------------------------------------------------

    def add(self, seq: RequestState) -> None:
        """Queue a new request."""
        seq.status = RequestStatus.WAITING
        self.waiting.add(seq)
        if self._queue_reader is not None:
            self._queue_reader.enqueue(seq.request_id, partial(self.kv._lookup_hashes, seq))

    def schedule(self) -> StepPlan:
        """Plan one step; the scheduled tokens count as computed from here on."""
        stats = self.kv.prefix_stats
        self._queries_at_schedule = (stats.num_queries_tokens, stats.num_hit_tokens)
        self._run = None
        self.kv.begin_step()
        scheduled: dict[RequestState, int] = {}
        preempted: list[RequestState] = []
        threshold = self._prefill_threshold()
        budget = self._schedule_running(scheduled, preempted, threshold)
        admitted: list[RequestState] = []
        if not preempted:
            self._schedule_waiting(scheduled, admitted, budget, threshold)
        if self._end_schedule is not None:
            self._end_schedule([s.request_id for s in scheduled])
        plan = StepPlan(preempted=[s.request_id for s in preempted],
                        admitted=[s.request_id for s in admitted],
                        block_table=self.kv.block_ids_ref)
        plan.transfers.extend(self.kv.take_transfers())
        add = plan.scheduled.append
        for seq, n in scheduled.items():
            add(ScheduledRequest(seq.request_id, n, seq.num_computed_tokens))
            seq.num_computed_tokens += n
        self._last = scheduled
        return plan

    def update_from_output(self) -> StepOutcome:
        """Commit the last planned step: emit tokens, finish and free completed requests."""
        first, finished, emitted = [], [], 0
        running, max_len = RequestStatus.RUNNING, self.config.max_model_len
        for seq in self._last:
            if (seq.status is not running
                    or seq.num_computed_tokens < seq.num_prompt_tokens + seq.num_output_tokens):
                continue
            seq.num_output_tokens += 1
            emitted += 1
            if seq.num_output_tokens == 1:
                first.append(seq)
            if (seq.num_output_tokens >= seq.max_tokens
                    or seq.num_prompt_tokens + seq.num_output_tokens >= max_len):
                self._finish(seq)
                finished.append(seq)
        if finished:
            done = set(finished)
            self.running = [s for s in self.running if s not in done]
        self._last = {}
        stats, (q0, h0) = self.kv.prefix_stats, self._queries_at_schedule
        return StepOutcome(first, finished, emitted, self._usage(),
                           stats.num_queries_tokens - q0, stats.num_hit_tokens - h0)

    def _usage(self) -> KvUsage:
        kv, pool = self.kv, self.kv.pool
        nxt = self.waiting.peek() if self._external and self.waiting else None
        seqs = self.running if not self.holding else [*self.running, *self.holding]
        tokens, reserved, internal, external = kv.fragmentation(seqs, nxt)
        host = self._host
        return KvUsage(pool.num_used_blocks, pool.num_cached_free_blocks, tokens, reserved,
                       internal, external,
                       host.num_cached_blocks + host.num_pinned_blocks if host else 0)

    # --- running requests ----------------------------------------------------------------

    def _prefill_threshold(self) -> int:
        eligible = len(self.running) + len(self.waiting) + len(self.holding)
        return self.config.long_prefill_token_threshold if eligible > 1 else 0

    def _schedule_running(self, scheduled, preempted, threshold) -> int:
        budget, i = self.config.max_num_batched_tokens, 0
        bs, max_len = self.kv.block_size, self.config.max_model_len
        every_step = (getattr(self.kv, "frees_skipped_blocks", False)
                      or getattr(self.kv, "allocates_every_step", False))
        running = self.running
        while i < len(running) and budget > 0:
            seq = running[i]
            computed = seq.num_computed_tokens
            n = seq.num_prompt_tokens + seq.num_output_tokens - computed
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                n = budget
            if n > max_len - computed - 1:
                n = max_len - computed - 1
            if n <= 0:
                i += 1
                continue
            if n > 1 or computed % bs == 0 or (computed + 1) % bs == 0 or every_step:
                # (a decode step inside a block neither opens nor fills one: nothing to do,
                # unless a windowed group frees the blocks that left its window: vLLM's
                # allocate_slots runs remove_skipped_blocks for every scheduled request)
                fits, i, budget = self._allocate_or_preempt(seq, n, i, budget, scheduled,
                                                            preempted)
                if not fits:
                    break
            scheduled[seq] = n
            budget -= n
            i += 1
        return budget

    def _allocate_or_preempt(self, seq, n, i, budget, scheduled, preempted):
        """Allocate ``n`` slots for ``seq``, preempting victims until it fits or is one."""
        while self.kv.allocate(seq.request_id, seq, n,
                               num_computed_tokens=seq.num_computed_tokens) is None:
            victim = self._pick_victim()
            j = len(self.running) - 1
            if victim is not self.running[j]:
                j = self.running.index(victim)
            del self.running[j]
            if j < i:
                i -= 1
            if victim in scheduled:
                budget += scheduled.pop(victim)
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False, i, budget
        return True, i, budget

    def _pick_victim(self) -> RequestState:
        if self.config.policy == "priority":
            return max(self.running, key=lambda s: (s.priority, s.arrival_s, s.request_id))
        return self.running[-1]

    def _preempt(self, seq: RequestState) -> None:
        rid, computed = seq.request_id, seq.num_computed_tokens
        if self.config.preemption_mode == "swap" and self.kv.can_swap_out(rid, computed):
            self.kv.swap_out(rid, computed)
        else:
            self.kv.free(rid)
            seq.num_computed_tokens = 0
        seq.status = RequestStatus.PREEMPTED
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend(seq)
        if self._queue_reader is not None:
            self._queue_reader.enqueue(seq.request_id, self.kv._lookup_hashes(seq), front=True)

    # --- waiting requests ----------------------------------------------------------------

    def _schedule_waiting(self, scheduled, admitted, budget, threshold) -> None:
        """Admit waiting requests in order while seats and budget last: first those holding
        blocks whose CPU hit has loaded (loads finish by the next step), then new ones; a
        request whose hit must load takes its blocks now and waits in :attr:`holding`
        (vLLM's WAITING_FOR_REMOTE_KVS), taking no seat meanwhile."""
        skipped, loading = [], []
        while budget > 0 and len(self.running) < self.config.max_num_seqs:
            if self.holding:
                n = self._resume_loaded(self.holding.peek(), threshold, budget)
                if n is None:
                    break
                seq = self.holding.pop()
                admitted.append(seq)        # (vLLM's SCHEDULED: it leaves the queue now)
                scheduled[seq] = n
                budget -= n
                continue
            if not self.waiting:
                break
            seq = self.waiting.peek()
            hit = self._lookup(seq)
            if hit.deferred:        # the connector cannot tell yet: the next one may go
                skipped.append(self.waiting.pop())
                continue
            # (a load is scheduled no tokens: no chunking rule can refuse it)
            n = 0 if hit.load_async else self._num_new_tokens(seq, hit.num_tokens, threshold,
                                                              budget)
            if n is None or not self._can_admit(seq, hit) or not self._allocate_admitted(
                    seq, hit, n, loading):
                break
            self._admit(seq, hit)
            if hit.load_async:
                loading.append(seq)
                continue
            admitted.append(seq)
            scheduled[seq] = n
            budget -= n
        for seq in reversed(skipped):
            self.waiting.prepend(seq)
        for seq in loading:
            self.holding.add(seq)

    def _allocate_admitted(self, seq: RequestState, hit: CacheHit, n: int,
                           loading: list) -> bool:
        """Allocate ``seq``'s hit and ``n`` new tokens (none while a CPU hit loads, which
        must leave the blocks in-flight prefills need: :meth:`_can_load`); False if not."""
        if hit.load_async:
            return self._can_load(seq, hit, loading) and self.kv.allocate(
                seq.request_id, seq, 0, hit) is not None
        return self.kv.allocate(seq.request_id, seq, n, hit) is not None

    def _can_load(self, seq: RequestState, hit: CacheHit, loading: list) -> bool:
        """Whether ``seq``'s blocks for a CPU hit to load fit beside what the requests being
        prefilled or loaded (``loading``: those admitted to load in this step) still need for
        their whole sequence (vLLM's ``_inflight_prefill_reserved_blocks``: a load holds its
        blocks without progress and cannot be preempted, so it must not take blocks a
        prefill counts on). A decoding request needs none: its blocks hold its tokens."""
        kv, cap = self.kv, self.config.max_model_len
        reserved = sum(kv.num_blocks_needed(s.request_id, max(
            0, min(len(s), cap) - kv.num_slots(s.request_id))) for s in chain(
                self.running, self.holding, loading))
        return kv.can_allocate(seq.request_id, 0, hit, reserve=reserved)

    def _resume_loaded(self, seq: RequestState, threshold: int, budget: int) -> int | None:
        """Tokens to schedule for ``seq``, a request of :attr:`holding` whose load is done,
        joining the running ones as a waiting request would (its blocks so far held; with
        a full-sequence reserve, the rest must fit); None when it cannot be."""
        n = self._num_new_tokens(seq, seq.num_computed_tokens, threshold, budget)
        rid = seq.request_id
        if n is None or (self.config.reserve_full_sequence and not self.kv.can_allocate(
                rid, min(len(seq), self.config.max_model_len) - self.kv.num_slots(rid))):
            return None
        if self.kv.allocate(rid, seq, n, num_computed_tokens=seq.num_computed_tokens) is None:
            return None
        seq.status = RequestStatus.RUNNING
        self.running.append(seq)
        return n

    def _lookup(self, seq: RequestState) -> CacheHit:
        """Where admitting ``seq`` starts: its swapped-out blocks, or a prefix hit."""
        if self.config.preemption_mode == "swap" and self.kv.is_swapped(seq.request_id):
            return self.kv.swapped_hit(seq, seq.request_id)
        return self.kv.lookup(seq) if self.kv.enable_prefix_caching else CacheHit()

    def _can_admit(self, seq: RequestState, hit: CacheHit) -> bool:
        if not self.config.reserve_full_sequence:
            return True
        full = min(len(seq), self.config.max_model_len)
        return self.kv.can_allocate(seq.request_id, full - hit.num_tokens, hit)

    def _admit(self, seq: RequestState, hit: CacheHit) -> None:
        self.waiting.pop()
        if self._queue_reader is not None:
            self._queue_reader.dequeue(seq.request_id)
        self._start_running(seq, hit)

    def _start_running(self, seq: RequestState, hit: CacheHit) -> None:
        """``seq``, its blocks allocated, joins the running requests (one whose CPU hit
        loads first waits in :attr:`holding`)."""
        if self.kv.enable_prefix_caching:   # with caching off vLLM records no prefix stats
            self._record_lookup(seq, hit)
        if seq.num_cached_tokens < 0:
            seq.num_cached_tokens = hit.num_tokens
        seq.num_computed_tokens = hit.num_tokens
        if hit.load_async:
            if hit.num_tokens >= len(seq):
                # a whole prompt loaded: its last token is computed again, to sample the next
                seq.num_computed_tokens = len(seq) - 1
            return          # (it waits in ``holding`` until loaded)
        seq.status = RequestStatus.RUNNING
        self.running.append(seq)

    def _record_lookup(self, seq: RequestState, hit: CacheHit) -> None:
        if seq.num_preemptions == 0:    # a resumed request's lookup is not counted again
            self.kv.record_query(len(seq), hit)

    def _num_new_tokens(self, seq: RequestState, computed: int, threshold: int,
                        budget: int) -> int | None:
        """Tokens a waiting request would be scheduled; None when, without chunked prefill,
        they (capped by the threshold first, as vLLM does) do not fit the budget."""
        n = seq.num_prompt_tokens + seq.num_output_tokens - computed
        if 0 < threshold < n:
            n = threshold
        if n > budget and not self.config.enable_chunked_prefill:
            return None
        return min(n, budget)

    # --- finishing -----------------------------------------------------------------------

    def _finish(self, seq: RequestState) -> None:
        seq.status = RequestStatus.FINISHED     # (first: the KV manager reads it when freeing)
        self.kv.free(seq.request_id)
        seq.release_hashes()

