"""One serving replica as a SimPy process: schedule a step, ask the executor how long it takes,
wait that long, commit the outputs, repeat. It talks to the scheduler and the executor only:
every cache decision, and every cache fact the step log records, comes from the scheduler as
data.

**Decode runs.** When the scheduler offers a run of decode-only steps
(:meth:`~kvsim.cache.Scheduler.plan_decode_run`) and the executor predicts them
(``supports_decode_runs``), the replica takes the steps of the run that *start* before the next
arrival (:class:`NextArrival`, kept by the runner's arrival process; without one, the next event
of any kind, ``env.peek()``), has the scheduler commit them at once, logs their rows in bulk and
waits out the whole stretch as one timeout. Only an arrival can read or change a replica from
outside (its routing reads every replica's outstanding tokens or cache; it may join the
replica's queue); the other replicas' steps touch their own scheduler only. So every arrival,
routing decision and other replica sees what stepping one iteration at a time would show it; an
arrival during the last step is seen by the next step, as it would be. An arrival at exactly a
step boundary fires before that step's start, as SimPy orders it (it was scheduled first, when
the arrival before it was routed), so the run stops before that step. A run may go through
steps where requests finish (with a request waiting, it ends with the first such step): each
finish is reported to the request log at the end of its step, one timeout per such step, so
watchers (the planner's early stop) see finishes when they happen; a step that finishes
requests and does not end before the next arrival is left out of the run, so that the arrival
sees them still running. The run's end time is the same sum of step durations SimPy would
make, bit for bit (``tests/test_sim_skip_ahead.py`` checks whole runs against
``--no-skip-ahead``). A request that arrives to an empty queue is admitted by a normal step
before any run is asked for (the ask would find it admissible and end there). With several
replicas the step log's rows come in another order (a replica's run logs its steps ahead of
the others'); each replica's stay in time order, and the summary's step averages agree with
stepping to rounding (about 1e-15 relative).

**Admitting arrivals.** A run need not end at an arrival it can admit itself: with one
replica and no watch on the request log, a length-only request (nothing to look up) that
arrives to nobody waiting is handed over by the arrival process
(:meth:`~kvsim.sim.serving.arrivals.Arrivals.hand_over`) when the scheduler would admit its
whole prompt at the step that starts after it, with an LRU pool and blocks to spare
(:meth:`~kvsim.cache.Scheduler.admit_in_run`). The run then admits it at that step (its prompt
a prefill beside the decodes), logs its arrival, scheduling and first token at their times,
and goes on to the next arrival. A request arriving exactly at the end of such a run is routed
before the replica steps again, as stepping would have routed it.

**Prefill runs.** A run may also carry the newest running request while it prefills a long
prompt in chunks that use up the token budget beside the decodes (four or more such chunks;
nobody can be admitted meanwhile, and it emits nothing): each step schedules its chunk after
the decodes, and the executor's ``decode_durations(..., prefill=...)`` predicts those steps.
Such a run ends with the first finish, before the chunk that completes the prompt (with a
host tier, before the first finish).

With a host tier a step's copies (demotions, write-through) are known only once it is committed
and lengthen it by the executor's ``transfer_time``, so its steps are committed one by one until
the next arrival (or, with vLLM's native offloading, until a full block waits to be offered
to the CPU again, which every step then does); they still cost one timeout together.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import simpy

from kvsim.cache.decode_run import DecodeRun, DecodeSteps
from kvsim.cache.scheduler import Scheduler
from kvsim.cache.request_state import RequestState
from kvsim.cache.step_plan import TRANSFER_KINDS, StepOutcome, StepPlan

from kvsim.sim.serving.executor import Executor, back_to_back
from kvsim.sim.serving.recorder import STEP_COLUMNS, RequestLog, StepLog, StepRecord

_COLUMN = {name: i for i, name in enumerate(STEP_COLUMNS)}     # step log column positions


class Replica:
    """A scheduler and an executor, driven by simulated time."""

    def __init__(self, env: simpy.Environment, index: int, scheduler: Scheduler,
                 executor: Executor, steps: StepLog, requests: RequestLog,
                 skip_ahead: bool = True, arrivals: NextArrival | None = None):
        self.env = env
        self.index = index
        self.scheduler = scheduler
        self.executor = executor
        self.steps = steps
        self.requests = requests
        self.skip_ahead = skip_ahead and executor.supports_decode_runs
        # (an executor that only follows the protocol gets its steps_until from the protocol)
        self._steps_until = (getattr(executor, "steps_until", None)
                             or partial(Executor.steps_until, executor))
        self._arrivals = arrivals
        self.outstanding_tokens = 0
        self.num_finished = 0
        self.num_decode_runs = 0    # decode runs waited out as one event each
        self.num_skipped_steps = 0  # steps taken inside them
        self._wakeup = env.event()
        self._idle = False
        self._new_head = False      # a request arrived to an empty queue since the last step
        self.process = env.process(self._run())

    @property
    def kv(self):
        """The scheduler's KV manager, for readers outside the loop (the results, the
        prefix-affinity router); the loop never touches it."""
        return self.scheduler.kv

    # --- arrivals ------------------------------------------------------------------------

    def submit(self, seq: RequestState) -> None:
        """Queue a request on this replica (called at its arrival time)."""
        self._new_head = self._new_head or not self.scheduler.num_waiting
        self.scheduler.add(seq)
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
            # (a request that arrived to an empty queue is most likely admitted at the next
            # step: take it without asking for a decode run, whose admission check would
            # look its prefix up first; a normal step is always right, a run only faster)
            if self._new_head or not (self.skip_ahead and (yield from self._decode_run())):
                self._new_head = False
                yield from self._step()

    def _step(self):
        now = self.env.now
        plan = self.scheduler.schedule()
        if plan.is_empty and not plan.preempted:
            raise RuntimeError(f"replica {self.index}: the scheduler made no progress at "
                               f"t={now:.6f}s with {self.scheduler.num_waiting} waiting")
        for request_id in plan.admitted:
            self.requests.on_scheduled(request_id, now)
        # (a step may only preempt: the request being grown was its own victim, and the
        # running ones after it wait for the next step, as in vLLM; nothing runs, no time)
        duration = self.executor.step_duration(plan) if not plan.is_empty else 0.0
        yield self.env.timeout(duration)
        outcome = self.scheduler.update_from_output()
        self._commit(outcome)
        self._log_step(now, duration, plan, outcome)

    def _commit(self, outcome: StepOutcome) -> None:
        now = self.env.now
        for seq in outcome.first_tokens:
            self.requests.on_first_token(seq, now)
        for seq in outcome.finished:
            self.requests.on_finish(seq, now)
        self.num_finished += len(outcome.finished)

    def _log_step(self, t0, duration, plan: StepPlan, outcome: StepOutcome) -> None:
        scheduled = plan.num_scheduled_tokens
        self.outstanding_tokens -= scheduled
        u, sched = outcome.usage, self.scheduler
        moved = self.executor.transfer_time(plan) if plan.transfers else 0.0
        self.steps.append(StepRecord(
            t0, duration, self.index, len(plan.scheduled), scheduled, outcome.num_output_tokens,
            sched.num_running, sched.num_waiting, u.num_used_blocks, u.num_cached_idle_blocks,
            u.num_token_slots, u.num_internal_slots, u.num_reserved_slots, u.num_external_slots,
            len(plan.preempted), outcome.num_prefix_queries_tokens, outcome.num_prefix_hit_tokens,
            *map(plan.num_transfer_blocks, TRANSFER_KINDS), u.num_host_used_blocks, moved))

    # --- decode runs ---------------------------------------------------------------------

    def _decode_run(self):
        """Take the steps of the scheduler's decode run that start before the next arrival as
        one timeout (and one more per step where requests finish, reported at its end); False
        (nothing taken) when there is no run, or that would be fewer than two steps of a run
        without copies."""
        run = self.scheduler.plan_decode_run()
        if run is None:
            return False
        now = self.env.now
        horizon = self.env.peek() if self._arrivals is None else self._arrivals.time_s
        compute, n, end = self._steps_before(run, now, horizon)
        if run.has_transfers:
            facts, durations, moved = self._commit_with_copies(run, compute, now, horizon)
        else:
            compute, n = self._admit_arrivals(run, compute, n, end)
            if n < 2:           # (a run that took an arrival has two steps or more)
                return False
            facts, durations, moved = (self.scheduler.commit_decode_run(run, n),
                                       np.array(compute[:n]), np.zeros(n))
        self.num_decode_runs += 1
        self.num_skipped_steps += len(facts)
        rows = self._rows(now, durations, moved, facts)
        if run.admissions:
            self._log_admissions(run, rows)
        if len(facts) > 1:
            self.steps.extend_rows(rows[:-1])
        tokens = _scheduled_tokens(facts).tolist()
        self.outstanding_tokens -= sum(tokens) - tokens[-1]
        yield from self._wait_out(now, durations, facts.finished)
        if run.admissions and self._arrivals.time_s <= self.env.now:
            # an arrival exactly at the end of a run that took the one before it is routed
            # first, as stepping would (its arrival was scheduled when that one was routed)
            yield self.env.timeout(0)
        last = StepRecord(*rows[-1].tolist())
        self.steps.append(last._replace(num_waiting=self.scheduler.num_waiting))
        self.outstanding_tokens -= tokens[-1]
        return True

    def _steps_before(self, run: DecodeRun, now: float, horizon: float,
                      start: int = 0) -> tuple[list[float], int, float]:
        """The run's steps from step 0, or from ``start`` where it admits a request last (its
        prompt as a prefill), run back to back from ``now``: their durations up to the first
        that ends at or after ``horizon`` (or the run's end); how many of them start before
        ``horizon``, less that last one if requests finish at its end (an arrival then must
        see them still running); and when those end (SimPy's sum, one step at a time)."""
        if run.prefill is not None:     # (such a run ends with its first finish)
            durations, before, end, crossed = back_to_back(self.executor.decode_durations(
                run.num_seqs, int(run.num_computed.sum()), run.max_steps,
                prefill=(run.prefill.num_computed, run.prefill.num_new)).tolist(), now, horizon)
        else:
            stretches = run.stretches(start) if start else ((*b, 0) for b in run.batches())
            durations, before, end, crossed = self._steps_until(stretches, now, horizon)
        # (``in`` on the finish steps as a list: a fifth of the time of numpy's)
        if crossed and start + len(durations) - 1 in run.finish_step.tolist():
            return durations, len(durations) - 1, before
        return durations, len(durations), end

    def _admit_arrivals(self, run: DecodeRun, compute: list[float], n: int, start: float):
        """Extend ``run``, which the next arrival cuts at step ``n`` (at ``start``), through
        the arrivals it can admit itself: while that request is handed over
        (:meth:`NextArrival.hand_over`), arrived before step ``n`` starts with the one after
        it arriving later, and the scheduler admits it there
        (:meth:`~kvsim.cache.Scheduler.admit_in_run`), the run takes it and goes on to the
        arrival after it. Returns the durations and how many steps start before the (new)
        next arrival."""
        arrivals, taken = self._arrivals, None
        while arrivals is not None and n < run.max_steps:
            seq = arrivals.hand_over(self)
            horizon = arrivals.following_s()
            if seq is None or start < arrivals.time_s or horizon <= start:
                break
            saved = run.snapshot()
            if not self.scheduler.admit_in_run(run, n, seq):
                break
            later, m, end = self._steps_before(run, start, horizon, n)
            if not m:       # (its admitting step would be left out: it finishes requests)
                run.restore(saved)
                break
            arrivals.take()
            taken = compute[:n] if taken is None else taken
            taken += later[:m]
            start, n = end, n + m
        return (compute, n) if taken is None else (taken, n)

    def _log_admissions(self, run: DecodeRun, rows: np.ndarray) -> None:
        """Log when each request the run admitted was scheduled and emitted its first token
        (the start and end of its admitting step), and count it waiting after the step before
        (it arrived during that one)."""
        starts, durations = rows[:, _COLUMN["t_start"]], rows[:, _COLUMN["duration"]]
        for step, seq in run.admissions:
            rows[step - 1, _COLUMN["num_waiting"]] = 1
            self.requests.on_scheduled(seq.request_id, float(starts[step]))
            self.requests.on_first_token(seq, float(starts[step] + durations[step]))

    def _wait_out(self, now: float, durations: np.ndarray, finished: list[tuple[int, list]]):
        """Wait out the steps, reporting each finish at the end of its step."""
        done = 0
        for step, seqs in finished:
            yield from self._wait(now, durations[done:step + 1])
            now, done = self.env.now, step + 1
            for seq in seqs:
                self.requests.on_finish(seq, now)
            self.num_finished += len(seqs)
        if done < len(durations):
            yield from self._wait(now, durations[done:])

    def _commit_with_copies(self, run: DecodeRun, compute: list[float], now: float,
                            horizon: float):
        """Commit the run step by step while steps start before ``horizon``, each lengthened
        by the executor's time for the copies it asks for."""
        durations, moved, end = [], [], [now]

        def stop(j: int, transfers) -> bool:
            duration, seconds = float(compute[j]), 0.0
            if transfers:
                seconds = self.executor.transfer_time(StepPlan(transfers=transfers))
                duration = duration + seconds
            end[0] = end[0] + duration
            durations.append(duration)
            moved.append(seconds)
            return end[0] >= horizon

        facts = self.scheduler.commit_decode_run(run, min(run.num_left, len(compute)), stop)
        return facts, np.array(durations), np.array(moved)

    def _rows(self, now: float, durations, moved, facts: DecodeSteps) -> np.ndarray:
        """The step log's rows for the steps of a decode run (one array, columns in
        :data:`STEP_COLUMNS` order)."""
        rows = np.zeros((len(facts), len(STEP_COLUMNS)))
        rows[:, _COLUMN["t_start"]] = np.add.accumulate(np.concatenate(([now], durations[:-1])))
        b = facts.batch_size
        out = b - 1 if facts.num_prefill_tokens else b      # (a prefill emits nothing)
        for name, value in (("replica", self.index), ("batch_size", b),
                            ("scheduled_tokens", _scheduled_tokens(facts)),
                            ("output_tokens", out), ("num_running", facts.num_running),
                            ("num_waiting", self.scheduler.num_waiting), ("duration", durations),
                            ("kv_used_blocks", facts.kv_used_blocks),
                            ("kv_cached_idle_blocks", facts.kv_cached_idle_blocks),
                            ("token_slots", facts.token_slots),
                            ("internal_slots", facts.internal_slots),
                            ("host_used_blocks", facts.host_used_blocks), ("transfer_s", moved)):
            rows[:, _COLUMN[name]] = value
        if facts.prompt_tokens is not None:     # (the prefix lookups of the admissions)
            rows[:, _COLUMN["prefix_queries_tokens"]] = facts.prefix_queries_tokens
            rows[:, _COLUMN["prefix_hit_tokens"]] = facts.prefix_hit_tokens
        for j, transfers in enumerate(facts.transfers if any(facts.transfers) else ()):
            if transfers:
                plan = StepPlan(transfers=transfers)
                for kind in TRANSFER_KINDS:
                    rows[j, _COLUMN[f"{kind}_blocks"]] = plan.num_transfer_blocks(kind)
        return rows

    def _wait(self, now: float, durations):
        """Wait until ``now`` plus the durations, added one by one as SimPy would."""
        end = now
        for duration in durations.tolist():
            end = end + duration
        delay = exact_delay(now, end)
        if delay is not None:
            yield self.env.timeout(delay)
            return
        for duration in durations.tolist():   # no single delay lands exactly there
            yield self.env.timeout(duration)


def _scheduled_tokens(facts: DecodeSteps) -> np.ndarray:
    """Tokens each step of a run schedules: one a request, a prefill's whole chunk, an
    admitted request's whole prompt."""
    chunk, prompts = facts.num_prefill_tokens, facts.prompt_tokens
    if prompts is not None:
        return facts.batch_size + prompts - (prompts > 0)
    return facts.batch_size + (chunk - 1) if chunk else facts.batch_size


class NextArrival:
    """When the next request not yet routed arrives (``inf`` once none is left), kept by the
    arrival process. A replica's decode run ends at it rather than at the next event of any
    kind: the other replicas' steps neither read nor change this replica, and only an arrival
    (its routing, its admission) can."""

    def __init__(self) -> None:
        self.time_s = 0.0

    def hand_over(self, replica) -> RequestState | None:
        """The next request, if ``replica``'s decode run may admit it before its time (see
        :class:`~kvsim.sim.serving.arrivals.Arrivals`); never here."""
        return None

    def following_s(self) -> float:
        """When the request after the next one arrives."""
        return math.inf

    def take(self) -> RequestState:
        raise ValueError("no request was handed over")


def exact_delay(now: float, end: float) -> float | None:
    """A delay ``d`` with ``now + d == end`` in floating point (SimPy schedules a timeout at
    ``now + d``), or None when there is none near ``end - now``."""
    delay = end - now
    for _ in range(4):
        got = now + delay
        if got == end:
            return delay
        delay = math.nextafter(delay, math.inf if got < end else -math.inf)
    return None
