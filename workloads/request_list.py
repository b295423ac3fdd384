"""Requests given as a Python list (``kvsim.run([...])``): the checks a trace file's lines get,
each failure a one-line :class:`~kvsim.errors.TraceError` naming the entry (``requests[3]``) and
the field."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsim.errors import TraceError
from kvsim.workloads import fields as F
from kvsim.workloads.request import Request


def checked_requests(requests: Any, where: str = "requests") -> list[Request]:
    """``requests`` (any iterable of :class:`Request`) as a list, each checked as a trace
    line would be, in arrival order, with ids of their own."""
    if isinstance(requests, (str, bytes, dict)) or not hasattr(requests, "__iter__"):
        raise TraceError(f"expected a trace file, sample:NAME or a list of Request objects, "
                         f"got {type(requests).__name__}", location=where)
    found = list(requests)
    if not found:
        raise TraceError("no requests: the list is empty", location=where)
    seen: dict[int, int] = {}
    last = float("-inf")
    for i, request in enumerate(found):
        loc = f"{where}[{i}]"
        _check_request(request, loc)
        if request.request_id in seen:
            raise F.fail(loc, "request_id", f"{request.request_id} is also the id of "
                         f"{where}[{seen[request.request_id]}]; each request needs its own")
        seen[request.request_id] = i
        if request.arrival_s < last:
            raise F.fail(loc, "arrival_s", f"time goes backwards ({request.arrival_s:.15g} "
                         f"after {last:.15g}); sort the list by arrival_s")
        last = request.arrival_s
    return found


def _plain(value: Any) -> Any:
    """A numpy integer or float as Python's (a row of a DataFrame holds numpy's); other values
    as they are, for the field checks to judge."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _check_request(request: Any, loc: str) -> None:
    """One entry: a :class:`Request` whose fields hold what a trace line's would (numpy's
    numbers made Python's)."""
    if not isinstance(request, Request):
        raise TraceError(f"expected a kvsim.workloads.Request, got "
                         f"{type(request).__name__}", location=loc)
    request.request_id = F.integer(_plain(request.request_id), "request_id", loc)
    request.arrival_s = F.number(_plain(request.arrival_s), "arrival_s", loc)
    request.prompt_tokens = F.length(_plain(request.prompt_tokens), "prompt_tokens", loc)
    request.output_tokens = F.length(_plain(request.output_tokens), "output_tokens", loc)
    request.priority = F.priority(_plain(request.priority), "priority", loc)
    ids, hashes = request.prompt_token_ids, request.prefix_hashes
    if ids is not None and hashes is not None:
        raise F.fail(loc, "prefix_hashes", "give prompt_token_ids or prefix_hashes, not both")
    if ids is not None and len(ids) != request.prompt_tokens:
        raise F.fail(loc, "prompt_token_ids", f"{len(ids)} ids for prompt_tokens "
                     f"{request.prompt_tokens}; give one id per prompt token")
    if hashes is not None:
        F.length(request.hash_block_size, "hash_block_size", loc)
        F.hash_count(np.asarray(hashes), request.prompt_tokens, request.hash_block_size,
                     "prefix_hashes", loc)
