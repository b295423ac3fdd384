"""Options every trace-reading command shares: format, window, limit, rate scale, order, seed."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from kvsim.errors import TraceError

FORMATS = ("native", "mooncake", "azure", "burstgpt")
"""Trace formats :func:`kvsim.workloads.load_trace` reads (``--format`` values)."""

FORMAT_ALIASES = {"kvsim": "native", "jsonl": "native", "azure-llm": "azure"}
#: ``--format`` choices: the formats and their aliases.
TraceFormat = Literal[FORMATS + tuple(FORMAT_ALIASES)]


@dataclass(frozen=True)
class TraceOptions:
    """How to read a trace and which part of it to keep.

    - ``fmt``: one of :data:`FORMATS` (or an alias: ``kvsim``, ``jsonl``, ``azure-llm``); ``None``
      detects the format from the file's first non-blank line.
    - ``start_s`` / ``end_s``: keep requests whose arrival, in seconds after the *first request of
      the file* (after the model filter), lies in ``[start_s, end_s)``. Both refer to the trace's own clock, before
      ``rate_scale``. ``None`` leaves that side open.
    - ``limit``: keep at most this many requests (after the window).
    - ``rate_scale``: request-rate multiplier, as vLLM's and Vidur's benchmarks use it:
      ``2.0`` doubles the request rate, i.e. every inter-arrival gap is divided by 2;
      ``0.5`` halves the rate (gaps doubled). Must be a finite number > 0.
    - ``sort``: accept out-of-order timestamps and sort the requests by arrival (stable). This
      reads the whole file before yielding anything. Without it, a timestamp earlier than the
      previous line's is an error.
    - ``seed``: seed of the randomised transforms. Loading itself is deterministic and does not
      draw random numbers; the seed is kept so every command takes the same options.
    - ``model_filter``: BurstGPT only: keep rows whose ``Model`` equals this (case-insensitive),
      e.g. ``"ChatGPT"`` or ``"GPT-4"``.
    """

    fmt: str | None = None
    limit: int | None = None
    start_s: float | None = None
    end_s: float | None = None
    rate_scale: float = 1.0
    sort: bool = False
    seed: int = 0
    model_filter: str | None = None

    def checked(self) -> "TraceOptions":
        """These options, or a :class:`TraceError` naming the first bad one."""
        _check_format(self.fmt)
        if self.limit is not None and (not _is_int(self.limit) or self.limit < 1):
            raise TraceError(f"must be a positive integer, got {self.limit!r}", field="limit")
        if not _is_number(self.rate_scale) or not self.rate_scale > 0:
            raise TraceError(f"must be a finite number > 0, got {self.rate_scale!r}",
                             field="rate_scale")
        for name in ("start_s", "end_s"):
            value = getattr(self, name)
            if value is not None and not (_is_number(value) and value >= 0):
                raise TraceError(f"must be a finite number of seconds >= 0 (from the first "
                                 f"arrival), got {value!r}", field=name)
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise TraceError(f"end ({self.end_s}) must be after start ({self.start_s})",
                             field="end_s")
        if self.model_filter is not None and not (isinstance(self.model_filter, str)
                                                  and self.model_filter.strip()):
            raise TraceError(f"expected a model name, got {self.model_filter!r}",
                             field="trace_model")
        return replace(self, rate_scale=float(self.rate_scale),   # (3 and 3.0: one record)
                       start_s=None if self.start_s is None else float(self.start_s),
                       end_s=None if self.end_s is None else float(self.end_s))

    @property
    def format_name(self) -> str | None:
        """The canonical format name (aliases resolved), or ``None`` to detect it."""
        return None if self.fmt is None else FORMAT_ALIASES.get(self.fmt.lower(), self.fmt.lower())


def _check_format(fmt) -> None:
    if fmt is None:
        return
    name = FORMAT_ALIASES.get(str(fmt).lower(), str(fmt).lower())
    if name not in FORMATS:
        raise TraceError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}",
                         field="format")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
