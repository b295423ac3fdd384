"""CSV trace formats: Azure LLM inference and BurstGPT.

**Azure LLM inference** (2023 and 2024 releases of Azure/AzurePublicDataset): header
``TIMESTAMP,ContextTokens,GeneratedTokens``; ``TIMESTAMP`` is wall-clock time such as
``2023-11-16 18:17:03.9799600`` (any number of fractional digits, optional ``Z`` / ``+hh:mm``
offset). No prefix information: every request's blocks are its own.

**BurstGPT**: header ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``;
``Timestamp`` is seconds since the trace start. Rows with zero ``Response tokens`` are failed
requests; :attr:`TraceOptions.model_filter` keeps one model (``ChatGPT``, ``GPT-4``). No prefix
information.

Rows that hold no request to run (BurstGPT's failed ones, zero prompt tokens, zero generated
tokens in Azure's, another model's) are left out and counted by reason
(:class:`~kvsim.workloads.request.LeftOutRow`; a run's summary reports them): public traces
carry such rows, and a user cannot be asked to edit them away.

Columns are matched by header name, in any order; extra columns are ignored. Errors name the
file's line number (the header is line 1 of the file, blank lines count).
"""

from __future__ import annotations

import csv
import datetime as dt
import re
from functools import lru_cache
from typing import Iterator

from kvsim.errors import TraceError
from kvsim.workloads.bundled import shown
from kvsim.workloads import fields as F
from kvsim.workloads.request import LeftOutRow, Request

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
AZURE_TIME_FIELD = "TIMESTAMP"
BURSTGPT_TIME_FIELD = "Timestamp"

_WALLCLOCK = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d(?:\.\d*)?)\s*(Z|[+-]\d\d:?\d\d)?$")
_EPOCH_DAY = dt.date(2000, 1, 1).toordinal()


def split_row(text: str) -> list[str]:
    """The cells of one CSV line (quoted cells handled), stripped."""
    cells = next(csv.reader([text])) if '"' in text else text.split(",")
    return [c.strip() for c in cells]


def header_kind(text: str) -> str | None:
    """``"azure"`` or ``"burstgpt"`` when ``text`` is that format's header line, or names
    more of its columns than of the other's (its reading then names the missing ones), else
    None."""
    names = set(split_row(text))
    azure, burst = len(names & set(AZURE_COLUMNS)), len(names & set(BURSTGPT_COLUMNS))
    if azure > burst:
        return "azure"
    return "burstgpt" if burst > azure else None


def column_index(header: str, wanted: tuple[str, ...], loc: str) -> list[int]:
    """Positions of the ``wanted`` columns in ``header``, or an error naming a missing one."""
    names = split_row(header)
    for name in wanted:
        if name not in names:
            text = header.strip()
            what = (f"the first line is JSON, not a CSV header with {', '.join(wanted)} "
                    "(the format given is not the file's)"
                    if text.startswith("{") else f"missing column in header {F.preview(text, 80)}")
            raise TraceError(what, location=loc, field=name)
    return [names.index(name) for name in wanted]


def rows(lines, path, wanted: tuple[str, ...]) -> Iterator[tuple[int, str, list[str]]]:
    """``(line_no, loc, cells)`` for each data row, the ``wanted`` columns in order."""
    line_no, header = next(lines)
    name = shown(path)
    cols = column_index(header, wanted, f"{name}:{line_no}")
    width, num_columns = max(cols) + 1, len(split_row(header))
    for line_no, text in lines:
        loc = f"{name}:{line_no}"
        cells = split_row(text)
        if len(cells) < width:
            missing = wanted[next(i for i, c in enumerate(cols) if c >= len(cells))]
            raise TraceError(f"row has {len(cells)} columns, expected at least {width}; "
                             f"truncated line?", location=loc, field=missing)
        if len(cells) > num_columns:     # (a file written with trailing commas: its header too)
            raise TraceError(f"row has {len(cells)} columns, the header {num_columns}: a "
                             "comma too many, or rows of another file?", location=loc)
        yield line_no, loc, [cells[c] for c in cols]


def azure_requests(lines, path) -> Iterator[tuple[int, Request | LeftOutRow]]:
    """``(line_no, request)`` per Azure row (a :class:`LeftOutRow` for one without prompt or
    output); ``arrival_s`` is seconds since 2000-01-01. Times with a zone and times without
    one (local to no one knows where) are not mixed."""
    zoned = None
    for line_no, loc, (stamp, context, generated) in rows(lines, path, AZURE_COLUMNS):
        t, has_zone = wallclock_seconds(stamp, AZURE_TIME_FIELD, loc)
        if zoned is None:
            zoned = has_zone
        elif has_zone != zoned:
            raise F.fail(loc, AZURE_TIME_FIELD, f"{stamp!r} has {'a' if has_zone else 'no'} "
                         f"time zone, and the rows before {'do not' if has_zone else 'do'}: "
                         "their gap would be off by the zone's offset")
        empty = _left_out(context, "ContextTokens", "empty_prompt", loc) or \
            _left_out(generated, "GeneratedTokens", "no_output", loc)
        yield line_no, LeftOutRow(t, empty) if empty else Request(
            -1, t, F.length(context, "ContextTokens", loc, text=True),
            F.length(generated, "GeneratedTokens", loc, text=True), may_be_continued=False)


def _left_out(cell: str, name: str, reason: str, loc: str) -> str | None:
    """``reason`` when the token count ``cell`` is 0 (a negative one is an error)."""
    n = F.integer(cell, name, loc, text=True)
    if n < 0:
        raise F.fail(loc, name, f"must not be negative, got {n}")
    return reason if n == 0 else None


def burstgpt_requests(lines, path, model: str | None
                      ) -> Iterator[tuple[int, Request | LeftOutRow]]:
    """``(line_no, request)`` per BurstGPT row: a request for a successful row of ``model``
    (all models if None), else a :class:`LeftOutRow`."""
    wanted = None if model is None else model.strip().lower()
    found = False                    # a row of the model asked for
    others: set[str] = set()         # models of the rows the filter left out
    for line_no, loc, (stamp, name, request, response) in rows(lines, path, BURSTGPT_COLUMNS):
        t = F.number(stamp, BURSTGPT_TIME_FIELD, loc, text=True)
        no_prompt = _left_out(request, "Request tokens", "empty_prompt", loc)
        empty = _left_out(response, "Response tokens", "failed", loc) or no_prompt
        if wanted is not None and name.lower() != wanted:
            if not empty:
                others.add(name)        # (a model the filter could have kept)
            empty = "other_model"
        else:
            found = True
        if empty:
            yield line_no, LeftOutRow(t, empty)
            continue
        yield line_no, Request(-1, t, F.length(request, "Request tokens", loc, text=True),
                               F.length(response, "Response tokens", loc, text=True),
                               may_be_continued=False)
    if wanted is not None and not found and others:
        raise TraceError(f"{shown(path)} has no row of model {model!r}; its models: "
                         f"{', '.join(sorted(others))}", field="trace_model")


def wallclock_seconds(text: str, name: str, loc: str) -> tuple[float, bool]:
    """Seconds since 2000-01-01 00:00 UTC of a ``YYYY-MM-DD hh:mm:ss[.f][tz]`` time (UTC
    without a zone), and whether it has one."""
    m = _WALLCLOCK.match(text)
    if m is None:
        raise F.fail(loc, name, f"expected a time like '2023-11-16 18:17:03.98', got {text!r}")
    year, month, day, hour, minute = (int(g) for g in m.groups()[:5])
    try:
        days = _day_number(year, month, day)
    except ValueError as e:
        raise F.fail(loc, name, f"invalid date {text!r}: {e}") from None
    if hour > 23 or minute > 59 or float(m.group(6)) >= 61:
        raise F.fail(loc, name, f"invalid time of day {text!r}")
    seconds = days * 86400.0 + hour * 3600 + minute * 60 + float(m.group(6))
    return seconds - _offset_s(m.group(7)), m.group(7) is not None


@lru_cache(maxsize=64)
def _day_number(year: int, month: int, day: int) -> int:
    return dt.date(year, month, day).toordinal() - _EPOCH_DAY


def _offset_s(tz: str | None) -> float:
    if not tz or tz == "Z":
        return 0.0
    digits = tz[1:].replace(":", "")
    sign = -1 if tz[0] == "-" else 1
    return sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
