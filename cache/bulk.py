"""Element-wise updates of Python lists and dicts by a batch of keys, at C-loop speed where
there is one.

The cache's hot paths update per-block lists (hashes, marks, reference counts) and the prefix
index for a request's hundreds of blocks at a time. Where the install compiled
``cache/_bulk.c`` (as ``cache/_intmap.c``, see :mod:`kvsim.cache.intmap`), list (and
bytearray) updates and a release's reference counts loop in C; the Python loops here do the
same otherwise. On CPython ``map`` over a bound ``__setitem__`` or ``__delitem__`` (a slot
wrapper) is about three times slower than the plain loop, and ``operator.itemgetter``
gathers faster than either.
"""

from __future__ import annotations

from itertools import compress
from operator import itemgetter

from kvsim.cache.intmap import IntMap, PURE_PYTHON

try:
    from kvsim.cache import _bulk
except ImportError:         # (not built)
    _bulk = None
_c = None if PURE_PYTHON else _bulk

#: Fewest blocks of a chain of new hashes that the scored pool registers with these bulk
#: updates rather than block by block (below it the setup costs more than the loop).
MIN_BULK_CHAIN = 16


def compiled_loop(name: str):
    """The compiled loop ``name`` of ``cache/_bulk.c`` (None where it is not built, or the
    Python paths are asked for): for a module whose Python loop stands beside it."""
    return getattr(_c, name, None)


_marked = compiled_loop("marked")           # (None from a build older than the loop too)
_without_marked = compiled_loop("without_marked")


def set_all(values: list, indices, value) -> None:
    """``values[i] = value`` for every ``i`` of ``indices`` (a plain loop: ``map`` over
    ``values.__setitem__``, a slot wrapper, is three times slower)."""
    if _c is not None and _c.set_all(values, indices, value) is None:
        return
    for i in indices:
        values[i] = value


def set_each(values: list, indices, items) -> None:
    """``values[i] = item`` for each pair of ``indices`` and ``items``."""
    if _c is not None and _c.set_each(values, indices, items) is None:
        return
    for i, item in zip(indices, items):
        values[i] = item


def drop_refs(refs: list, hashes: list, block_ids: list) -> tuple[list[int], list[int]]:
    """One reference fewer on each block (``refs[b] -= 1``), in order; those now at 0 as
    ``(with a hash, without)`` (``hashes[b]`` not None or None), each in order."""
    if _c is not None:
        found = _c.drop_refs(refs, hashes, block_ids)
        if found is not NotImplemented:
            return found
    cached, uncached = [], []
    for block_id in block_ids:
        left = refs[block_id] - 1
        refs[block_id] = left
        if not left:
            (cached if hashes[block_id] is not None else uncached).append(block_id)
    return cached, uncached


def gather(values, indices: list[int]) -> tuple:
    """``values[i]`` for each ``i`` of ``indices``, as a tuple: ``operator.itemgetter`` loops
    in C, about three times faster than ``map(values.__getitem__, indices)``."""
    if len(indices) > 1:
        return itemgetter(*indices)(values)
    return (values[indices[0]],) if indices else ()


def marked(marks: bytearray, ids: list[int]) -> list[int]:
    """The ids whose byte in ``marks`` is not 0, in order."""
    if _marked is not None:
        found = _marked(marks, ids)
        if found is not NotImplemented:
            return found
    return list(compress(ids, gather(marks, ids)))


def without_marked(marker, ids: list, values) -> tuple[list, list] | None:
    """``(ids, values)`` of the pairs of ``ids`` and ``values`` whose value is not ``marker``
    (by identity), two lists; None when no value is ``marker``."""
    if _without_marked is not None:
        return _without_marked(marker, ids, values)
    if not any(value is marker for value in values):
        return None
    kept = [value is not marker for value in values]
    return list(compress(ids, kept)), list(compress(values, kept))


def delete_all(mapping, keys) -> None:
    """``del mapping[k]`` for each of ``keys`` (a loop: faster than ``map`` over
    ``__delitem__`` too; a compiled :class:`~kvsim.cache.intmap.IntMap` loops in C)."""
    if mapping.__class__ is IntMap:
        mapping.delete_many(keys)
        return
    for key in keys:
        del mapping[key]
