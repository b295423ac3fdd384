"""What the simulation remembers: running totals and a bounded timeline of the engine steps, and
one row per request.

Memory grows with the requests in flight, not with the steps: :class:`StepLog` buffers at most
:data:`CHUNK_STEPS` steps, then folds them into :class:`~kvsim.sim.serving.step_totals.StepTotals`
(what ``summary.json`` needs) and a :class:`~kvsim.sim.serving.step_totals.Timeline` of at most
``MAX_TIMELINE_ROWS`` time bins. Only ``keep_steps=True`` (``kvsim validate``, tests, the Python
API's opt-in) also keeps every step. :class:`RequestLog` is columnar (8 bytes a value) and holds
no per-request Python object once a request is done. :mod:`kvsim.sim.serving.results` turns both into
the output frames.
"""

from __future__ import annotations

import math
from array import array
from operator import attrgetter
from typing import Mapping, NamedTuple

import numpy as np

from kvsim.reports.frames import LOGGED_REQUEST_COLUMNS
from kvsim.sim.serving.step_totals import CHUNK_STEPS, STEP_COLUMNS, StepTotals, Timeline

__all__ = ["CHUNK_STEPS", "FINISH_REASONS", "REQUEST_COLUMNS", "STEP_COLUMNS", "RequestLog",
           "StepLog", "StepRecord"]


class StepRecord(NamedTuple):
    """One engine step of one replica, as the step log stores it (fields in column order)."""

    t_start: float
    duration: float
    replica: int
    batch_size: int
    scheduled_tokens: int
    output_tokens: int
    num_running: int
    num_waiting: int
    kv_used_blocks: int
    kv_cached_idle_blocks: int
    token_slots: int
    internal_slots: int
    reserved_slots: int
    external_slots: int
    preemptions: int
    prefix_queries_tokens: int
    prefix_hit_tokens: int
    swap_out_blocks: int
    swap_in_blocks: int
    offload_blocks: int
    promote_blocks: int
    compact_blocks: int
    host_used_blocks: int
    transfer_s: float


assert StepRecord._fields == STEP_COLUMNS   # the step log's columns (step_totals.py)

#: The request log's columns: the requests.csv columns the simulator logs (the others are
#: derived when the frame is built), times as doubles ("d"), everything else as integers ("q").
REQUEST_COLUMNS = {name: "d" if name.endswith("_s") else "q" for name in LOGGED_REQUEST_COLUMNS}
#: ``finish_reason`` codes of the log, and their words in ``requests.csv`` (vLLM's ``stop``
#: and ``length``; ``rejected`` where vLLM answers with an error; empty while unfinished).
FINISH_REASONS = ("", "stop", "length", "rejected")
_STOP, _LENGTH = FINISH_REASONS.index("stop"), FINISH_REASONS.index("length")


class StepLog:
    """Engine steps as running totals and a bounded timeline (and, with ``keep_steps``, every
    step). Steps of one replica come in time order; replicas may interleave."""

    def __init__(self, keep_steps: bool = False, timeline: Timeline | None = None) -> None:
        self.keep_steps = keep_steps
        self.totals = StepTotals()
        self.timeline = timeline or Timeline()
        self._pending: list[StepRecord] = []     # single steps not yet in a block
        self._blocks: list[np.ndarray] = []      # buffered blocks of steps, in log order
        self._num_buffered = 0                   # steps in those blocks
        self._kept: list[np.ndarray] = []

    def __len__(self) -> int:
        return self.totals.num_steps + self._num_buffered + len(self._pending)

    def append(self, record: StepRecord) -> None:
        """Log one step."""
        self._pending.append(record)
        if len(self._pending) + self._num_buffered >= CHUNK_STEPS:
            self.flush(whole_chunks=True)

    def extend(self, columns: Mapping[str, np.ndarray]) -> None:
        """Log a run of steps at once: one 1-d array per :data:`STEP_COLUMNS` name, all of one
        length (row ``i`` of every array is one step)."""
        arrays = [np.asarray(columns[name], dtype=np.float64) for name in STEP_COLUMNS]
        if set(columns) != set(STEP_COLUMNS) or len({a.shape for a in arrays}) > 1 \
                or arrays[0].ndim != 1:
            raise ValueError("extend needs every step column as 1-d arrays of one length")
        self.extend_rows(np.column_stack(arrays))

    def extend_rows(self, rows: np.ndarray) -> None:
        """:meth:`extend` for steps given as one float64 array, a row per step and a column
        per :data:`STEP_COLUMNS` name (the log keeps the array)."""
        self._seal_pending()
        self._blocks.append(rows)
        self._num_buffered += len(rows)
        if self._num_buffered >= CHUNK_STEPS:
            self.flush(whole_chunks=True)

    def flush(self, whole_chunks: bool = False) -> None:
        """Fold the buffered steps into the totals and the timeline, :data:`CHUNK_STEPS` at a
        time (a fold costs the same for one step as for thousands); ``whole_chunks``: only
        whole chunks, the rest stays buffered. The log folds whole chunks as it goes, so the
        chunks are the same whatever blocks the steps came in (one step, or a decode run's
        many), and so are the rounding of the sums and the timeline to the last bit."""
        self._seal_pending()
        if not self._blocks:
            return
        block = self._blocks[0] if len(self._blocks) == 1 else np.concatenate(self._blocks)
        end = len(block) - len(block) % CHUNK_STEPS if whole_chunks else len(block)
        for start in range(0, end, CHUNK_STEPS):
            self._fold(block[start:start + CHUNK_STEPS])
        self._blocks = [block[end:]] if end < len(block) else []
        self._num_buffered = len(block) - end

    def finish(self, duration_s: float) -> None:
        """Close the log at the end of the run (simulated second ``duration_s``)."""
        self.flush()
        self.timeline.close(duration_s)

    @property
    def columns(self) -> dict[str, np.ndarray]:
        """Every step, one array per :data:`STEP_COLUMNS` name (``keep_steps`` only)."""
        if not self.keep_steps:
            raise ValueError("the per-step log was not kept: simulate with keep_steps=True")
        self.flush()
        block = np.concatenate(self._kept) if self._kept else np.empty((0, len(STEP_COLUMNS)))
        return {name: np.ascontiguousarray(block[:, i]) for i, name in enumerate(STEP_COLUMNS)}

    def _seal_pending(self) -> None:
        """Turn the single steps logged since the last block into a block of their own."""
        if self._pending:
            self._blocks.append(np.array(self._pending, dtype=np.float64))
            self._num_buffered += len(self._pending)
            self._pending.clear()

    def _fold(self, block: np.ndarray) -> None:
        if not len(block):
            return
        self.totals.add(block)
        self.timeline.add(block)
        if self.keep_steps:
            self._kept.append(block)


#: The request log's columns an arrival fills from the request's attributes of the same name,
#: then the replica's (:meth:`RequestLog.on_arrival`).
_REQUEST_FIELDS = ("request_id", "trace_line", "arrival_s", "prompt_tokens", "output_tokens",
                   "priority")
_ARRIVAL_FIELDS = (*_REQUEST_FIELDS, "replica")
_arrival_values = attrgetter(*_REQUEST_FIELDS)


class RequestLog:
    """Per-request timestamps (simulated seconds, NaN until they happen) and cache facts, by
    arrival order.

    ``watch`` (optional, e.g. the planner's :class:`~kvsim.sim.plan.stop.SloStop`) is told of
    every arrival, first token, finish and rejection after the log recorded it:
    ``watch.on_arrival(log, row)``, ``on_first_token(log, row, now)``,
    ``on_finish(log, row, now)``, ``on_rejected(log, row)``. It only reads the log."""

    def __init__(self, watch=None) -> None:
        self.columns = {name: array(code) for name, code in REQUEST_COLUMNS.items()}
        # per column: its append, and where an arrival's value comes from (_ARRIVAL_FIELDS'
        # index) or its blank (times NaN, counts 0 until they happen)
        self._blank_row = [(column.append, _ARRIVAL_FIELDS.index(name)
                            if name in _ARRIVAL_FIELDS else None,
                            math.nan if code == "d" else 0)
                           for (name, code), column in zip(REQUEST_COLUMNS.items(),
                                                           self.columns.values())]
        self._row: dict[int, int] = {}
        self.watch = watch

    def __len__(self) -> int:
        return len(self.columns["request_id"])

    def on_arrival(self, request, replica: int) -> None:
        self._row[request.request_id] = len(self)
        known = (*_arrival_values(request), replica)
        for append, at, blank in self._blank_row:
            append(blank if at is None else known[at])
        if self.watch is not None:
            self.watch.on_arrival(self, len(self) - 1)

    def _set(self, request_id: int, name: str, value) -> None:
        self.columns[name][self._row[request_id]] = value

    def on_routed(self, request_id: int, replica: int) -> None:
        self._set(request_id, "replica", replica)

    def on_truncated(self, request) -> None:
        """``request`` was cut to fit (``--long-prompt truncate``): its row holds the lengths
        it runs with, flagged."""
        rid = request.request_id
        self._set(rid, "truncated", 1)
        self._set(rid, "prompt_tokens", request.prompt_tokens)
        self._set(rid, "output_tokens", request.output_tokens)

    def on_scheduled(self, request_id: int, now: float) -> None:
        row = self._row[request_id]
        if math.isnan(self.columns["first_scheduled_s"][row]):
            self.columns["first_scheduled_s"][row] = now

    def on_first_token(self, seq, now: float) -> None:
        self._set(seq.request_id, "first_token_s", now)
        if self.watch is not None:
            self.watch.on_first_token(self, self._row[seq.request_id], now)

    def on_finish(self, seq, now: float) -> None:
        row, columns = self._row.pop(seq.request_id), self.columns
        columns["finish_s"][row] = now
        columns["completed"][row] = 1
        columns["cached_tokens"][row] = max(seq.num_cached_tokens, 0)
        columns["num_preemptions"][row] = seq.num_preemptions
        columns["generated_tokens"][row] = seq.num_output_tokens
        columns["finish_reason"][row] = _STOP if seq.num_output_tokens >= seq.max_tokens \
            else _LENGTH
        if self.watch is not None:
            self.watch.on_finish(self, row, now)

    def on_rejected(self, request_id: int) -> None:
        self._set(request_id, "rejected", 1)
        self._set(request_id, "finish_reason", FINISH_REASONS.index("rejected"))
        row = self._row.pop(request_id)
        if self.watch is not None:
            self.watch.on_rejected(self, row)
