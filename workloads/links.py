"""Optional JSONL fields that tie a request to its generated tokens and to earlier requests.

- ``output_token_ids``: the tokens the request generated, when recorded (one per output token);
  they are hashed like prompt tokens, so a later prompt that resends them hits their blocks.
- ``request_id`` (string or integer): a name other lines can refer to;
- ``continues``: the ``request_id`` of an earlier line whose whole sequence (its prompt, then
  its ``output_tokens`` generated tokens) this prompt starts with, followed by new tokens:
  multi-turn without token ids (length-only and Mooncake-style lines). ``prompt_tokens`` must
  be at least the earlier request's prompt + output, and it may not arrive before that
  request; a line with ``prompt_token_ids`` names its content already and may not use it.

:class:`Links` reads them line by line. It keeps a named request (even one outside a
``--start``/``--limit`` window) until the last line that continues it, so memory follows the
requests still to be continued, not the file's length: once :data:`KEEP_UNCOUNTED` named
requests are open it reads the file once more to count each name's continuations
(:func:`count_continuations`).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from typing import Callable, Iterable

from kvsim.errors import TraceError
from kvsim.workloads import fields as F
from kvsim.workloads.request import Request


#: Named requests kept before the file is read again to count their continuations: a trace,
#: or a ``--limit`` look at one, with fewer names is read once.
KEEP_UNCOUNTED = 50_000


class Links:
    """The named requests of one file that a later line may still continue.

    ``count``: reads the whole file and returns :func:`count_continuations`. It is called once
    more than ``keep_uncounted`` (default :data:`KEEP_UNCOUNTED`) named requests are open;
    from then on a named request is let go after its last continuation. Without ``count``
    every named request is kept to the end of the file."""

    def __init__(self, count: Callable[[], Counter] | None = None,
                 keep_uncounted: int | None = None) -> None:
        self._lines: dict[str, int] = {}            # every name so far -> its line number
        self._open: dict[str, list] = {}    # name -> [request, continuations to come, time]
        self._count = count
        self._keep_uncounted = KEEP_UNCOUNTED if keep_uncounted is None else keep_uncounted
        self._expected: Counter | None = None       # continuations to come, once counted
        self._consumed: Counter = Counter()         # continuations read before the count

    @property
    def num_open(self) -> int:
        """Named requests kept for a continuation still to come."""
        return len(self._open)

    def read(self, record: dict, loc: str, line_no: int, request: Request) -> None:
        """Apply ``record``'s optional link fields to ``request`` (parsed from line ``loc``)."""
        request.request_id = -line_no       # distinct until the loader numbers kept requests
        _outputs(record, loc, request)
        parent = record.get("continues")
        if parent is not None:
            request.continues = self._parent(F.label(parent, "continues", loc), loc, request)
        name = record.get("request_id")
        request.may_be_continued = name is not None     # only a named line can be continued
        if name is not None:
            self._name(F.label(name, "request_id", loc), loc, line_no, request)

    def _parent(self, name: str, loc: str, request: Request) -> Request:
        if name not in self._open:
            if name in self._lines:
                raise F.fail(loc, "continues", f"{name!r} is continued more often than a first "
                             "reading of the file counted: did the file change while read?")
            raise F.fail(loc, "continues", f"no earlier line has request_id {name!r}")
        if request.prompt_token_ids is not None:
            raise F.fail(loc, "continues", "give prompt_token_ids or continues, not both "
                                           "(token ids already name the whole prompt)")
        entry = self._open[name]
        parent, written = entry[0], entry[2]    # (its time as written: the loader re-times it)
        if request.arrival_s < written:      # (a --sort would put it first)
            raise F.fail(loc, "continues", f"arrives at {request.arrival_s:g} s, before the "
                         f"continued request {name!r} ({written:g} s): a "
                         "continuation starts with that request's output")
        whole = parent.prompt_tokens + parent.output_tokens
        if request.prompt_tokens < whole:
            raise F.fail(loc, "prompt_tokens", f"{request.prompt_tokens} is shorter than the "
                         f"continued request {name!r}: its prompt + output is {whole} tokens")
        entry[1] -= 1                       # (infinite until counted)
        if not entry[1]:
            del self._open[name]            # its last continuation: nothing else can reach it
        elif self._expected is None and self._count is not None:
            self._consumed[name] += 1
        return parent

    def _name(self, name: str, loc: str, line_no: int, request: Request) -> None:
        if name in self._lines:
            first = loc.rsplit(":", 1)[0] + f":{self._lines[name]}"
            raise F.fail(loc, "request_id", f"{name!r} is already used at {first}")
        self._lines[name] = line_no
        if self._expected is not None:
            left = self._expected.pop(name, 0)
            if left:
                self._open[name] = [request, left, request.arrival_s]
            return
        self._open[name] = [request, math.inf, request.arrival_s]
        if self._count is not None and len(self._open) > self._keep_uncounted:
            self._start_counting()

    def _start_counting(self) -> None:
        """Count every name's continuations (the file read once more) and let go of the open
        requests already continued as often as the file continues them."""
        expected, consumed = self._count(), self._consumed
        for name, entry in list(self._open.items()):
            left = expected.pop(name, 0) - consumed.get(name, 0)
            if left > 0:
                entry[1] = left
            else:
                del self._open[name]
        self._expected, self._consumed = expected, Counter()


_CONTINUES = re.compile(r'"continues"\s*:\s*(-?\d+|"[^"]*")\s*[,}]')


def count_continuations(lines: Iterable[tuple[int, str]]) -> Counter:
    """``name -> number of lines whose continues is name``, from numbered lines of a JSONL
    trace. Lines that are not valid JSON objects, or whose ``continues`` is not a valid name,
    are skipped (reading them as requests raises their error), as is everything from an
    unreadable line on."""
    counts: Counter = Counter()
    try:
        for _, text in lines:
            if "continues" in text or "\\" in text:
                name = _continued_name(text)
                if name is not None:
                    counts[name] += 1
    except TraceError:
        pass
    return counts


def _continued_name(text: str) -> str | None:
    """The top-level ``continues`` of one line, or None. The pattern reads a line without
    backslashes that names the key once (every quote then delimits a string); it may also
    read the key of a nested object, which only keeps a named request longer."""
    if "\\" not in text and text.count('"continues"') == 1:
        found = _CONTINUES.search(text)
        if found is not None:
            value = found.group(1)
            return value[1:-1] if value.startswith('"') else str(int(value))
    try:
        record = json.loads(text)
        value = record.get("continues") if isinstance(record, dict) else None
        return None if value is None else F.label(value, "continues", "")
    except (ValueError, RecursionError, TraceError):
        return None


def _outputs(record: dict, loc: str, request: Request) -> None:
    ids = record.get("output_token_ids")
    if ids is None:
        return
    request.output_token_ids = F.token_ids(ids, "output_token_ids", loc)
    if len(request.output_token_ids) != request.output_tokens:
        raise F.fail(loc, "output_token_ids", f"{len(request.output_token_ids)} ids for "
                     f"{request.output_tokens} output tokens; give one per output token")
