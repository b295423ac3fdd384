"""What the simulation remembers: one row per engine step and one per request.

Both logs are columnar (``array`` columns, cheap appends in the hot loop, 8 bytes a value), so a
million-request trace keeps no per-request Python object once a request is done.
:mod:`kvsim.sim.results` turns them into the output frames.
"""

from __future__ import annotations

import math
from array import array

STEP_COLUMNS = (
    "t_start", "duration", "replica", "batch_size", "scheduled_tokens", "output_tokens",
    "num_running", "num_waiting", "kv_used_blocks", "kv_cached_idle_blocks",
    "token_slots", "internal_slots", "reserved_slots", "external_slots",
    "preemptions", "prefix_queries_tokens", "prefix_hit_tokens",
    "swap_out_blocks", "swap_in_blocks", "offload_blocks", "promote_blocks", "compact_blocks",
    "host_used_blocks", "transfer_s",
)

REQUEST_COLUMNS = {
    "request_id": "q", "arrival_s": "d", "prompt_tokens": "q", "output_tokens": "q",
    "priority": "q", "replica": "q", "first_scheduled_s": "d", "first_token_s": "d",
    "finish_s": "d", "cached_tokens": "q", "num_preemptions": "q", "completed": "q",
    "rejected": "q", "truncated": "q", "generated_tokens": "q", "finish_reason": "q",
}
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

    def append(self, *values) -> None:
        """Append one step; ``values`` in :data:`STEP_COLUMNS` order."""
        for append, value in zip(self._appenders, values):
            append(value)


class RequestLog:
    """Per-request timestamps (simulated seconds, NaN until they happen) and cache facts, by
    arrival order.

    ``watch`` (optional, e.g. the planner's :class:`~kvsim.sim.plan_stop.SloStop`) is told of
    every arrival, first token, finish and rejection after the log recorded it:
    ``watch.on_arrival(log, row)``, ``on_first_token(log, row, now)``,
    ``on_finish(log, row, now)``, ``on_rejected(log, row)``. It only reads the log."""

    def __init__(self, watch=None) -> None:
        self.columns = {name: array(code) for name, code in REQUEST_COLUMNS.items()}
        self._row: dict[int, int] = {}
        self.watch = watch

    def __len__(self) -> int:
        return len(self.columns["request_id"])

    def on_arrival(self, request, replica: int) -> None:
        self._row[request.request_id] = len(self)
        values = (request.request_id, request.arrival_s, request.prompt_tokens,
                  request.output_tokens, request.priority, replica, math.nan, math.nan,
                  math.nan, 0, 0, 0, 0, 0, 0, 0)
        for column, value in zip(self.columns.values(), values):
            column.append(value)
        if self.watch is not None:
            self.watch.on_arrival(self, len(self) - 1)

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
        if self.watch is not None:
            self.watch.on_first_token(self, self._row[seq.request_id], now)

    def on_finish(self, seq, now: float) -> None:
        rid = seq.request_id
        self._set(rid, "finish_s", now)
        self._set(rid, "completed", 1)
        self._set(rid, "cached_tokens", max(seq.num_cached_tokens, 0))
        self._set(rid, "num_preemptions", seq.num_preemptions)
        self._set(rid, "generated_tokens", seq.num_output_tokens)
        self._set(rid, "finish_reason", FINISH_REASONS.index(
            "stop" if seq.num_output_tokens >= seq.max_tokens else "length"))
        row = self._row.pop(rid)
        if self.watch is not None:
            self.watch.on_finish(self, row, now)

    def on_rejected(self, request_id: int) -> None:
        self._set(request_id, "rejected", 1)
        self._set(request_id, "finish_reason", FINISH_REASONS.index("rejected"))
        row = self._row.pop(request_id)
        if self.watch is not None:
            self.watch.on_rejected(self, row)
