"""What the simulation remembers: one row per engine step and one per request.

Both logs are columnar (``array`` columns, cheap appends in the hot loop, 8 bytes a value), so a
million-request trace keeps no per-request Python object once a request is done.
:mod:`kvsim.sim.serving.results` turns them into the output frames.
"""

from __future__ import annotations

import math
from array import array
from typing import Mapping, NamedTuple

import numpy as np

from kvsim.reports.frames import LOGGED_REQUEST_COLUMNS


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


STEP_COLUMNS = StepRecord._fields

#: The request log's columns: the requests.csv columns the simulator logs (the others are
#: derived when the frame is built), times as doubles ("d"), everything else as integers ("q").
REQUEST_COLUMNS = {name: "d" if name.endswith("_s") else "q" for name in LOGGED_REQUEST_COLUMNS}
#: ``finish_reason`` codes of the log, and their words in ``requests.csv`` (vLLM's ``stop``
#: and ``length``; ``rejected`` where vLLM answers with an error; empty while unfinished).
FINISH_REASONS = ("", "stop", "length", "rejected")


class StepLog:
    """Columnar log of engine steps."""

    def __init__(self) -> None:
        self.columns = {name: array("d") for name in STEP_COLUMNS}
        self._appenders = [self.columns[name].append for name in STEP_COLUMNS]

    def __len__(self) -> int:
        return len(self.columns["t_start"])

    def append(self, record: StepRecord) -> None:
        """Append one step."""
        for append, value in zip(self._appenders, record):
            append(value)

    def extend(self, columns: Mapping[str, np.ndarray]) -> None:
        """Append several steps at once: one 1-d array per name of :data:`STEP_COLUMNS`, all
        of the same length (row ``i`` of every array is one step)."""
        arrays = {name: np.asarray(columns[name], dtype=np.float64) for name in STEP_COLUMNS}
        if set(columns) != set(STEP_COLUMNS) or len({a.shape for a in arrays.values()}) > 1 \
                or arrays["t_start"].ndim != 1:
            raise ValueError("extend needs every step column as 1-d arrays of one length")
        for name, values in arrays.items():
            self.columns[name].frombytes(np.ascontiguousarray(values).tobytes())


class RequestLog:
    """Per-request timestamps (simulated seconds, NaN until they happen) and cache facts, by
    arrival order."""

    def __init__(self) -> None:
        self.columns = {name: array(code) for name, code in REQUEST_COLUMNS.items()}
        self._row: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.columns["request_id"])

    def on_arrival(self, request, replica: int) -> None:
        self._row[request.request_id] = len(self)
        known = {"request_id": request.request_id, "arrival_s": request.arrival_s,
                 "prompt_tokens": request.prompt_tokens, "output_tokens": request.output_tokens,
                 "priority": request.priority, "replica": replica}
        for name, column in self.columns.items():   # times NaN, counts 0 until they happen
            column.append(known.get(name, math.nan if column.typecode == "d" else 0))

    def _set(self, request_id: int, name: str, value) -> None:
        self.columns[name][self._row[request_id]] = value

    def on_routed(self, request_id: int, replica: int) -> None:
        self._set(request_id, "replica", replica)

    def on_truncated(self, request_id: int) -> None:
        self._set(request_id, "truncated", 1)

    def on_scheduled(self, request_id: int, now: float) -> None:
        row = self._row[request_id]
        if math.isnan(self.columns["first_scheduled_s"][row]):
            self.columns["first_scheduled_s"][row] = now

    def on_first_token(self, seq, now: float) -> None:
        self._set(seq.request_id, "first_token_s", now)

    def on_finish(self, seq, now: float) -> None:
        rid = seq.request_id
        self._set(rid, "finish_s", now)
        self._set(rid, "completed", 1)
        self._set(rid, "cached_tokens", max(seq.num_cached_tokens, 0))
        self._set(rid, "num_preemptions", seq.num_preemptions)
        self._set(rid, "generated_tokens", seq.num_output_tokens)
        self._set(rid, "finish_reason", FINISH_REASONS.index(
            "stop" if seq.num_output_tokens >= seq.max_tokens else "length"))
        del self._row[rid]

    def on_rejected(self, request_id: int) -> None:
        self._set(request_id, "rejected", 1)
        self._set(request_id, "finish_reason", FINISH_REASONS.index("rejected"))
        del self._row[request_id]
