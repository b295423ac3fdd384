"""Checks of a ``vllm bench serve --save-result --save-detailed`` file, and of a vllm-oracle
replay's requests, for ``kvsim validate-real``.

vLLM writes one entry per request (completed or failed) in ``input_lens``, ``output_lens``,
``ttfts``, ``itls``, ``start_times`` and ``errors``. A failed request keeps vLLM's defaults:
output_len 0, ttft 0, no token gaps, and an error message (empty when the server's HTTP error had
no reason). Anything else wrong is a one-line :class:`KvsimError` naming the file, the field and
the entry.
"""

from __future__ import annotations

import json
import math

import numpy as np

from kvsim.errors import KvsimError


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value, least: int) -> bool:
    return _finite(value) and float(value).is_integer() and value >= least


def _seconds(value) -> bool:
    return _finite(value) and value >= 0


#: Per-request list: (the test of an entry, what an entry must be).
BENCH_LISTS = {
    "input_lens": (lambda v: _whole(v, 1), "a whole number >= 1"),
    "output_lens": (lambda v: _whole(v, 0), "a whole number >= 0"),
    "ttfts": (_seconds, "a time in seconds >= 0"),
    "itls": (lambda v: isinstance(v, list) and all(map(_seconds, v)),
             "a list of times in seconds >= 0"),
    "start_times": (_finite, "a clock time in seconds"),
    "errors": (lambda v: v is None or isinstance(v, str), "a string (empty for a success)"),
}


def _show(value) -> str:
    """A value as the JSON file spells it, shortened."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def bench_list(location: str, data: dict, field: str, n: int) -> list:
    """``data[field]`` checked: a list of ``n`` entries (one per request), each as
    :data:`BENCH_LISTS` wants."""
    values, (ok, expected) = data.get(field), BENCH_LISTS[field]
    if not isinstance(values, list):
        raise KvsimError(f"is {_show(values)}; expected a list with one entry per request",
                         location=location, field=field)
    if len(values) != n:
        raise KvsimError(f"has {len(values)} entries for {n} requests (input_lens); expected "
                         "one per request", location=location, field=field)
    for i, value in enumerate(values):
        if not ok(value):
            bad = [x for x in value if not _seconds(x)] if isinstance(value, list) else []
            what = f"holds {_show(bad[0])}" if bad else f"is {_show(value)}"
            raise KvsimError(f"entry {i} {what}; expected {expected}", location=location,
                             field=field)
    return values


def bench_count(location: str, data: dict) -> int:
    """The number of requests: the entries of ``input_lens``, vLLM's completed + failed."""
    given = data.get("input_lens")
    n = len(bench_list(location, data, "input_lens", len(given) if isinstance(given, list) else 0))
    done, failed = data.get("completed"), data.get("failed")
    if not n:
        raise KvsimError("is empty; expected one entry per request", location=location,
                         field="input_lens")
    if all(isinstance(c, int) and not isinstance(c, bool) for c in (done, failed)) \
            and n != done + failed:
        raise KvsimError(f"has {n} entries; expected one per request ({done} completed + "
                         f"{failed} failed)", location=location, field="input_lens")
    return n


def bench_completed(location: str, data: dict, n: int) -> np.ndarray:
    """Per request, whether it completed (no error and output tokens); a request without an
    error that has a first token must have output tokens."""
    lists = [bench_list(location, data, f, n) for f in ("output_lens", "ttfts", "itls")]
    errors = [""] * n if data.get("errors") is None else bench_list(location, data, "errors", n)
    for i, (out, ttft, itls, error) in enumerate(zip(*lists, errors)):
        if not error and out == 0 and (ttft or itls):
            raise KvsimError(f"entry {i} is 0; expected a whole number >= 1 (the request has "
                             "no error and a first token)", location=location,
                             field="output_lens")
    return np.array([not e for e in errors]) & (np.asarray(lists[0]) > 0)


def bench_starts(location: str, data: dict, n: int) -> np.ndarray:
    """The requests' start times in seconds: ``start_times``, or all 0 for a result without
    them (an older vLLM) whose requests were all sent at once (``request_rate`` inf, no
    ``max_concurrency``, no ramp-up); otherwise vLLM's client paced them (random gaps, a
    concurrency limit, a ramp-up) and their times are unknown."""
    if data.get("start_times") is not None:
        return np.asarray(bench_list(location, data, "start_times", n), dtype=float)
    rate, limit = data.get("request_rate", "inf"), data.get("max_concurrency")
    ramp = data.get("ramp_up_strategy")
    if (rate in ("inf", None) or rate == math.inf) and limit is None and ramp is None:
        return np.zeros(n)
    paced = f", ramp_up_strategy {_show(ramp)}" if ramp is not None else ""
    raise KvsimError(
        f"missing, and the requests were not all sent at once (request_rate {_show(rate)}, "
        f"max_concurrency {_show(limit)}{paced}): their arrival times are unknown, so they "
        "cannot be replayed; pass --trace with the requests and their arrival times",
        location=location, field="start_times")


def bench_duration(location: str, data: dict) -> float:
    """The run's ``duration`` in seconds."""
    duration = data.get("duration")
    if not (_finite(duration) and duration > 0):
        got = "missing" if "duration" not in data else f"is {_show(duration)}"
        raise KvsimError(f"{got}; expected the run's length in seconds > 0", location=location,
                         field="duration")
    return float(duration)


#: A vllm-oracle replay's per-request fields: (the test of a value, what it must be).
ORACLE_FIELDS = {
    "index": (lambda v: _whole(v, 0), "a whole number >= 0 (the request's line)"),
    "prompt_tokens": (lambda v: _whole(v, 1), "a whole number >= 1"),
    "output_tokens": (lambda v: _whole(v, 1), "a whole number >= 1"),
    "num_cached_tokens": (lambda v: _whole(v, 0), "a whole number >= 0"),
    "num_preemptions": (lambda v: _whole(v, 0), "a whole number >= 0"),
    "ttft_s": (_seconds, "a time in seconds >= 0"),
    "e2e_s": (_seconds, "a time in seconds >= 0"),
}


def oracle_requests(location: str, data: dict) -> list[dict]:
    """``data["requests"]`` of a vllm-oracle replay, checked: a list of objects, each with the
    :data:`ORACLE_FIELDS` as they must be, and an end no earlier than its first token."""
    requests = data.get("requests")
    if not isinstance(requests, list) or not all(isinstance(r, dict) for r in requests):
        raise KvsimError(f"is {_show(requests)}; expected a list of request objects",
                         location=location, field="requests")
    for i, request in enumerate(requests):
        for field, (ok, expected) in ORACLE_FIELDS.items():
            if field not in request:
                raise KvsimError(f"request {i} has no {field}", location=location,
                                 field=f"requests[{i}].{field}")
            if not ok(request[field]):
                raise KvsimError(f"is {_show(request[field])}; expected {expected}",
                                 location=location, field=f"requests[{i}].{field}")
        if request["e2e_s"] < request["ttft_s"]:
            raise KvsimError(f"is {_show(request['e2e_s'])}, before the first token "
                             f"({_show(request['ttft_s'])} s)", location=location,
                             field=f"requests[{i}].e2e_s")
    return requests
