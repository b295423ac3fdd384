"""Reading traces: format detection, validation, and the shared transforms.

The simulator calls::

    from kvsim.workloads import load_trace, TraceOptions
    for request in load_trace("trace.jsonl", TraceOptions(limit=1000, rate_scale=2.0)):
        ...

Formats are listed in :mod:`kvsim.workloads.jsonl` (kvsim native, Mooncake) and
:mod:`kvsim.workloads.csvs` (Azure, BurstGPT).
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from typing import Iterable, Iterator

from kvsim.errors import TraceError
from kvsim.workloads import csvs, jsonl
from kvsim.workloads import fields as F
from kvsim.workloads.lines import numbered_lines, where
from kvsim.workloads.options import TraceOptions
from kvsim.workloads.request import LeftOutRow, Request, left_out_text

TIME_FIELDS = {"native": jsonl.NATIVE_TIME_FIELD, "mooncake": jsonl.MOONCAKE_TIME_FIELD,
               "azure": csvs.AZURE_TIME_FIELD, "burstgpt": csvs.BURSTGPT_TIME_FIELD}



def load_trace(path: str | os.PathLike, opts: TraceOptions | None = None,
               left_out: Counter | None = None) -> Iterator[Request]:
    """Yield the requests of the trace at ``path``, validated, as a stream.

    Requests come in arrival order with ``request_id`` ``0, 1, ..., n-1`` and ``arrival_s`` in
    seconds after the first *kept* request (so the first is at 0), divided by
    ``opts.rate_scale``. The file is read one line at a time; only ``opts.sort`` holds the whole
    trace in memory. Reading stops early once ``opts.end_s`` or ``opts.limit`` is reached, so
    lines past that point are not validated.

    Raises :class:`~kvsim.errors.TraceError` (one line naming file, line and field) for bad
    options, an unknown format, an empty file, undecodable bytes, a non-JSON or truncated line,
    a wrong type, a missing field, a length that is not in ``1..10,000,000``, prefix hashes
    that do not match the prompt length, a timestamp earlier than the previous line's (unless
    ``opts.sort``), or when no request is left after the window and filters. Errors are raised
    while iterating, at the first bad line.

    ``left_out``: counts the rows inside the time window that hold no request to run, by
    reason (:data:`~kvsim.workloads.request.LEFT_OUT_REASONS`; emptied when reading starts).
    """
    opts = (opts or TraceOptions()).checked()
    left_out = Counter() if left_out is None else left_out
    left_out.clear()
    fmt, records = _parse(path, opts)
    ordered = _sorted(records) if opts.sort else _check_order(records, path, TIME_FIELDS[fmt])
    count = 0
    for count, request in enumerate(_transform(ordered, opts, left_out), start=1):
        yield request
    if count == 0:
        raise TraceError(_none_left(opts, left_out), location=where(path))


def _none_left(opts: TraceOptions, left_out: Counter) -> str:
    """Why a trace gave no request: its filters (those given), its rows left out, or no data
    lines."""
    filters = [text for text, given in (
        ("the time window (--start, --end)", (opts.start_s, opts.end_s) != (None, None)),
        ("the model filter (--trace-model)", opts.model_filter is not None)) if given]
    if left_out:
        within = f" read with {' and '.join(filters)}" if filters else ""
        return f"no requests: every row{within} was left out ({left_out_text(left_out)})"
    if filters:
        return f"no request left after {' and '.join(filters)}"
    return "no requests: the trace has no data lines"


def read_trace(path: str | os.PathLike, opts: TraceOptions | None = None) -> list[Request]:
    """All requests of :func:`load_trace` as a list (for small traces and tests)."""
    return list(load_trace(path, opts))


def detect_format(first_line: str, loc: str) -> str:
    """The format of a trace whose first non-blank line is ``first_line``."""
    text = first_line.lstrip()
    if text.startswith("{"):
        record = jsonl.parse_object(first_line, loc)
        return "mooncake" if jsonl.looks_like_mooncake(record) else "native"
    kind = csvs.header_kind(text)
    if kind is None:
        raise TraceError("unknown format: expected kvsim/Mooncake JSON lines or an Azure/"
                         f"BurstGPT CSV header, got {F.preview(text)}", location=loc,
                         field="format")
    return kind


def _check_given_format(fmt: str, first: tuple[int, str], path) -> None:
    """A JSON-lines format given that the first line cannot be: not JSON, or none of that
    format's keys (a line may hold keys of both: then the format given decides)."""
    line_no, text = first
    loc = where(path, line_no)
    record = jsonl.parse_object(text, loc) if text.lstrip().startswith("{") else None
    if record is None or not jsonl.has_keys_of(fmt, record):
        found = None if record is None else detect_format(text, loc)
        what = f"a {found} line" if found else f"no JSON line ({F.preview(text.strip())})"
        raise TraceError(f"the {fmt} format reads JSON lines of its own, and the first line is "
                         f"{what}: leave the format out to detect the file's",
                         location=where(path, line_no), field="format")


def _parse(path, opts: TraceOptions) -> tuple[str, Iterator[tuple[int, Request]]]:
    lines = numbered_lines(path)
    first = next(lines)
    lines = itertools.chain([first], lines)
    fmt = opts.format_name or detect_format(first[1], where(path, first[0]))
    if fmt in ("native", "mooncake") and opts.fmt is not None:
        _check_given_format(fmt, first, path)
    if opts.model_filter is not None and fmt != "burstgpt":
        raise TraceError(f"this {fmt} trace has no Model column; only BurstGPT traces can be "
                         "filtered by model", field="trace_model")
    if fmt == "native":
        return fmt, jsonl.native_requests(lines, path)
    if fmt == "mooncake":
        return fmt, jsonl.mooncake_requests(lines, path)
    if fmt == "azure":
        return fmt, csvs.azure_requests(lines, path)
    return fmt, csvs.burstgpt_requests(lines, path, opts.model_filter)


def _check_order(records, path, time_field: str) -> Iterator[Request]:
    """The records' requests, refused where one arrives before the request before it (the
    rows left out are passed on unchecked: a failed row's time says nothing of the order)."""
    last, last_line = float("-inf"), 0
    for line_no, request in records:
        if request.__class__ is LeftOutRow:
            yield request
            continue
        request.trace_line = line_no
        if request.arrival_s < last:    # (in seconds apart: the field may be ms, or a date)
            raise TraceError(f"time goes backwards: it arrives "
                             f"{last - request.arrival_s:.6g} s before line {last_line}; use "
                             "--sort to accept an unsorted trace",
                             location=where(path, line_no), field=time_field)
        last, last_line = request.arrival_s, line_no
        yield request


def _sorted(records) -> list[Request]:
    """The records' requests (and rows left out) by arrival, each request knowing its line."""
    rows = []
    for line_no, request in records:
        if request.__class__ is not LeftOutRow:
            request.trace_line = line_no
        rows.append(request)
    return sorted(rows, key=lambda r: r.arrival_s)


def _transform(requests: Iterable[Request | LeftOutRow], opts: TraceOptions,
               left_out: Counter) -> Iterator[Request]:
    """Window, limit, re-time and renumber requests already in arrival order; count the rows
    left out inside the window (timed from the first request, as the window is; those
    before it count when the window starts with the trace)."""
    origin = kept_origin = None
    start = float("-inf") if opts.start_s is None else opts.start_s
    end = float("inf") if opts.end_s is None else opts.end_s
    kept = 0
    for request in requests:
        if request.__class__ is LeftOutRow:     # (before the first request: in the window
            if (opts.start_s is None if origin is None   # only when it starts with the trace)
                    else start <= request.arrival_s - origin < end):
                left_out[request.reason] += 1
            continue
        origin = request.arrival_s if origin is None else origin
        offset = request.arrival_s - origin
        if offset < start:
            continue
        if offset >= end:
            return
        kept_origin = request.arrival_s if kept_origin is None else kept_origin
        request.request_id = kept
        request.arrival_s = (request.arrival_s - kept_origin) / opts.rate_scale
        if request.arrival_s > F.MAX_SECONDS:
            raise TraceError(f"rate scale {opts.rate_scale:g} puts request {kept} at "
                             f"{request.arrival_s:.3g} s, later than a trace may hold "
                             f"({F.MAX_SECONDS:g} s)", field="rate_scale")
        kept += 1
        yield request
        if kept == opts.limit:
            return


