"""Runs of decode-only steps, planned and committed as one unit (the loop's skip-ahead).

While every running request only decodes, no waiting request can be admitted and no
allocation can fail, the next steps are known in advance: each request gains one token a step,
a block is opened or filled only when a request's length crosses a block boundary, and a
request finishes at a step known from its output budget. :class:`DecodeRun` is such a stretch.
With nobody waiting it goes on through finishes (the batch shrinks; what a finish frees cannot
admit anyone); otherwise it ends with the first one (whose step still sees the blocks held:
what it frees can admit someone at the next step only). Committing ``n`` of its steps performs
exactly the block allocations, finishes (and, with a host tier, the copies) those ``n`` steps
would have made one step at a time, in the same order, and returns what each step left as data
(:class:`DecodeSteps`): :func:`kvsim.cache.run_commit.commit_steps`. What a run asks of the KV
manager is in :class:`~kvsim.cache.run_blocks.DecodeRunBlocks`.

A run may also admit requests arriving during it (``DecodeRun.admit``, planned by
:meth:`~kvsim.cache.Scheduler.admit_in_run`): each joins at one step with its whole prompt and
decodes from the next, the run's arrays growing by one request; committing the run admits it
there, after that step's other block events.

A run may also carry a long prompt (:class:`PrefillChunks`): the newest running request,
prefilling in each step a chunk that uses up the token budget the decodes leave. Nobody can be
admitted then, and each step's allocations are known in advance too: the decodes'
block events, then the chunk's blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvsim.cache.step_plan import BlockTransfer


@dataclass(slots=True)
class PrefillChunks:
    """A running request that computes ``num_new`` prompt tokens in every step of a run, on top
    of ``num_computed`` before its first; it runs last in each step and takes the rest of the
    token budget, so nobody can be admitted meanwhile, and it neither emits nor finishes."""

    seq: object
    num_computed: int
    num_new: int
    max_steps: int      # steps it can take part in (none of them completes its prompt)

    def computed_before(self, step: int) -> int:
        return self.num_computed + step * self.num_new


def decodes(seq) -> bool:
    """Whether ``seq`` computes exactly one token, its next output, at the next step."""
    return (seq.num_computed_tokens + 1 == seq.num_prompt_tokens + seq.num_output_tokens
            and seq.num_output_tokens > 0)


#: Fewest steps of a prefill run: a run's set-up (planning, the step matrices, the rows,
#: bringing every request forward) costs about what two or three normal steps beside the same
#: decodes do (whole Mooncake trace: runs from two steps on changed nothing; from four, long
#: prompts chunked by 2,048-token budgets took 8-13 % less time).
MIN_PREFILL_RUN_STEPS = 4


def prefill_chunks(seq, num_decodes: int, budget: int,
                   threshold: int) -> PrefillChunks | None:
    """``seq`` (the last running request, still prefilling after ``num_decodes`` decoding
    ones) as the prefill of a run; None when its chunk would leave budget for an admission
    (the token budget not used up: ``threshold`` caps it), or when fewer than
    :data:`MIN_PREFILL_RUN_STEPS` whole chunks leave some of its prompt to a later step."""
    chunk = budget - num_decodes
    left = seq.num_prompt_tokens + seq.num_output_tokens - seq.num_computed_tokens
    if chunk <= 0 or (left - 1) // chunk < MIN_PREFILL_RUN_STEPS or 0 < threshold < chunk:
        return None
    return PrefillChunks(seq, seq.num_computed_tokens, chunk, (left - 1) // chunk)


@dataclass(slots=True)
class DecodeRun:
    """Up to ``max_steps`` decode-only steps of ``requests`` (the running batch, in scheduling
    order) from now. Request ``i`` takes part in steps ``0..finish_step[i]`` and finishes at
    the end of step ``finish_step[i]``; a run reaches past a finish only when nobody waits
    (then the batch just shrinks). ``has_transfers``: a step may ask for block copies (a host
    tier), known only once it is committed. ``prefill``: the request prefilling after them in
    every step (then the run ends with the first finish)."""

    requests: list
    num_computed: np.ndarray     # each request's computed tokens before the first step
    num_output: list[int]        # and its output tokens
    finish_step: np.ndarray      # the step at whose end each request finishes
    max_steps: int
    has_transfers: bool
    num_committed: int = 0
    prefill: PrefillChunks | None = None    # one more request, prefilling beside them
    joined: np.ndarray | None = None    # the step admitting each request (-1: before the run)
    admissions: list = field(default_factory=list)  # (step, request) of those, in step order
    prompt_blocks: list = field(default_factory=list)   # the blocks their prompts take, summed

    @property
    def num_seqs(self) -> int:
        return len(self.requests)

    def joining(self, seq, step: int, finish_step: int) -> tuple:
        """``(num_computed, finish_step, joined)`` with ``seq`` added, admitted at ``step``
        with its whole prompt (it emits its first token there and decodes from the next step
        on) and finishing at the end of ``finish_step``: its computed tokens are kept as those
        before step 0 that would give its own after ``step`` (negative ones, as it were)."""
        return (_appended(self.num_computed, seq.num_prompt_tokens - 1 - step),
                _appended(self.finish_step, finish_step),
                _appended(-1 if self.joined is None else self.joined, step,
                          len(self.requests)))

    def admit(self, seq, step: int, arrays: tuple, max_steps: int, blocks: int) -> None:
        """Add ``seq`` as :meth:`joining` gave ``arrays``, its prompt taking ``blocks``; the
        run now has ``max_steps``."""
        self.num_computed, self.finish_step, self.joined = arrays
        self.requests.append(seq)
        self.num_output.append(-step)
        self.prompt_blocks.append((self.prompt_blocks[-1] if self.prompt_blocks else 0)
                                  + blocks)
        self.admissions.append((step, seq))
        self.max_steps = max_steps

    def snapshot(self) -> tuple:
        """What :meth:`admit` changes, for :meth:`restore`."""
        return (len(self.requests), len(self.admissions), self.joined, self.num_computed,
                self.finish_step, self.max_steps)

    def restore(self, snapshot: tuple) -> None:
        """Undo the admissions since ``snapshot``."""
        n, k, self.joined, self.num_computed, self.finish_step, self.max_steps = snapshot
        del self.requests[n:], self.num_output[n:], self.admissions[k:], self.prompt_blocks[k:]

    @property
    def last_admission_step(self) -> int:
        """The step admitting the run's last admission (-1: none): admissions come in step
        order."""
        return self.admissions[-1][0] if self.admissions else -1

    @property
    def num_left(self) -> int:
        return self.max_steps - self.num_committed

    def batches(self):
        """Yield ``(num_steps, num_seqs, context tokens at its first step)`` for each stretch
        of the run's steps with one batch, in order (a stretch ends with a step where some
        finish); lazily, as a caller often needs the first few only."""
        members = sorted(zip(self.finish_step.tolist(), self.num_computed.tolist()))
        return _stretches(members, 0, self.max_steps)

    def stretches(self, start: int):
        """For a run whose last admission is at step ``start``: yield ``(num_steps, num_seqs,
        context tokens at its first step, prompt tokens)`` for that step (``num_seqs``
        counting the decodes beside the prompt), then for each stretch after it with one
        batch (0 prompt tokens); lazily. (On lists: a run holds a few dozen requests, for
        which a loop costs less than numpy's calls.)"""
        step, seq = self.admissions[-1]
        if step != start:
            raise ValueError(f"step {start} admits no request last (step {step} does)")
        finishes, computed = self.finish_step.tolist(), self.num_computed.tolist()
        num_seqs = context = 0
        staying = [(finishes.pop(), computed.pop())]    # (it joined last, decodes after)
        for pair in zip(finishes, computed):
            if pair[0] >= start:
                num_seqs += 1
                context += pair[1]
                if pair[0] > start:
                    staying.append(pair)
        yield 1, num_seqs, context + start * num_seqs, seq.num_prompt_tokens
        staying.sort()
        for stretch in _stretches(staying, start + 1, self.max_steps):
            yield (*stretch, 0)


def _appended(values, last: int, n: int | None = None) -> np.ndarray:
    """A new int64 array: ``values`` (an array, or one value for all ``n``), then ``last``
    (what ``np.append`` gives, at a third of its cost on a run's few dozen entries)."""
    n = len(values) if n is None else n
    out = np.empty(n + 1, dtype=np.int64)
    out[:n] = values
    out[n] = last
    return out


def _stretches(members: list[tuple[int, int]], start: int, max_steps: int):
    """Yield ``(num_steps, num_seqs, context tokens at its first step)`` for each stretch with
    one batch from step ``start`` to ``max_steps`` of ``members``, ``(finish step, computed
    tokens before step 0)`` in finish order, all taking part at ``start``."""
    num_seqs, context, i = len(members), sum(tokens for _, tokens in members), 0
    while start < max_steps:
        end = min(members[i][0] + 1, max_steps)
        yield end - start, num_seqs, context + start * num_seqs
        while i < len(members) and members[i][0] < end:
            context -= members[i][1]
            num_seqs -= 1
            i += 1
        start = end


@dataclass(slots=True)
class DecodeSteps:
    """What committed decode steps left behind, one entry per step (after its allocations
    and finishes); ``finished``: (step, the requests finished at its end), in order.
    ``batch_size`` and ``num_running`` count a run's prefill too."""

    batch_size: np.ndarray
    num_running: np.ndarray      # after the step
    kv_used_blocks: np.ndarray
    kv_cached_idle_blocks: np.ndarray
    token_slots: np.ndarray
    internal_slots: np.ndarray
    host_used_blocks: np.ndarray
    transfers: list[Sequence[BlockTransfer]]   # the copies each step asks for, in order
    finished: list[tuple[int, list]]
    num_prefill_tokens: int = 0   # computed in each step by one more request (in batch_size)
    # with admissions (a run's ``joined``): each step's admitted prompt tokens (counted in
    # batch_size as one request each) and the prefix lookups they made
    prompt_tokens: np.ndarray | None = None
    prefix_queries_tokens: np.ndarray | None = None
    prefix_hit_tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.kv_used_blocks)

    @classmethod
    def concatenate(cls, parts: list["DecodeSteps"]) -> "DecodeSteps":
        """The steps of ``parts``, one after the other."""
        arrays = [np.concatenate([getattr(p, name) for p in parts]) for name in (
            "batch_size", "num_running", "kv_used_blocks", "kv_cached_idle_blocks",
            "token_slots", "internal_slots", "host_used_blocks")]
        offsets = np.cumsum([0] + [len(p) for p in parts]).tolist()
        finished = [(k + offset, seqs) for p, offset in zip(parts, offsets)
                    for k, seqs in p.finished]
        return cls(*arrays, [t for p in parts for t in p.transfers], finished)


def finish_steps(running, max_model_len: int) -> np.ndarray:
    """The decode step (from now) at whose end each request of ``running`` finishes: by its
    output tokens, or by the model length."""
    return np.array([min(s.max_tokens - s.num_output_tokens,
                         max_model_len - s.num_prompt_tokens - s.num_output_tokens) - 1
                     for s in running], dtype=np.int64)


def cap_by_free_blocks(num_computed: np.ndarray, block_size: int, num_free: int,
                       steps: int, finish_step: np.ndarray, more_blocks=None,
                       joined: np.ndarray | None = None) -> int:
    """Largest run (<= ``steps``) whose new blocks all fit in ``num_free`` blocks (blocks
    freed by requests finishing meanwhile not counted); 0 when that is under two steps (not
    worth a run). ``more_blocks(n)``: the blocks a prefill, or the prompts admitted, take in
    ``n`` steps; ``joined``: the step admitting each request (decoding from the next)."""
    more = more_blocks or _no_blocks
    if len(num_computed) * -(-steps // block_size) + more(steps) <= num_free:
        return steps        # (no request opens more than one block per block_size steps)
    if joined is None:      # the step at which each request opens a block first
        first = (-num_computed) % block_size
    else:
        first = joined + 1 + (-(num_computed + joined + 1)) % block_size
    last = finish_step + 1                   # steps each request takes part in

    def new_blocks(n: int) -> int:
        opened = np.maximum(0, (np.minimum(n, last) - 1 - first) // block_size + 1)
        return int(opened.sum()) + more(n)

    if new_blocks(steps) <= num_free:
        return steps
    lo, hi = 0, steps
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if new_blocks(mid) <= num_free else (lo, mid - 1)
    return lo if lo >= 2 else 0


def _no_blocks(num_steps: int) -> int:
    return 0
