"""Maps keyed by block hashes: the compiled :class:`IntMap` where it was built, else ``dict``.

The prefix index, the CPU tier's hash -> host block map and the ghost lists of ARC and S3-FIFO
(:class:`CompiledGhost`, see :mod:`kvsim.cache.ghost`) insert, look up and delete block hashes
by the million on a long trace (and the lane pools' lanes, block ids, by the hundred at a
time). ``pip install`` compiles ``cache/_intmap.c`` (a table of 64-bit keys, see its header)
when a C compiler is there; without one the install goes on and these maps are plain ``dict``
objects: the same results, slower. ``KVSIM_PURE_PYTHON=1`` in the environment uses the dicts
anyway (the tests compare both; ``bench/sim_speed.py`` measures both).

:func:`hash_map` gives a new map, :func:`add_new` fills one with new keys at once,
:func:`count_up` and :func:`count_down` keep it as a multiset (key -> count); code that
takes a faster path with the compiled one checks :data:`COMPILED`. Keys are ints of 64 bits
(as every block hash is). After editing a ``.c`` file, ``pip install -e .`` again rebuilds it
(an editable install does not by itself).
"""

from __future__ import annotations

import os

try:
    from kvsim.cache._intmap import Ghost as CompiledGhost, IntMap
except ImportError:         # (not built: no C compiler at install time)
    IntMap = CompiledGhost = None

#: ``KVSIM_PURE_PYTHON`` is set: every compiled part is left unused.
PURE_PYTHON = bool(os.environ.get("KVSIM_PURE_PYTHON"))
if PURE_PYTHON:
    IntMap = CompiledGhost = None

#: Whether the maps are the compiled ones.
COMPILED = IntMap is not None


def hash_map():
    """A new, empty map of block hashes (see the module docstring)."""
    return IntMap() if COMPILED else {}


def add_new(mapping, keys: list, values) -> bool:
    """Put each pair of ``keys`` and ``values`` into ``mapping`` (a :func:`hash_map`) at once
    when no key is there yet nor given twice (True); else change nothing (False)."""
    if COMPILED:
        return mapping.add_new(keys, values)
    if not mapping.keys().isdisjoint(keys):
        return False
    before = len(mapping)
    mapping.update(zip(keys, values))
    if len(mapping) - before == len(keys):
        return True
    for key in keys:                    # a key twice: undone
        mapping.pop(key, None)
    return False


def count_up(mapping, keys) -> None:
    """``mapping[k] = mapping.get(k, 0) + 1`` for each of ``keys`` (a :func:`hash_map` as a
    multiset)."""
    if COMPILED:
        mapping.count_up(keys)
        return
    get = mapping.get
    for key in keys:
        mapping[key] = get(key, 0) + 1


def count_down(mapping, keys) -> None:
    """``mapping[k] -= 1`` for each of ``keys`` (each counted), the key deleted at 0."""
    if COMPILED:
        mapping.count_down(keys)
        return
    for key in keys:
        left = mapping[key] - 1
        if left:
            mapping[key] = left
        else:
            del mapping[key]
