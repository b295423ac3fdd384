"""The records of vLLM's CPU offloading manager (:mod:`kvsim.cache.cpu_offload`): its free
host block ids (:class:`HostBlocks`), an offer sorted out against the hashes held
(:class:`Offer`) and the hashes a request used (:class:`RequestAccess`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress
from typing import Sequence

import numpy as np

NO_IDS = np.zeros(0, dtype=np.int64)


class HostBlocks:
    """Free host block ids as vLLM's manager hands them out: never-used ids first, in order,
    then the most recently freed one."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._next = 0
        self._freed: list[int] = []

    @property
    def num_free(self) -> int:
        return self.num_blocks - self._next + len(self._freed)

    def take(self, n: int) -> list[int]:
        """``n`` (<= ``num_free``) ids, one after the other as vLLM takes them."""
        fresh = min(n, self.num_blocks - self._next)
        ids = list(range(self._next, self._next + fresh))
        self._next += fresh
        if fresh < n:
            reused = self._freed[fresh - n:]
            del self._freed[fresh - n:]
            ids.extend(reversed(reused))
        return ids

    def give_back(self, block_ids: list[int]) -> None:
        self._freed.extend(block_ids)


@dataclass(slots=True)
class RequestAccess:
    """The hashes one request used on the host (vLLM's ``_RequestCacheAccess``): those it
    stored, offered when already held and ready, or loaded, as parts of (hashes, block
    positions, host blocks then, -1 where none) arrays, in the order used;
    ``inserted`` and ``reused`` tell a policy that weighs reuse (ARC) which was which."""

    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    inserted: set[int] = field(default_factory=set)
    reused: set[int] = field(default_factory=set)
    store_misses: set[int] = field(default_factory=set)

    def add(self, hashes: np.ndarray, positions: np.ndarray, ids: np.ndarray) -> None:
        self.parts.append((hashes, positions, ids))

    def head_to_tail(self) -> tuple[np.ndarray, np.ndarray]:
        """The hashes used (each once, as first used) in block order (stable), and the host
        blocks they were in."""
        hashes, positions, ids = (np.concatenate(a) if len(a) > 1 else a[0]
                                  for a in zip(*self.parts))
        if len(positions) < 2 or (positions[1:] > positions[:-1]).all():
            return hashes, ids      # (each position once: each hash once, in block order)
        unique, first = np.unique(hashes, return_index=True)
        if len(unique) < len(hashes):
            first.sort()
            hashes, positions, ids = hashes[first], positions[first], ids[first]
        order = np.argsort(positions, kind="stable")
        return hashes[order], ids[order]


class Offer:
    """One offer to store (:meth:`~kvsim.cache.cpu_offload.LRUOffloadingManager.prepare_store`):
    its hashes (from block position ``first``), those to store (``new``: not held, past the
    reuse gate), and, once sorted out against the held ones (None while none is held), where
    each is held (``ids``, -1 where not), which are ``held`` and ``ready``, the host blocks of
    the held ones; ``stored_at``: the host blocks of ``new`` once stored."""

    __slots__ = ("hashes", "first", "new", "ids", "held", "ready", "held_ids", "stored_at")

    def __init__(self, hashes: Sequence[int], first: int):
        self.hashes, self.first = hashes, first
        self.new = list(hashes)
        self.ids = self.held = self.ready = self.stored_at = None
        self.held_ids = NO_IDS

    def sort_out(self, ids: np.ndarray, ref: np.ndarray) -> None:
        self.held = held = ids >= 0
        self.ids, self.held_ids = ids, ids[held]
        self.ready = held.copy()
        self.ready[held] = ref[self.held_ids] >= 0
        self.new = list(compress(self.hashes, (~held).tolist()))

    def host_ids(self, lookup) -> np.ndarray:
        """Where each hash is now (-1: nowhere), ``lookup(hashes)`` asked only when the
        offer's own answers do not tell (some hashes kept back by the reuse gate)."""
        if self.stored_at is None:
            return self.ids if self.ids is not None else np.full(len(self.hashes), -1,
                                                                 dtype=np.int64)
        if self.ids is None and len(self.new) == len(self.hashes):
            return self.stored_at           # (the usual offer: every hash new, stored)
        if self.ids is not None and self._stores_all_not_held():
            ids = self.ids.copy()
            ids[~self.held] = self.stored_at
            return ids
        return lookup(self.hashes)

    def used(self) -> np.ndarray | None:
        """Which hashes the request uses (None: all): those to store and those held and
        ready, not those another request is still storing."""
        if self.ready is None and len(self.new) == len(self.hashes):
            return None
        if self.ready is not None and self._stores_all_not_held():
            return ~self.held | self.ready
        used = np.isin(np.array(self.hashes, dtype=np.int64), np.array(self.new, dtype=np.int64))
        return used if self.ready is None else used | self.ready

    def _stores_all_not_held(self) -> bool:
        return len(self.new) == len(self.hashes) - len(self.held_ids)
