"""Committing a decode run (:mod:`kvsim.cache.decode_run`): the block allocations, finishes and
copies of its next steps, done as those steps one at a time would have done them, in the same
order, with what each step left returned as data (:class:`~kvsim.cache.decode_run.DecodeSteps`).

The block events of the steps (a request opening a block, or filling one it registers) are
found in one array operation, and only they reach the KV manager: stretch by stretch between
finishes, in one call where the manager allows it (:func:`_open_in_bulk`), else event by event;
with a long prompt's chunks after each step's events (:func:`_allocate_with_prefill`); with a
host tier step by step, the chunk too, with each step's copies
(:func:`_allocate_steps_with_copies`).
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from kvsim.cache.decode_run import DecodeRun, DecodeSteps
from kvsim.cache.run_grid import MIN_ARITHMETIC_CELLS, StepGrid, open_events, tail_offsets


def commit_steps(kv, run: DecodeRun, n: int, host=None, finish=None,
                 stop=None, admit=None) -> DecodeSteps:
    """Perform the next ``n`` steps of ``run`` on ``kv`` (a paged
    :class:`~kvsim.cache.KVCacheManager`) and bring the requests' counters forward;
    ``finish(seq)`` ends a request at the end of its last step (the scheduler's).
    ``stop(j, transfers)``, with a host tier: called after each step with its copies; True
    ends the commit there (fewer than ``n`` steps, as many as the result holds).

    The block events (a request opening a block, or filling one it registers) of all ``n``
    steps are found at once (:mod:`kvsim.cache.run_grid`); only they call ``kv.allocate``,
    step by step in scheduling order, as :meth:`~kvsim.cache.Scheduler.schedule` would, or,
    where the manager allows, the opened blocks of each stretch between finishes are taken in
    one call (:func:`_open_in_bulk`). Requests finishing at a step are brought forward and finished
    after its allocations, in scheduling order, as ``update_from_output`` would.
    ``host``: the host tier (its copies are taken step by step; such runs end before the
    first finish). ``admit(seq)``: admits a request the run took (``run.admissions``) at its
    step, after the decodes' blocks of that step (the scheduler's)."""
    bs, first = kv.block_size, run.num_committed
    grid = StepGrid(run, first, n, bs)
    num_staying, batch = _batch_sizes(run, grid.steps)
    arithmetic = (run.prefill is None and host is None and kv.always_opens_blocks_in_bulk
                  and n * run.num_seqs >= MIN_ARITHMETIC_CELLS)
    events = open_events(run, first, n, bs) if arithmetic else None
    tails = tail_offsets(run, first, n, bs, events) if arithmetic else grid.tail_offsets()
    internal = (bs - 1) * num_staying - tails         # the blocks' tails

    def fills() -> np.ndarray:
        """Where a request fills a block it registers (an event; after its open, if both)."""
        return grid.fills(np.array(
            kv.registers_while_decoding([s.request_id for s in run.requests]), dtype=bool))

    late = lookups = None     # the late fills' order, for a pool that keeps it; admissions'
    if run.prefill is not None and host is None:
        used, idle, finished = _allocate_with_prefill(kv, run, grid.opens | fills(), first,
                                                      finish)
        transfers, host_used = [()] * n, np.zeros(n, dtype=np.int64)
    elif host is None:
        joining = _admitted_by_stretch(run, first, n)
        events = events if arithmetic else grid.open_events()
        used, idle, finished, late, lookups = _allocate_stretches(
            kv, run, grid, events, fills, finish, joining, admit)
        transfers, host_used = [()] * n, np.zeros(n, dtype=np.int64)
    else:
        used, idle, host_used, transfers = _allocate_steps_with_copies(
            kv, run, grid.opens | fills(), first, host, stop)
        n, finished = len(used), []
        if run.prefill is not None:
            run.prefill.seq.num_computed_tokens = run.prefill.computed_before(first + n)
        num_staying, internal, batch = num_staying[:n], internal[:n], batch[:n]
    run.num_committed += n
    _bring_forward(kv, run, np.flatnonzero(run.finish_step >= run.num_committed).tolist())
    if late is not None:
        kv.pool.order_fills(late())     # (registered late: in the order they were filled)
    if run.prefill is None:
        return DecodeSteps(batch, num_staying, used, idle, used * bs - internal, internal,
                           host_used, transfers, finished, 0, *(lookups or (None,) * 3))
    chunks = run.prefill     # one more request in each step, its last block's tail internal
    steps = grid.steps[:n]
    internal = internal + (-(chunks.num_computed + (steps + 1) * chunks.num_new)) % bs
    return DecodeSteps(batch + 1, num_staying + 1, used, idle, used * bs - internal, internal,
                       host_used, transfers, finished, chunks.num_new)


def _batch_sizes(run: DecodeRun, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each step: the requests staying after it, and the batch it runs."""
    ends = np.sort(run.finish_step)
    if run.joined is not None:      # (one admitted takes part from its admitting step on)
        num_started = np.searchsorted(np.sort(run.joined), steps, side="right")
    else:
        num_started = run.num_seqs
    num_staying = num_started - np.searchsorted(ends, steps, side="right")
    return num_staying, num_started - np.searchsorted(ends, steps, side="left")


def _allocate_stretches(kv, run: DecodeRun, grid: StepGrid, events: tuple, fills, finish,
                        joining: dict | None = None, admit=None):
    """Allocate the steps of ``grid`` stretch by stretch (a stretch ends with a step where
    requests finish, which are then finished, or that admits one: ``joining``, the requests
    admitted by the stretch ending there, are admitted by ``admit`` after the step's other
    blocks); the pool's used and cached idle blocks after each step, (step, finished
    requests) of each finish, and, with admissions, each step's admitted prompt tokens,
    prefix-lookup tokens and hits. ``events``: the opens' steps and requests, step by step
    (:meth:`StepGrid.open_events`). ``fills()``: the fill matrix, asked for only when a
    stretch cannot open its blocks in bulk, or the pool counts the fills between the blocks
    it hands out (``opens_in_bulk == "new_fills"``: then every stretch opens in bulk or none
    does, as the fills wait for the end of the run to be registered)."""
    n, first = grid.n, grid.first
    used, idle = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    ending = _finishing_by_stretch(run, first, n)
    if joining:
        ends = sorted({*ending, *joining, n})
        lookups = tuple(np.zeros(n, dtype=np.int64) for _ in range(3))
    else:
        ends, joining, lookups = ([*ending, n] if n not in ending else list(ending)), {}, None
    rows, cols = events                     # the opens of all stretches, step by step
    taken = np.bincount(rows, minlength=n).cumsum()     # blocks opened up to each step
    cuts = np.searchsorted(rows, ends).tolist()
    counted = kv.pool.opens_in_bulk == "new_fills"
    whole = counted and _in_bulk(kv, run, first, first + n)
    bulk = whole or kv.always_opens_blocks_in_bulk     # (every stretch, asked once)
    counts = late = None
    if whole:
        filled = fills()
        counts = _fill_counts(run, rows, cols, filled, first)
        if kv.pool.orders_fills:
            late = _fill_order(kv, run, filled, first)
    cols = cols.tolist()
    finished, lo, at, matrix, opened, after = [], 0, 0, None, [], []
    for end, cut in zip(ends, cuts):
        if bulk or (not counted and _in_bulk(kv, run, first + lo, first + end)):
            opened.append((lo, end, *_open_in_bulk(
                kv, run, cols[at:cut], None if counts is None else counts(lo, at, cut))))
        else:
            matrix = (grid.opens | fills()) if matrix is None else matrix
            used[lo:end], idle[lo:end] = _allocate_events(kv, run, matrix[lo:end], first + lo)
        if end in joining:
            _admit_requests(kv, joining[end], admit, lookups, end - 1)
        done = ending.get(end)
        if done:
            finished.append((end - 1, _finish_requests(kv, run, done, first + end, finish)))
        if done or end in joining:
            after.append((end - 1, kv.pool.num_used_blocks, kv.pool.num_cached_free_blocks))
        lo, at = end, cut
    if opened:
        _count_opened(used, idle, taken, opened)
    for j, num_used, num_idle in after:       # (what finishes and admissions left)
        used[j], idle[j] = num_used, num_idle
    return used, idle, finished, late, lookups


def _count_opened(used: np.ndarray, idle: np.ndarray, taken: np.ndarray, opened: list) -> None:
    """The pool's used and cached idle blocks after each step of the stretches that opened
    their blocks in bulk (``opened``: each one's first and end step, and the used, cached
    idle and free unhashed blocks before it; ``taken``: the blocks opened up to each step of
    the run), all stretches in one pass: the ``k``-th block a stretch takes evicts cached
    content exactly when ``k`` exceeds the free unhashed blocks."""
    if len(opened) == 1:        # (most runs of a busy server: one stretch)
        (lo, end, used_before, idle_before, unhashed), = opened
        new = taken[lo:end] - (taken[lo - 1] if lo else 0)
        used[lo:end] = used_before + new
        idle[lo:end] = idle_before - np.maximum(new - unhashed, 0)
        return
    lo, end, used_before, idle_before, unhashed = (np.array(c, dtype=np.int64)
                                                   for c in zip(*opened))
    lengths = end - lo
    stretch = np.repeat(np.arange(len(lo)), lengths)
    steps = np.arange(len(stretch)) + np.repeat(lo - np.cumsum(lengths) + lengths, lengths)
    before = np.where(lo > 0, taken[lo - 1], 0)
    new = taken[steps] - before[stretch]
    used[steps] = used_before[stretch] + new
    idle[steps] = idle_before[stretch] - np.maximum(new - unhashed[stretch], 0)


def _admitted_by_stretch(run: DecodeRun, first: int, n: int) -> dict[int, list]:
    """The requests the next ``n`` steps admit (``run.admissions``), keyed by the number of
    those steps up to and including the admitting one."""
    joining: dict[int, list] = {}
    for step, seq in run.admissions:
        if first <= step < first + n:
            joining.setdefault(step - first + 1, []).append(seq)
    return joining


def _admit_requests(kv, seqs: list, admit, lookups: tuple, j: int) -> None:
    """Admit ``seqs`` at step ``j`` of the commit; note their prompt tokens and the prefix
    lookups they made there (``lookups``: one array of each per step)."""
    stats = kv.prefix_stats
    queries, hits = stats.num_queries_tokens, stats.num_hit_tokens
    for seq in seqs:
        admit(seq)
        lookups[0][j] += seq.num_prompt_tokens
    lookups[1][j] += stats.num_queries_tokens - queries
    lookups[2][j] += stats.num_hit_tokens - hits


def _finish_requests(kv, run: DecodeRun, done: list[int], steps_done: int, finish) -> list:
    """Bring the requests at indices ``done`` forward by ``steps_done`` steps of the run and
    finish them, in scheduling order; returns them."""
    _bring_forward(kv, run, done, steps_done)
    seqs = [run.requests[i] for i in done]
    for seq in seqs:
        finish(seq)
    return seqs


def _allocate_with_prefill(kv, run: DecodeRun, events: np.ndarray, first: int, finish):
    """As :func:`_allocate_events`, each step followed by the prefill's chunk (it runs last);
    the requests finishing at the end of the last step are then finished."""
    pool, n, chunks = kv.pool, len(events), run.prefill
    seq = chunks.seq
    used, idle = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    for j, requests in enumerate(_by_step(events)):
        for i in requests:
            _open_or_fill(kv, run, i, first + j)
        _allocate_chunk(kv, chunks, first + j)
        used[j], idle[j] = pool.num_used_blocks, pool.num_cached_free_blocks
    seq.num_computed_tokens = chunks.computed_before(first + n)
    done = np.flatnonzero(run.finish_step == first + n - 1).tolist()
    if not done:
        return used, idle, []
    seqs = _finish_requests(kv, run, done, first + n, finish)
    used[-1], idle[-1] = pool.num_used_blocks, pool.num_cached_free_blocks
    return used, idle, [(n - 1, seqs)]


def _allocate_chunk(kv, chunks, step: int) -> None:
    """The prefill's chunk at ``step`` of the run (it runs last in the step)."""
    seq = chunks.seq
    if kv.allocate(seq.request_id, seq, chunks.num_new,
                   num_computed_tokens=chunks.computed_before(step)) is None:
        raise RuntimeError(f"a prefill run could not allocate for request {seq.request_id}: "
                           "it was planned on a pool that changed since")


def _finishing_by_stretch(run: DecodeRun, first: int, n: int) -> dict[int, list[int]]:
    """The requests (indices, in scheduling order) finishing at the end of each of the next
    ``n`` steps, keyed by the number of those steps up to and including it, in step order."""
    steps = run.finish_step
    finishing = np.flatnonzero((steps >= first) & (steps < first + n))
    ending: dict[int, list[int]] = {}
    for step, i in sorted(zip(steps[finishing].tolist(), finishing.tolist())):
        ending.setdefault(step - first + 1, []).append(i)
    return ending


def _in_bulk(kv, run: DecodeRun, start: int, end: int) -> bool:
    """Whether steps ``start..end-1`` of the run may open their blocks in one call (or one
    call a stretch)."""
    if kv.always_opens_blocks_in_bulk:
        return True
    active = np.flatnonzero(run.finish_step >= start)
    final = run.num_computed[active] + np.minimum(end, run.finish_step[active] + 1)
    return kv.opens_blocks_in_bulk((run.requests[i] for i in active), final.tolist())


def _fill_counts(run: DecodeRun, rows: np.ndarray, cols: np.ndarray, fills: np.ndarray,
                 first: int):
    """``counts(lo, at, cut)``: for each open ``at..cut-1`` (of the stretch from step ``lo``),
    how many blocks were filled before it, step by step in scheduling order, and are not
    registered yet: those of the requests still running when the stretch starts (a request
    registers its fills when it finishes; the others at the end of the run)."""
    m = fills.shape[1]

    def counts(lo: int, at: int, cut: int) -> list[int]:
        if at == cut:
            return []
        end = int(rows[cut - 1]) + 1
        pending = (fills[:end] & (run.finish_step >= first + lo)[None, :]).ravel()
        before = np.cumsum(pending)
        where = rows[at:cut] * m + cols[at:cut]
        return (before[where] - pending[where]).tolist()
    return counts


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


def _fill_order(kv, run: DecodeRun, fills: np.ndarray, first: int):
    """``order()``: the blocks the run's steps fill, step by step in scheduling order, read
    once they are all open (the block tables are taken now: a finished request's entry goes)."""
    tables = [kv.block_ids_ref(seq.request_id) for seq in run.requests]

    def order() -> list[int]:
        rows, cols = np.nonzero(fills)
        positions = (run.num_computed[cols] + first + rows) // kv.block_size
        return [tables[i][p] for i, p in zip(cols.tolist(), positions.tolist())]
    return order


def _open_in_bulk(kv, run: DecodeRun, opening: list[int],
                  fills_before: list[int] | None = None) -> tuple[int, int, int]:
    """:func:`_allocate_events` where the manager allows it (``opens_blocks_in_bulk``: LRU,
    or a scored pool whose free blocks the steps' registrations leave alone; no host tier):
    the new blocks of a stretch's steps in one call (``opening``: the requests opening one,
    step by step, in scheduling order), the blocks they fill registered by
    :func:`_bring_forward` (one call per request; nothing is looked up during a run).
    ``fills_before``: for a pool that counts them, the blocks filled before each open and not
    registered yet. Returns the pool's used, cached idle and free unhashed blocks before the
    stretch (:func:`_count_opened` counts its steps from them)."""
    pool = kv.pool
    used, idle = pool.num_used_blocks, pool.num_cached_free_blocks
    unhashed = pool.num_free_blocks - idle
    if opening:
        requests = run.requests
        kv.open_blocks([requests[i] for i in opening], fills_before)
    return used, idle, unhashed


def _allocate_steps_with_copies(kv, run: DecodeRun, events: np.ndarray, first: int, host,
                                stop=None):
    """As :func:`_allocate_events` (each step followed by the prefill's chunk, if the run
    carries one), with the host tier's copies (and usage) of each step; until
    ``stop(j, transfers)`` says so after step ``j``."""
    pool, n = kv.pool, len(events)
    used, idle, host_used = (np.empty(n, dtype=np.int64) for _ in range(3))
    transfers = []
    end_schedule = getattr(kv, "end_schedule", None)
    held = getattr(kv, "demotions_held", nullcontext)     # (a step's demotions at once)
    scheduled = [s.request_id for s in run.requests]
    if run.prefill is not None:
        scheduled.append(run.prefill.seq.request_id)
    for j, requests in enumerate(_by_step(events)):
        kv.begin_step()
        with held():
            for i in requests:
                _open_or_fill(kv, run, i, first + j)
            if run.prefill is not None:
                _allocate_chunk(kv, run.prefill, first + j)
        if end_schedule is not None:
            end_schedule(scheduled)
        used[j], idle[j] = pool.num_used_blocks, pool.num_cached_free_blocks
        transfers.append(list(kv.take_transfers()))
        host_used[j] = host.num_cached_blocks + host.num_pinned_blocks
        if stop is not None and stop(j, transfers[-1]):
            return used[:j + 1], idle[:j + 1], host_used[:j + 1], transfers
    return used, idle, host_used, transfers


def _by_step(events: np.ndarray) -> list[list[int]]:
    """For each step (row) of an event matrix, the requests (columns) with an event, in
    scheduling order."""
    rows, cols = np.nonzero(events)
    at = np.searchsorted(rows, np.arange(len(events) + 1)).tolist()
    cols = cols.tolist()
    return [cols[at[j]:at[j + 1]] for j in range(len(events))]


def _open_or_fill(kv, run: DecodeRun, i: int, step: int) -> None:
    """Request ``i``'s allocation at ``step`` of the run (its length as at that step)."""
    seq = run.requests[i]
    seq.num_output_tokens = run.num_output[i] + step
    rid = seq.request_id
    if kv.allocate(rid, seq, int(run.num_computed[i]) + step + 1 - kv.num_slots(rid)) is None:
        raise RuntimeError(f"a decode run could not allocate for request {rid}: it was "
                           "planned on a pool that changed since")


def _bring_forward(kv, run: DecodeRun, indices: list[int], done: int | None = None) -> None:
    """The counters and slots of the requests at ``indices`` as ``done`` steps of the run
    (``run.num_committed`` when None) left them."""
    done = run.num_committed if done is None else done
    computed, requests, num_output = run.num_computed.tolist(), run.requests, run.num_output
    seqs = [requests[i] for i in indices]
    for i, seq in zip(indices, seqs):
        seq.num_computed_tokens = computed[i] + done
        seq.num_output_tokens = num_output[i] + done
    kv.grow_slots(seqs)
