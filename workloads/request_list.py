"""Requests given as a Python list (``kvsim.run([...])``): the checks a trace file's lines get,
each failure a one-line :class:`~kvsim.errors.TraceError` naming the entry (``requests[3]``) and
the field."""

from __future__ import annotations

from dataclasses import replace
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
    position = {id(request): i for i, request in enumerate(found)}     # (for continues)
    last = float("-inf")
    for i, request in enumerate(found):
        loc = f"{where}[{i}]"
        _check_request(request, loc)
        _check_parent(request, i, position, loc, where)
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
    _check_ids(ids, request.prompt_tokens, "prompt_token_ids", "prompt_tokens", loc)
    _check_ids(request.output_token_ids, request.output_tokens, "output_token_ids",
               "output_tokens", loc)
    if hashes is not None:
        F.length(request.hash_block_size, "hash_block_size", loc)
        F.hash_count(np.asarray(hashes), request.prompt_tokens, request.hash_block_size,
                     "prefix_hashes", loc)


def _check_ids(ids, count: int, name: str, counted: str, loc: str) -> None:
    """Token ids, when given: ``count`` non-negative integers."""
    if ids is None:
        return
    array = np.asarray(ids)
    if array.ndim != 1 or array.dtype.kind not in "iu" or (len(array) and array.min() < 0):
        raise F.fail(loc, name, "expected a flat list or array of non-negative integer ids")
    if len(array) != count:
        raise F.fail(loc, name, f"{len(array)} ids for {counted} {count}; give one id per "
                     "token")


def _check_parent(request: Request, i: int, position: dict[int, int], loc: str,
                  where: str) -> None:
    """``continues``, when given: a Request arriving before this one (earlier in the list, or
    not in it: left out by a filter), whose prompt and output this prompt holds, and no chain
    of them leading back to it."""
    parent = request.continues
    if parent is None:
        return
    if not isinstance(parent, Request) or position.get(id(parent), -1) >= i:
        raise F.fail(loc, "continues", "must be a Request before this one (the one whose "
                     "prompt and output this prompt starts with)")
    if request.prompt_token_ids is not None:
        raise F.fail(loc, "continues", "give prompt_token_ids or continues, not both")
    whole = parent.prompt_tokens + parent.output_tokens
    if request.prompt_tokens < whole:
        raise F.fail(loc, "prompt_tokens", f"{request.prompt_tokens} is shorter than the "
                     f"request it continues: its prompt + output is {whole} tokens")
    chain, node = {id(request)}, parent
    while node is not None:
        if id(node) in chain:
            raise F.fail(loc, "continues", "leads back to a request already in its chain")
        chain.add(id(node))
        node = node.continues


def copied_requests(requests: list[Request]) -> list[Request]:
    """Copies of ``requests`` (each one continuing the copy of its parent) for a run that
    cuts requests in place (``long_prompt="truncate"``), so the caller's stay as they were."""
    copies: dict[int, Request] = {}
    out = []
    for request in requests:
        copy = replace(request)
        if request.continues is not None:
            copy.continues = copies.get(id(request.continues), request.continues)
        copies[id(request)] = copy
        out.append(copy)
    return out
