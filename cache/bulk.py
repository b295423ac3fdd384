"""Element-wise updates of Python lists and dicts by a batch of keys, at C-loop speed where
there is one.

The cache's hot paths update per-block lists (hashes, marks, reference counts) and the prefix
index for a request's hundreds of blocks at a time. On CPython ``map`` over a bound
``__setitem__`` or ``__delitem__`` (a slot wrapper) is about three times slower than the plain
loop, and ``operator.itemgetter`` gathers faster than either.
"""

from __future__ import annotations

from operator import itemgetter

from kvsim.cache.intmap import IntMap

#: Fewest blocks of a chain of new hashes that the scored pool registers with these bulk
#: updates rather than block by block (below it the setup costs more than the loop).
MIN_BULK_CHAIN = 16


def set_all(values: list, indices, value) -> None:
    """``values[i] = value`` for every ``i`` of ``indices`` (a plain loop: ``map`` over
    ``values.__setitem__``, a slot wrapper, is three times slower)."""
    for i in indices:
        values[i] = value


def set_each(values: list, indices, items) -> None:
    """``values[i] = item`` for each pair of ``indices`` and ``items``."""
    for i, item in zip(indices, items):
        values[i] = item


def gather(values, indices: list[int]) -> tuple:
    """``values[i]`` for each ``i`` of ``indices``, as a tuple: ``operator.itemgetter`` loops
    in C, about three times faster than ``map(values.__getitem__, indices)``."""
    if len(indices) > 1:
        return itemgetter(*indices)(values)
    return (values[indices[0]],) if indices else ()


def delete_all(mapping, keys) -> None:
    """``del mapping[k]`` for each of ``keys`` (a loop: faster than ``map`` over
    ``__delitem__`` too; a compiled :class:`~kvsim.cache.intmap.IntMap` loops in C)."""
    if mapping.__class__ is IntMap:
        mapping.delete_many(keys)
        return
    for key in keys:
        del mapping[key]
