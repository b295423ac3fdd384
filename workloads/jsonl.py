"""JSON-lines trace formats: kvsim native and Mooncake.

**kvsim native JSONL**, one JSON object per line (other keys are ignored, unless they look
like a misspelling or another name of one below: see :mod:`.field_names`):

==================  ========  ===========================================================
key                 required  meaning
==================  ========  ===========================================================
``arrival_s``       no        arrival in seconds after the trace start (default 0)
``prompt_tokens``   yes [1]_  prompt length in tokens
``output_tokens``   yes       tokens to generate
``prompt_token_ids`` no       the prompt's token ids (then ``prompt_tokens`` may be omitted;
                              when both are given they must agree)
``block_hashes``    no        prefix ids, one per ``hash_block_size`` tokens of the prompt,
                              the last partial block included (``ceil(prompt/size)`` ids);
                              equal ids at equal positions mean an equal prefix, exactly as
                              Mooncake's ``hash_ids``
``hash_block_size`` with [2]_ tokens each ``block_hashes`` id covers
``priority``        no        integer, lower = more important (as vLLM); default 0
``session_id``      no        string (or integer) naming a conversation / agent task
``template_id``     no        string (or integer) naming a shared system-prompt template
``output_token_ids`` no       the generated tokens, when recorded (see :mod:`.links`)
``request_id``      no        a name for ``continues`` (see :mod:`.links`)
``continues``       no        ``request_id`` of an earlier line whose prompt + output this
                              prompt starts with (see :mod:`.links`)
==================  ========  ===========================================================

.. [1] unless ``prompt_token_ids`` is given.
.. [2] required when ``block_hashes`` is given; the two go together.

A line may carry ``prompt_token_ids`` or ``block_hashes``, not both; with neither the request
shares no prefix with any other. ``{"prompt_token_ids": [...], "output_tokens": N,
"arrival_s": t}`` (the input of ``../shared/tools/vllm-oracle``) is a valid native line.

**Mooncake JSONL** (FAST'25 traces): ``timestamp`` (integer ms since the trace start),
``input_length``, ``output_length``, ``hash_ids`` (one prefix id per 512-token block, the last
partial block included: ``len(hash_ids) == ceil(input_length / 512)``); optionally
``request_id`` and ``continues`` as in native lines.
"""

from __future__ import annotations

import json
import sys
import re
from typing import Iterator

from kvsim.errors import TraceError
from kvsim.workloads import fields as F
from kvsim.workloads.bundled import shown
from kvsim.workloads.field_names import UnknownKeys
from kvsim.workloads.lines import numbered_lines
from kvsim.workloads.links import Links, count_continuations
from kvsim.workloads.request import Request

MOONCAKE_BLOCK = 512
"""Tokens per Mooncake ``hash_ids`` entry."""

#: The end of a JSON object key: a quote, maybe blanks, a colon (in a string value a colon
#: follows no quote unless the string holds '":', which only costs a second parse).
_KEY_END = re.compile(r'"\s*:')

MAX_DEPTH = 4
"""Deepest nesting a trace line may have (an object of lists of small objects at most)."""
NATIVE_TIME_FIELD = "arrival_s"
MOONCAKE_TIME_FIELD = "timestamp"
_MOONCAKE_KEYS = ("input_length", "hash_ids", "output_length")
_NATIVE_KEYS = ("arrival_s", "prompt_tokens", "output_tokens", "prompt_token_ids")


def has_keys_of(fmt: str, record: dict) -> bool:
    """Whether ``record`` holds a key only format ``fmt`` (native or mooncake) reads."""
    keys = _NATIVE_KEYS if fmt == "native" else (*_MOONCAKE_KEYS, MOONCAKE_TIME_FIELD)
    return any(key in record for key in keys)


def looks_like_mooncake(record: dict) -> bool:
    """Whether a parsed first line is Mooncake rather than native: it has Mooncake's two
    lengths (and not native's arrival_s without Mooncake's timestamp), or a Mooncake key and
    none of a native line's own (either may carry a key of the other as its own metadata)."""
    if "input_length" in record and "output_length" in record:
        return MOONCAKE_TIME_FIELD in record or NATIVE_TIME_FIELD not in record
    if any(key in record for key in _NATIVE_KEYS):
        return False
    return any(key in record for key in _MOONCAKE_KEYS) or MOONCAKE_TIME_FIELD in record


def parse_object(text: str, loc: str) -> dict:
    """One line as a JSON object, or an error for a truncated / non-JSON / non-object line."""
    try:
        record = json.loads(text)
    except RecursionError:
        raise TraceError(f"JSON nested more than {MAX_DEPTH} levels deep",
                         location=loc) from None
    except json.JSONDecodeError as e:
        stripped = text.rstrip()
        hint = "; truncated line?" if stripped.startswith("{") and not stripped.endswith("}") \
            else ""
        raise TraceError(f"not valid JSON ({e.msg}: column {e.colno}){hint}",
                         location=loc) from None
    except ValueError:      # (Python reads no integer of more than 4,300 digits)
        raise TraceError(f"a number has more than {sys.get_int_max_str_digits():,} digits",
                         location=loc) from None
    if not isinstance(record, dict):
        raise TraceError(f"expected a JSON object per line, got {type(record).__name__}",
                         location=loc)
    if text.count("[") + text.count("{") > MAX_DEPTH:     # (fewer brackets: not that deep)
        _check_depth(record, loc)
    if text.count(":") > len(record) and len(_KEY_END.findall(text)) > len(record):
        _check_unique_keys(text, loc)     # (a key twice, or a nested object's keys)
    return record


def _check_unique_keys(text: str, loc: str) -> None:
    """A key the line's object gives twice: JSON keeps the last, silently. (Objects nested in
    ignored metadata are left alone: the outermost object is the last one built.)"""
    twice = []

    def pairs(items):
        found = dict(items)
        seen: set = set()
        twice.append(None if len(found) == len(items) else
                     next(k for k, _ in items if k in seen or seen.add(k)))
        return found
    json.loads(text, object_pairs_hook=pairs)
    if twice[-1] is not None:
        raise TraceError("key given twice in one object (JSON would keep the last)",
                         location=loc, field=twice[-1])


def _check_depth(record: dict, loc: str) -> None:
    """Trace values are numbers, strings and flat lists: anything nested deeper than
    :data:`MAX_DEPTH` levels is an error (before a deep structure reaches numpy)."""
    level = [record]
    for _ in range(MAX_DEPTH):
        level = [v for item in level
                 for v in (item.values() if isinstance(item, dict) else item)
                 if isinstance(v, (dict, list))]
        if not level:
            return
    raise TraceError(f"JSON nested more than {MAX_DEPTH} levels deep", location=loc)


def mooncake_requests(lines, path) -> Iterator[tuple[int, Request]]:
    """``(line_no, request)`` per Mooncake line; ``arrival_s`` is the absolute timestamp in s."""
    links, name, keys = _links(path), shown(path), UnknownKeys("mooncake")
    for line_no, text in lines:
        loc = f"{name}:{line_no}"
        record = parse_object(text, loc)
        keys.check(record, loc)
        request = mooncake_request(record, loc)
        links.read(record, loc, line_no, request)
        yield line_no, request


def mooncake_request(record: dict, loc: str) -> Request:
    """A validated request from one Mooncake record."""
    t_ms = F.number(F.require(record, "timestamp", loc), "timestamp", loc,
                    limit=F.MAX_SECONDS * 1000)
    prompt = F.length(F.require(record, "input_length", loc), "input_length", loc)
    output = F.length(F.require(record, "output_length", loc), "output_length", loc)
    hashes = F.id_array(F.require(record, "hash_ids", loc), "hash_ids", loc)
    if len(hashes) and hashes.min() < 0:
        raise F.fail(loc, "hash_ids", f"ids must not be negative, found {int(hashes.min())}")
    F.hash_count(hashes, prompt, MOONCAKE_BLOCK, "hash_ids", loc)
    return Request(-1, t_ms / 1000.0, prompt, output, prefix_hashes=hashes,
                   hash_block_size=MOONCAKE_BLOCK)


def native_requests(lines, path) -> Iterator[tuple[int, Request]]:
    """``(line_no, request)`` per native line; ``arrival_s`` as written in the file."""
    links, name, keys = _links(path), shown(path), UnknownKeys("native")
    for line_no, text in lines:
        loc = f"{name}:{line_no}"
        record = parse_object(text, loc)
        keys.check(record, loc)
        request = native_request(record, loc)
        links.read(record, loc, line_no, request)
        yield line_no, request


def _links(path) -> Links:
    """The links of the file at ``path``, counted by a second reading when it names lines."""
    return Links(lambda: count_continuations(numbered_lines(path)))


def native_request(record: dict, loc: str) -> Request:
    """A validated request from one native record."""
    arrival = record.get("arrival_s")
    request = Request(
        -1, 0.0 if arrival is None else F.number(arrival, "arrival_s", loc),
        0, F.length(F.require(record, "output_tokens", loc), "output_tokens", loc))
    _native_prompt(record, loc, request)
    _native_labels(record, loc, request)
    return request


def _native_prompt(record: dict, loc: str, request: Request) -> None:
    ids = record.get("prompt_token_ids")
    if ids is not None:
        if record.get("block_hashes") is not None:
            raise F.fail(loc, "block_hashes", "give prompt_token_ids or block_hashes, not both")
        request.prompt_token_ids = F.token_ids(ids, "prompt_token_ids", loc)
        request.prompt_tokens = len(request.prompt_token_ids)
        stated = record.get("prompt_tokens")
        if stated is not None and F.length(stated, "prompt_tokens", loc) != request.prompt_tokens:
            raise F.fail(loc, "prompt_tokens", f"{stated} disagrees with the "
                         f"{request.prompt_tokens} entries of prompt_token_ids")
        return
    request.prompt_tokens = F.length(F.require(record, "prompt_tokens", loc),
                                     "prompt_tokens", loc)
    _native_hashes(record, loc, request)


def _native_hashes(record: dict, loc: str, request: Request) -> None:
    hashes, size = record.get("block_hashes"), record.get("hash_block_size")
    if hashes is None and size is None:
        return
    if hashes is None:
        raise F.fail(loc, "block_hashes", "missing (hash_block_size is given)")
    if size is None:
        raise F.fail(loc, "hash_block_size", "missing (block_hashes is given)")
    request.hash_block_size = F.length(size, "hash_block_size", loc)
    request.prefix_hashes = F.id_array(hashes, "block_hashes", loc)
    F.hash_count(request.prefix_hashes, request.prompt_tokens, request.hash_block_size,
                 "block_hashes", loc)


def _native_labels(record: dict, loc: str, request: Request) -> None:
    if record.get("priority") is not None:
        request.priority = F.priority(record["priority"], "priority", loc)
    for name in ("session_id", "template_id"):
        if record.get(name) is not None:
            setattr(request, name, F.label(record[name], name, loc))
