"""The scheduler's decode runs (:mod:`kvsim.cache.decode_run`): finding the stretch of decode-only
steps that can follow, and committing its steps (:mod:`kvsim.cache.run_commit`).

:class:`DecodeRunPlanning` is a base of :class:`~kvsim.cache.scheduler.Scheduler`; it reads the
scheduler's queues, configuration and KV manager, and keeps the run it planned last (``_run``):
only that one may be committed, and only before another step is scheduled.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import itemgetter

import numpy as np

from kvsim.cache import decode_run, run_commit
from kvsim.cache.decode_run import DecodeRun, DecodeSteps
from kvsim.cache.request_state import RequestState, RequestStatus


_step_of = itemgetter(0)       # (an admission's step)


class DecodeRunPlanning:
    """Planning and committing decode runs, for :class:`~kvsim.cache.scheduler.Scheduler`
    (whose ``running``, ``waiting``, ``config``, ``kv``, ``_host``, ``_external``,
    ``_finish``, ``admission_blocked`` and ``_prefill_threshold`` these methods use)."""

    _run: DecodeRun | None = None

    def plan_decode_run(self) -> DecodeRun | None:
        """The decode-only steps that can follow (None: plan a normal step): every running
        request only decodes, no waiting request can be admitted meanwhile and no allocation
        can fail (capped by the free blocks). With nobody waiting the run goes on through
        finishes (the batch shrinks); otherwise it ends with the first one, whose freed
        blocks might admit a waiting request at the next step. The last running request may
        instead prefill chunks that use up the token budget (:meth:`_prefill_of_run`). Paged
        layout only; the cache is left as it is."""
        running = self.running
        if self._external or not running or self.holding or not self.kv.supports_decode_runs:
            return None
        decoding, prefill = running, None
        if not decode_run.decodes(running[-1]):
            prefill = self._prefill_of_run(running[-1])
            if prefill is None:
                return None
            decoding = running[:-1]
        if not all(map(decode_run.decodes, reversed(decoding))):
            return None     # (the newest requests are the ones still prefilling: read first)
        if self.kv.acts_without_new_blocks(running):
            return None
        budget_left = self.config.max_num_batched_tokens - len(running)
        if prefill is None and (budget_left < 0 or not self.admission_blocked(budget_left)):
            return None     # (checked last: a waiting request's prefix lookup costs most)
        finish = decode_run.finish_steps(decoding, self.config.max_model_len)
        copies = self._copies_in_run(prefill)
        if prefill is not None:     # (it ends with the first finish too; before it, with copies)
            first_finish = int(finish.min()) + (self._host is None) if len(finish) else 1 << 62
            steps = min(prefill.max_steps, first_finish)
        elif copies or (self._host is not None and not self.kv.finishes_quietly(decoding)):
            steps = int(finish.min())       # (copies are committed step by step, no finishes)
        else:
            steps = int(finish.max() if not self.waiting else finish.min()) + 1
        return self._capped_run(decoding, finish, steps, prefill, copies)

    def admission_blocked(self, decode_budget_left: int) -> bool:
        """True when no waiting request could be admitted this step, and none can be while
        the running requests only decode (free blocks only shrink then, and hits only
        shrink), given the token budget the decodes leave. Not so for a request continuing
        one still running: its hit grows with each block of the reply that one generates."""
        if self.holding:
            return False        # (admitted at the next step, once loaded)
        if not self.waiting:
            return True
        if len(self.running) >= self.config.max_num_seqs or decode_budget_left <= 0:
            return True
        seq = self.waiting.peek()
        parent = seq.request.continues
        if parent is not None and any(r.request is parent for r in self.running):
            return False
        hit = self._lookup(seq)
        if hit.deferred:
            return False        # (it may be admitted once the connector can tell)
        if hit.load_async:      # (its load takes the hit's blocks only, and no budget)
            return not (self._can_admit(seq, hit) and self._can_load(seq, hit, ()))
        n = self._num_new_tokens(seq, hit.num_tokens, self._prefill_threshold(),
                                 decode_budget_left)
        if n is None or not self._can_admit(seq, hit):
            return True
        return not self.kv.can_allocate(seq.request_id, n, hit)

    def _prefill_of_run(self, seq: RequestState) -> decode_run.PrefillChunks | None:
        """``seq``, the last running request and still prefilling, as the prefill of a run
        (:func:`decode_run.prefill_chunks`); None when its slots are not its computed
        tokens."""
        prefill = decode_run.prefill_chunks(seq, len(self.running) - 1,
                                            self.config.max_num_batched_tokens,
                                            self._prefill_threshold())
        if prefill is None or self.kv.num_slots(seq.request_id) != prefill.num_computed:
            return None
        return prefill

    def _capped_run(self, decoding, finish, steps: int, prefill,
                    copies: bool) -> DecodeRun | None:
        """A run of at most ``steps`` steps, as many as the free blocks allow (None: < 2)."""
        if steps < 2:
            return None
        computed = np.array([s.num_computed_tokens for s in decoding], dtype=np.int64)
        more = None if prefill is None else (
            lambda n: self.kv.num_blocks_needed(prefill.seq.request_id, n * prefill.num_new))
        n = decode_run.cap_by_free_blocks(computed, self.kv.block_size,
                                          self.kv.num_free_blocks, steps, finish, more)
        if not n:
            return None
        self._run = DecodeRun(list(decoding), computed,
                              [s.num_output_tokens for s in decoding], finish, n,
                              copies, prefill=prefill)
        return self._run

    def _commit_steps(self, run: DecodeRun, num_steps: int, after_step) -> DecodeSteps:
        """:func:`run_commit.commit_steps`: with copies step by step; a host tier's quiet run
        (no copy) in bulk, after its first step's end of planning, its usage unchanged."""
        if run.has_transfers:
            return run_commit.commit_steps(self.kv, run, num_steps, self._host, self._finish,
                                           after_step, self._admit_joined)
        quiet = self._host is not None
        if quiet and not run.num_committed:
            self.kv.end_schedule(())    # (the last finishes heard of)
        facts = run_commit.commit_steps(self.kv, run, num_steps, None, self._finish, None,
                                        self._admit_joined)
        if quiet:
            facts.host_used_blocks[:] = (self._host.num_cached_blocks
                                         + self._host.num_pinned_blocks)
        return facts

    def _copies_in_run(self, prefill) -> bool:
        """Whether a run's steps may ask for copies (committed step by step): with a host
        tier, unless it says its decode steps copy nothing now (vLLM's offloading with no
        offer, load or finish pending) and no prompt is computed."""
        if self._host is None:
            return False
        return prefill is not None or not getattr(self.kv, "decodes_quietly", False)

    def admit_in_run(self, run: DecodeRun, step: int, seq: RequestState) -> bool:
        """Whether ``run`` (planned, nothing committed yet) can take ``seq``, a request arriving
        to nobody waiting during its step ``step - 1``, and admit it at ``step`` as
        :meth:`schedule` would there: its whole prompt in one step, with no prefix lookup to
        make (a request no lookup can hit) and no cache policy to ask (LRU), blocks to spare
        for its prompt and every later step of the run (those freed meanwhile not counted),
        and at least one decode step after it; not before the run's last admission (they
        come in step order). If so the run takes it (:meth:`DecodeRun.admit`), and committing
        the run admits it there."""
        if (run is not self._run or run.num_committed or run.prefill is not None
                or self._host is not None or self.waiting or self.holding
                or self._queue_reader is not None
                or not self.kv.always_opens_blocks_in_bulk
                or not seq.has_private_blocks or seq.num_preemptions
                or not 0 < step < run.max_steps or step < run.last_admission_step
                or not self._seat_in_run(run, step, seq)):
            return False
        outputs = min(seq.max_tokens, self.config.max_model_len - seq.num_prompt_tokens)
        if outputs < 2:         # (it would finish at its admitting step)
            return False
        arrays = run.joining(seq, step, step + outputs - 1)
        blocks = -(-seq.num_prompt_tokens // self.kv.block_size)
        steps = self._steps_with(run, step, blocks, arrays)
        if steps <= step:
            return False
        run.admit(seq, step, arrays, steps, blocks)
        return True

    def _seat_in_run(self, run: DecodeRun, step: int, seq: RequestState) -> bool:
        """Whether :meth:`schedule` at ``step`` of ``run`` finds ``seq`` a seat and its whole
        prompt a place in the token budget the decodes leave, no threshold cutting it
        (``reserve_full_sequence`` asks no more: at admission the sequence is its prompt;
        the blocks are :meth:`_steps_with`'s)."""
        config, prompt = self.config, seq.num_prompt_tokens
        num_decodes = int(np.count_nonzero(run.finish_step >= step))
        for joined, _ in reversed(run.admissions):   # (none after ``step``; they finish later)
            if joined < step:
                break
            num_decodes -= 1        # admitted at this step: no decode in it
        threshold = config.long_prefill_token_threshold
        return (num_decodes < config.max_num_seqs and not 0 < threshold < prompt
                and prompt <= config.max_num_batched_tokens - num_decodes)

    def _steps_with(self, run: DecodeRun, step: int, blocks: int, arrays) -> int:
        """Steps the run can take once a request joins it at ``step``, its prompt taking
        ``blocks`` (``arrays``: :meth:`DecodeRun.joining`'s), all of them to the last finish
        if the free blocks allow, counting the admitted prompts' blocks."""
        computed, finish, joined = arrays
        admitted, summed = run.admissions, run.prompt_blocks

        def prompts_before(n: int) -> int:      # (the admissions come in step order)
            k = bisect_left(admitted, n, key=_step_of)
            return (summed[k - 1] if k else 0) + (blocks if step < n else 0)

        return decode_run.cap_by_free_blocks(
            computed, self.kv.block_size, self.kv.num_free_blocks, int(finish.max()) + 1,
            finish, prompts_before, joined)

    def _admit_joined(self, seq: RequestState) -> None:
        """Admit ``seq`` as :meth:`admit_in_run` planned, at its step of the run being
        committed (after the decodes' blocks of that step): its prompt's blocks, the lookup it
        records, its place among the running requests; it has computed its prompt and emitted
        its first token once that step is done."""
        hit = self._lookup(seq)
        if self.kv.allocate(seq.request_id, seq, seq.num_prompt_tokens, hit) is None:
            raise RuntimeError(f"a decode run could not admit request {seq.request_id}: it "
                               "was planned on a pool that changed since")
        self._start_running(seq, hit)
        seq.num_computed_tokens, seq.num_output_tokens = seq.num_prompt_tokens, 1

    def commit_decode_run(self, run: DecodeRun, num_steps: int, stop=None) -> DecodeSteps:
        """Take the next ``num_steps`` steps of ``run`` (planned by :meth:`plan_decode_run`,
        nothing scheduled since): their block allocations and copies, the finishes, every
        request's counters brought forward. Returns what each step left (for the step log).
        With copies (``run.has_transfers``), ``stop(j, transfers)`` is told of each step in
        turn and may end the commit after it; so does a step after which the next ones must
        be planned one by one (the run ends there)."""
        if run is not self._run or not 0 < num_steps <= run.num_left:
            raise ValueError(f"cannot commit {num_steps} of the {run.num_left} steps left of "
                             "a decode run" + (" planned before the last step" if
                                              run is not self._run else ""))
        ended = []
        members = run.requests if run.prefill is None else [*run.requests, run.prefill.seq]

        def after_step(j: int, transfers) -> bool:
            told = stop is not None and stop(j, transfers)
            if self.kv.acts_without_new_blocks(members):
                ended.append(j)
            return told or bool(ended)

        facts = self._commit_steps(run, num_steps, after_step)
        if ended:
            run.max_steps = run.num_committed     # the next steps must be planned one by one
        if not run.num_left:
            self._run = None
        if facts.finished:
            self.running = [s for s in self.running if s.status is not RequestStatus.FINISHED]
        return facts
