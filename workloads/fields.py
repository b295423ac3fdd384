"""Checks of single trace fields. Each returns the clean value or raises a one-line
:class:`~kvsim.errors.TraceError` naming the file and line (``loc``) and the field."""

from __future__ import annotations

import math

import numpy as np

from kvsim.errors import TraceError

MAX_TOKENS = 10_000_000
"""Lengths above this are taken for corrupt data (no model has a 10M-token context)."""

MAX_SECONDS = 1e11
"""Timestamps beyond this (~3,000 years, or epoch milliseconds misread as seconds twice over)
are taken for corrupt data."""
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
"""Priorities are 32-bit integers, lower first, as vLLM's."""

MISSING = object()


def fail(loc: str, field: str | None, message: str) -> TraceError:
    """The error to raise for ``field`` at ``loc``."""
    return TraceError(message, location=loc, field=field)


def require(record: dict, name: str, loc: str):
    """``record[name]``, or an error saying the field is missing."""
    value = record.get(name, MISSING)
    if value is MISSING or value is None:
        raise fail(loc, name, "missing required field")
    return value


def integer(value, name: str, loc: str, text: bool = False) -> int:
    """An int; with ``text`` (CSV) also its decimal text. Bools and fractions are rejected."""
    if text and isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise fail(loc, name, f"expected an integer, got {value.strip()!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(loc, name, f"expected an integer, got {_show(value)}")
    return value


def length(value, name: str, loc: str, text: bool = False) -> int:
    """A token count in ``1..MAX_TOKENS`` (``text``: as for :func:`integer`)."""
    n = integer(value, name, loc, text)
    if n <= 0:
        raise fail(loc, name, f"must be a positive number of tokens, got {n}")
    if n > MAX_TOKENS:
        raise fail(loc, name, f"{n} tokens is absurd (more than {MAX_TOKENS:,})")
    return n


def number(value, name: str, loc: str, text: bool = False, limit: float = MAX_SECONDS) -> float:
    """A finite, non-negative number; with ``text`` (CSV) also its decimal text."""
    if text and isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise fail(loc, name, f"expected a number, got {value.strip()!r}") from None
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(loc, name, f"expected a number, got {_show(value)}")
    if isinstance(value, int) and abs(value) > 1e300:      # (a float cannot hold it)
        digits = f"a {int(abs(value).bit_length() * 0.30103) + 1}-digit number"  # (about)
        raise fail(loc, name, f"must not be negative, got minus {digits}" if value < 0 else
                   f"{digits} is absurd as a time (more than {limit:g})")
    if not math.isfinite(value):
        raise fail(loc, name, f"must be a finite number, got {value}")
    if value < 0:
        raise fail(loc, name, f"must not be negative, got {value}")
    if value > limit:
        raise fail(loc, name, f"{value:g} is absurd as a time (more than {limit:g})")
    return float(value)


def priority(value, name: str, loc: str) -> int:
    """A priority: an integer in :data:`PRIORITY_RANGE`."""
    p = integer(value, name, loc)
    low, high = PRIORITY_RANGE
    if not low <= p <= high:
        raise fail(loc, name, f"must be a 32-bit integer ({low}..{high}), got {_show(p)}")
    return p


def label(value, name: str, loc: str) -> str:
    """A session or template id: a string, or an integer taken as its decimal text."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise fail(loc, name, f"expected a string or an integer, got {_show(value)}")


def id_array(value, name: str, loc: str) -> np.ndarray:
    """A JSON list of 64-bit integers as ``numpy.int64`` (unsigned ids wrap into int64)."""
    if not isinstance(value, list):
        raise fail(loc, name, f"expected a list of integers, got {_show(value)}")
    if not value:
        return np.empty(0, dtype=np.int64)
    try:
        arr = np.asarray(value)
    except (OverflowError, ValueError):
        arr = np.asarray([None])
    if arr.ndim != 1:
        raise fail(loc, name, "expected a flat list of integers, found a nested list")
    if arr.dtype.kind in "iu" and bool in set(map(type, value)):   # (numpy takes true as 1)
        raise fail(loc, name, "expected a list of 64-bit integers, found a boolean")
    if arr.dtype.kind == "i":
        return arr.astype(np.int64, copy=False)
    if arr.dtype.kind == "u":
        return arr.astype(np.uint64).view(np.int64)
    bad = next((v for v in value if isinstance(v, bool) or not isinstance(v, int)
                or not -2**63 <= v < 2**64), value[0])
    if isinstance(bad, list):
        raise fail(loc, name, "expected a flat list of integers, found a nested list")
    if isinstance(bad, int) and not isinstance(bad, bool) and not -2**63 <= bad < 2**64:
        raise fail(loc, name, f"expected a list of 64-bit integers, found {bad} (beyond 64 bits)")
    if isinstance(bad, int) and not isinstance(bad, bool):     # (each fits, not together)
        raise fail(loc, name, "expected 64-bit integers of one kind: it mixes negative ids with "
                              "ids of 2**63 or more")
    raise fail(loc, name, f"expected a list of 64-bit integers, found {_show(bad)}")


def token_ids(value, name: str, loc: str) -> np.ndarray:
    """A non-empty list of non-negative token ids."""
    ids = id_array(value, name, loc)
    if len(ids) == 0:
        raise fail(loc, name, "must hold at least one token id")
    if len(ids) > MAX_TOKENS:
        raise fail(loc, name, f"{len(ids)} tokens is absurd (more than {MAX_TOKENS:,})")
    if ids.min() < 0:
        raise fail(loc, name, f"token ids must not be negative, found {int(ids.min())}")
    return ids


def hash_count(hashes: np.ndarray, prompt_tokens: int, block: int, name: str, loc: str) -> None:
    """Prefix hashes must name every ``block``-token block of the prompt, the last partial one
    included: exactly ``ceil(prompt_tokens / block)`` of them."""
    expected = -(-prompt_tokens // block)
    if len(hashes) != expected:
        raise fail(loc, name, f"{len(hashes)} ids for {prompt_tokens} prompt tokens; "
                              f"expected ceil({prompt_tokens}/{block}) = {expected}")


def preview(text: str, width: int = 40) -> str:
    """``text`` quoted, cut to ``width`` characters (a line quoted in an error message)."""
    return repr(text if len(text) <= width else text[:width - 3] + "...")


def _show(value) -> str:
    if value is None:
        return "null"
    kind = {bool: "a boolean", str: "a string", list: "a list", dict: "an object",
            float: "a decimal number"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} ({text if len(text) <= 30 else text[:27] + '...'})"
