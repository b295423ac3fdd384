"""Writing requests as kvsim native JSONL (the format is described in :mod:`.jsonl`)."""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from typing import Iterable

from kvsim.output_file import replacing
from kvsim.workloads.request import Request


def native_record(request: Request, named: bool = False) -> dict:
    """The native JSONL object of ``request`` (optional keys only when set); ``named``: write
    its ``request_id`` (a later request continues it)."""
    record = {"arrival_s": round(float(request.arrival_s), 6),
              "prompt_tokens": int(request.prompt_tokens),
              "output_tokens": int(request.output_tokens)}
    if request.prompt_token_ids is not None:
        record["prompt_token_ids"] = request.prompt_token_ids.tolist()
    elif request.prefix_hashes is not None:
        record["block_hashes"] = request.prefix_hashes.tolist()
        record["hash_block_size"] = int(request.hash_block_size)
    if request.output_token_ids is not None:
        record["output_token_ids"] = request.output_token_ids.tolist()
    if named:
        record["request_id"] = int(request.request_id)
    if request.continues is not None:
        record["continues"] = int(request.continues.request_id)
    if request.priority:
        record["priority"] = int(request.priority)
    for name in ("session_id", "template_id"):
        if getattr(request, name) is not None:
            record[name] = getattr(request, name)
    return record


def write_native(requests: Iterable[Request], path: str | os.PathLike) -> int:
    """Write ``requests`` to ``path`` as native JSONL; returns how many were written. A request
    that a later one continues gets its ``request_id`` written (so the list is held whole;
    :func:`write_lines` streams). The file appears whole or not at all."""
    requests = list(requests)
    continued = {id(r.continues) for r in requests if r.continues is not None}
    return write_lines(((r, id(r) in continued) for r in requests), path)


def write_lines(records: Iterable[tuple[Request, bool]], path: str | os.PathLike,
                progress=None) -> int:
    """Write ``(request, continued)`` pairs to ``path`` as native JSONL, one line at a time
    (``continued``: a later line continues it, so its ``request_id`` is written); returns how
    many were written; ``progress(count)`` is told of every 1,000th.

    The file appears whole or not at all: lines go to a temporary file beside ``path`` that
    replaces it only once every request is written. ``"-"``: standard output, as they come.
    """
    count = 0
    with nullcontext(sys.stdout) if str(path) == "-" else replacing(path) as f:
        try:
            for count, (request, continued) in enumerate(records, start=1):
                f.write(json.dumps(native_record(request, continued), separators=(", ", ": "))
                        + "\n")
                if progress is not None and not count % 1000:
                    progress(count)
        except BaseException as e:      # (an interrupt: what the reader got, in words)
            if str(path) == "-" and count:
                e.left = (f"standard output got the first {count:,} requests only, a partial "
                          "trace")
            raise
    return count
