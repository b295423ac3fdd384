"""One serving replica as a SimPy process: schedule a step, ask the executor how long it takes,
wait that long, commit the outputs, repeat.

Runs of decode-only steps can be *skipped ahead*: when every running request only decodes, no
waiting request can be admitted and no allocation can fail, the per-request bookkeeping of the
next steps is done lazily (only at the steps where a request fills or opens a block), while each
step still takes its own SimPy timeout. Decisions, block ids and timings are identical to
stepping one iteration at a time (``tests/test_sim_skip_ahead.py`` checks it). Only the paged
layout skips ahead (the runner turns it off for the others). With a host tier, the copies the
lazy steps cause (demotions, write-through) are charged to their step by the executor's
``transfer_time``, exactly as :meth:`~kvsim.sim.cost_model.CostModel.step_duration` would.
"""

from __future__ import annotations

import numpy as np
import simpy

from kvsim.cache.kv_cache_manager import KVCacheManager
from kvsim.cache.scheduler import Scheduler, StepOutcome
from kvsim.cache.sequence import Sequence
from kvsim.cache.step_plan import COMPACT, OFFLOAD, PROMOTE, SWAP_IN, SWAP_OUT, StepPlan

#: Block-copy kinds in the order of the step log's columns.
COPY_KINDS = (SWAP_OUT, SWAP_IN, OFFLOAD, PROMOTE, COMPACT)

from .executor import DecodeRunPredictor, Executor
from .recorder import RequestLog, StepLog, StepRecord


class Replica:
    """A scheduler, its KV cache and an executor, driven by simulated time."""

    def __init__(self, env: simpy.Environment, index: int, scheduler: Scheduler,
                 executor: Executor, steps: StepLog, requests: RequestLog,
                 skip_ahead: bool = True):
        self.env = env
        self.index = index
        self.scheduler = scheduler
        self.kv = scheduler.kv
        self.executor = executor
        self.steps = steps
        self.requests = requests
        self.skip_ahead = skip_ahead and isinstance(executor, DecodeRunPredictor)
        self.outstanding_tokens = 0
        self.num_arrivals = 0
        self.num_finished = 0
        self._wakeup = env.event()
        self._idle = False
        self._decode_only = False   # the last step only decoded: worth trying to skip ahead
        self.num_skipped_steps = 0  # steps taken on the lazy decode path
        # external fragmentation depends on the next waiting request (not in paged layouts)
        self._external = not isinstance(self.kv, KVCacheManager)
        self._host = getattr(self.kv, "host", None)
        self._transfer_time = getattr(executor, "transfer_time", None)
        self.process = env.process(self._run())

    # --- arrivals ------------------------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        """Queue a request on this replica (called at its arrival time)."""
        self.scheduler.add(seq)
        self.num_arrivals += 1
        self.outstanding_tokens += seq.num_prompt_tokens + seq.max_tokens
        if self._idle:
            self._idle = False
            self._wakeup.succeed()

    # --- the loop ------------------------------------------------------------------------

    def _run(self):
        while True:
            if not self.scheduler.has_unfinished():
                self._idle = True
                yield self._wakeup
                self._wakeup = self.env.event()
                continue
            window = self._decode_window() if self._decode_only else 0
            if window:
                yield from self._skip_decode_steps(window)
            else:
                yield from self._step()

    def _step(self):
        now = self.env.now
        stats = self.kv.prefix_stats
        q0, h0 = stats.num_queries_tokens, stats.num_hit_tokens
        plan = self.scheduler.schedule()
        if plan.is_empty:
            raise RuntimeError(f"replica {self.index}: the scheduler made no progress at "
                               f"t={now:.6f}s with {self.scheduler.num_waiting} waiting")
        for request_id in plan.admitted:
            self.requests.on_scheduled(request_id, now)
        duration = self.executor.step_duration(plan)
        yield self.env.timeout(duration)
        outcome = self.scheduler.update_from_output()
        self._decode_only = (self.skip_ahead and not plan.admitted and not plan.preempted
                             and plan.num_scheduled_tokens == len(plan.scheduled))
        self._commit(outcome)
        self._log_step(now, duration, plan, outcome, stats.num_queries_tokens - q0,
                       stats.num_hit_tokens - h0)

    def _commit(self, outcome: StepOutcome) -> None:
        now = self.env.now
        for seq in outcome.first_tokens:
            self.requests.on_first_token(seq, now)
        for seq in outcome.finished:
            self.requests.on_finish(seq, now)
        self.num_finished += len(outcome.finished)

    def _log_step(self, t0, duration, plan: StepPlan, outcome, queries, hits) -> None:
        scheduled = plan.num_scheduled_tokens
        self.outstanding_tokens -= scheduled
        sched = self.scheduler
        running = sched.running
        tokens, reserved, internal, external = self.kv.fragmentation(
            running, sched.waiting.peek() if self._external and sched.waiting else None)
        moved = self._transfer_time(plan) if plan.transfers and self._transfer_time else 0.0
        self.steps.append(StepRecord(
            t0, duration, self.index, len(plan.scheduled), scheduled, outcome.num_output_tokens,
            len(running), sched.num_waiting, self.kv.pool.num_used_blocks,
            self.kv.pool.num_cached_free_blocks, tokens, internal, reserved, external,
            len(plan.preempted), queries, hits,
            *map(plan.num_transfer_blocks, COPY_KINDS), self._host_used(), moved))

    def _host_used(self) -> int:
        """Host blocks holding data: cached content plus swap space."""
        host = self._host
        return host.num_cached_blocks + host.num_pinned_blocks if host is not None else 0

    # --- skipping ahead over decode-only steps -------------------------------------------

    def _decode_window(self) -> int:
        """How many decode-only steps can run lazily from now (0: take a normal step)."""
        sched = self.scheduler
        running = sched.running
        budget_left = sched.config.max_num_batched_tokens - len(running)
        if not running or budget_left < 0 or not sched.admission_blocked(budget_left):
            return 0
        max_len = sched.config.max_model_len
        steps = min(min(s.max_tokens - s.num_output_tokens, max_len - len(s)) for s in running)
        if steps < 3 or any(s.num_computed_tokens != len(s) - 1 for s in running):
            return 0
        return self._cap_by_free_blocks(steps - 1)

    def _cap_by_free_blocks(self, steps: int) -> int:
        """Largest window (<= steps) whose new blocks all fit in the free blocks."""
        bs = self.kv.block_size
        first = np.array([(-s.num_computed_tokens) % bs for s in self.scheduler.running])
        free = self.kv.num_free_blocks

        def new_blocks(w: int) -> int:
            return int(np.maximum(0, (w - 1 - first) // bs + 1).sum())

        if new_blocks(steps) <= free:
            return steps
        lo, hi = 0, steps
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if new_blocks(mid) <= free else (lo, mid - 1)
        return lo if lo >= 2 else 0

    def _skip_decode_steps(self, window: int):
        running = list(self.scheduler.running)
        bs = self.kv.block_size
        c0 = np.array([s.num_computed_tokens for s in running], dtype=np.int64)
        o0 = [s.num_output_tokens for s in running]
        durations = self.executor.decode_durations(len(running), int(c0.sum()), window)
        waiting0 = self.scheduler.num_waiting
        done = 0
        for j in range(window):
            if self.scheduler.num_waiting != waiting0:
                break
            self.kv.begin_step()
            self._lazy_block_events(running, c0, o0, j, bs)
            yield from self._lazy_step(j, running, c0, float(durations[j]),
                                       self.kv.take_transfers())
            done += 1
        self.num_skipped_steps += done
        self._sync(running, c0, o0, done)
        self._decode_only = False

    def _lazy_block_events(self, running, c0, o0, j: int, bs: int) -> None:
        """Call ``allocate`` for the requests whose step ``j`` opens or fills a block."""
        events = np.flatnonzero(((c0 + j) % bs == 0) | ((c0 + j + 1) % bs == 0))
        kv = self.kv
        for i in events.tolist():
            seq = running[i]
            seq.num_output_tokens = o0[i] + j
            kv.allocate(seq.request_id, seq, int(c0[i]) + j + 1 - kv.num_slots(seq.request_id))

    def _lazy_step(self, j: int, running, c0, duration: float, transfers):
        """One decode step of the window; ``transfers``: the host tier's copies (demotions of
        the blocks its new blocks evicted, write-through), charged as a normal step would."""
        now = self.env.now
        copies, moved = [0] * 5, 0.0
        if transfers:
            plan = StepPlan(transfers=list(transfers))
            copies = [plan.num_transfer_blocks(k) for k in COPY_KINDS]
            if self._transfer_time is not None:
                moved = self._transfer_time(plan)
                duration = duration + moved
        yield self.env.timeout(duration)
        b = len(running)
        bs = self.kv.block_size
        self.outstanding_tokens -= b
        internal = int(((-(c0 + j + 1)) % bs).sum())
        used = self.kv.pool.num_used_blocks
        self.steps.append(StepRecord(
            now, duration, self.index, b, b, b, b, self.scheduler.num_waiting, used,
            self.kv.pool.num_cached_free_blocks, used * bs - internal, internal, 0, 0, 0, 0, 0,
            *copies, self._host_used(), moved))

    def _sync(self, running, c0, o0, done: int) -> None:
        """Bring every request's counters to where ``done`` decode steps left them."""
        kv = self.kv
        for i, seq in enumerate(running):
            seq.num_computed_tokens = int(c0[i]) + done
            seq.num_output_tokens = o0[i] + done
            grow = seq.num_computed_tokens - kv.num_slots(seq.request_id)
            if grow:
                kv.allocate(seq.request_id, seq, grow)
