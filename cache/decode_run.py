"""Runs of decode-only steps, planned and committed as one unit (the loop's skip-ahead).

While every running request only decodes, no waiting request can be admitted, no allocation
can fail and nobody finishes, the next steps are known in advance: each request gains one token
a step, and a block is opened or filled only when a request's length crosses a block boundary.
:class:`DecodeRun` is such a stretch; committing ``n`` of its steps performs exactly the block
allocations (and, with a host tier, the copies) those ``n`` steps would have made one step at a
time, in the same order, and returns what each step left as data (:class:`DecodeSteps`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsim.cache.step_plan import BlockTransfer


@dataclass(slots=True)
class DecodeRun:
    """Up to ``max_steps`` decode-only steps of ``requests`` (the running batch, in scheduling
    order) from now. ``num_context_tokens``: their computed tokens summed before the first step
    (it grows by ``len(requests)`` a step). ``has_transfers``: a step may ask for block copies
    (a host tier), known only once it is committed."""

    requests: list
    num_computed: np.ndarray     # each request's computed tokens before the first step
    num_output: list[int]        # and its output tokens
    max_steps: int
    has_transfers: bool
    num_committed: int = 0

    @property
    def num_seqs(self) -> int:
        return len(self.requests)

    @property
    def num_context_tokens(self) -> int:
        return int(self.num_computed.sum())

    @property
    def num_left(self) -> int:
        return self.max_steps - self.num_committed


@dataclass(slots=True)
class DecodeSteps:
    """What committed decode steps left behind, one entry per step (after its allocations)."""

    kv_used_blocks: np.ndarray
    kv_cached_idle_blocks: np.ndarray
    token_slots: np.ndarray
    internal_slots: np.ndarray
    host_used_blocks: np.ndarray
    transfers: list[list[BlockTransfer]]   # the copies each step asks for, in order

    def __len__(self) -> int:
        return len(self.kv_used_blocks)

    @classmethod
    def concatenate(cls, parts: list["DecodeSteps"]) -> "DecodeSteps":
        """The steps of ``parts``, one after the other."""
        arrays = [np.concatenate([getattr(p, name) for p in parts]) for name in (
            "kv_used_blocks", "kv_cached_idle_blocks", "token_slots", "internal_slots",
            "host_used_blocks")]
        return cls(*arrays, [t for p in parts for t in p.transfers])


def max_decode_steps(running, max_model_len: int) -> int:
    """Decode steps every request of ``running`` can take before the first one finishes."""
    by_output = min(s.max_tokens - s.num_output_tokens for s in running)
    by_length = max_model_len - max(s.num_prompt_tokens + s.num_output_tokens for s in running)
    return by_output if by_output < by_length else by_length


def cap_by_free_blocks(num_computed: np.ndarray, block_size: int, num_free: int,
                       steps: int) -> int:
    """Largest run (<= ``steps``) whose new blocks all fit in ``num_free`` blocks; 0 when that
    is under two steps (not worth a run)."""
    first = (-num_computed) % block_size     # step at which each request opens a block

    def new_blocks(n: int) -> int:
        return int(np.maximum(0, (n - 1 - first) // block_size + 1).sum())

    if new_blocks(steps) <= num_free:
        return steps
    lo, hi = 0, steps
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if new_blocks(mid) <= num_free else (lo, mid - 1)
    return lo if lo >= 2 else 0


def commit_steps(kv, run: DecodeRun, n: int, host=None) -> DecodeSteps:
    """Perform the next ``n`` steps of ``run`` on ``kv`` (a paged
    :class:`~kvsim.cache.KVCacheManager`) and bring the requests' counters forward.

    The block events (a request opening a block, or filling one it registers) of all ``n``
    steps are found in one array operation; only they call ``kv.allocate``, step by step in
    scheduling order, as :meth:`~kvsim.cache.Scheduler.schedule` would, or, where the
    manager allows, the opened blocks are taken in one call (:func:`_open_in_bulk`).
    ``host``: the host tier (its copies are taken step by step)."""
    bs, first = kv.block_size, run.num_committed
    steps = np.arange(first, first + n, dtype=np.int64)
    computed = run.num_computed[None, :] + steps[:, None]        # before each step (n x B)
    registers = np.array(kv.registers_while_decoding([s.request_id for s in run.requests]),
                         dtype=bool)
    opens = computed % bs == 0
    events = opens | (((computed + 1) % bs == 0) & registers)
    internal = ((-(computed + 1)) % bs).sum(axis=1)
    if host is None:
        if kv.opens_blocks_in_bulk(run.requests, (run.num_computed + first + n).tolist()):
            used, idle = _open_in_bulk(kv, run, opens)
        else:
            used, idle = _allocate_events(kv, run, events, first)
        transfers, host_used = [[] for _ in range(n)], np.zeros(n, dtype=np.int64)
    else:
        used, idle, host_used, transfers = _allocate_steps_with_copies(kv, run, events, first,
                                                                      host)
    run.num_committed += n
    _bring_forward(kv, run)
    return DecodeSteps(used, idle, used * bs - internal, internal, host_used, transfers)


def _allocate_events(kv, run: DecodeRun, events: np.ndarray, first: int):
    """Allocate at every event (step by step, in scheduling order); the pool's used and cached
    idle blocks after each step."""
    pool, n = kv.pool, len(events)
    before = (pool.num_used_blocks, pool.num_cached_free_blocks)
    rows, cols = np.nonzero(events)
    steps = np.flatnonzero(np.diff(rows, append=n)) if len(rows) else rows  # last event/step
    after = np.empty((len(steps), 2), dtype=np.int64)
    k = 0
    for row, (j, i) in enumerate(zip(rows.tolist(), cols.tolist())):
        _open_or_fill(kv, run, i, first + j)
        if k < len(steps) and row == steps[k]:
            after[k] = pool.num_used_blocks, pool.num_cached_free_blocks
            k += 1
    event_steps = rows[steps]
    last = np.searchsorted(event_steps, np.arange(n), side="right") - 1   # -1: none yet
    table = np.vstack([np.array([before], dtype=np.int64), after])
    return table[last + 1, 0], table[last + 1, 1]


def _open_in_bulk(kv, run: DecodeRun, opens: np.ndarray):
    """:func:`_allocate_events` where the manager allows it (``opens_blocks_in_bulk``: LRU,
    or a scored pool whose free blocks the steps' registrations leave alone; no host tier):
    the new blocks of all the steps in one call, the blocks they fill registered by
    :func:`_bring_forward` (one call per request; nothing is looked up during a run). The
    free unhashed blocks go first, so the ``k``-th block taken evicts cached content exactly
    when ``k`` exceeds their number."""
    pool = kv.pool
    used, idle = pool.num_used_blocks, pool.num_cached_free_blocks
    num_unhashed = pool.num_free_blocks - idle
    rows, cols = np.nonzero(opens)                      # step by step, in scheduling order
    requests = run.requests
    kv.open_blocks([requests[i] for i in cols.tolist()])
    taken = np.bincount(rows, minlength=len(opens)).cumsum()     # blocks taken up to each step
    return used + taken, idle - np.maximum(taken - num_unhashed, 0)


def _allocate_steps_with_copies(kv, run: DecodeRun, events: np.ndarray, first: int, host):
    """As :func:`_allocate_events`, with the host tier's copies (and usage) of each step."""
    pool, n = kv.pool, len(events)
    used, idle, host_used = (np.empty(n, dtype=np.int64) for _ in range(3))
    transfers = []
    for j in range(n):
        kv.begin_step()
        for i in np.flatnonzero(events[j]).tolist():
            _open_or_fill(kv, run, i, first + j)
        used[j], idle[j] = pool.num_used_blocks, pool.num_cached_free_blocks
        transfers.append(list(kv.take_transfers()))
        host_used[j] = host.num_cached_blocks + host.num_pinned_blocks
    return used, idle, host_used, transfers


def _open_or_fill(kv, run: DecodeRun, i: int, step: int) -> None:
    """Request ``i``'s allocation at ``step`` of the run (its length as at that step)."""
    seq = run.requests[i]
    seq.num_output_tokens = run.num_output[i] + step
    rid = seq.request_id
    if kv.allocate(rid, seq, int(run.num_computed[i]) + step + 1 - kv.num_slots(rid)) is None:
        raise RuntimeError(f"a decode run could not allocate for request {rid}: it was "
                           "planned on a pool that changed since")


def _bring_forward(kv, run: DecodeRun) -> None:
    """Every request's counters and slots as ``run.num_committed`` steps left them."""
    done = run.num_committed
    for seq, c0, o0 in zip(run.requests, run.num_computed.tolist(), run.num_output):
        seq.num_computed_tokens = c0 + done
        seq.num_output_tokens = o0 + done
        grow = seq.num_computed_tokens - kv.num_slots(seq.request_id)
        if grow:
            kv.allocate(seq.request_id, seq, grow)
