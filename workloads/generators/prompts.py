"""Prompts as sequences of *segments*, and their prefix identities.

A generated prompt is a list of segments — a system prompt, a document, a user message, an
earlier reply — each a ``(key, length)``: ``key`` names the segment's content, so two prompts
built from the same keys in the same order hold the same tokens. No token list is ever built:
the prefix id of the block ending at token ``e`` is derived from the keys of the segments
before ``e`` and the offset of ``e`` in its segment, which is exactly "same first ``e`` tokens".
"""

from __future__ import annotations

import numpy as np

from kvsim.workloads.identity import ROOT_HASH, mix

Segment = tuple[int, int]
"""``(content_key, length_in_tokens)``."""

TOKEN_BASE = 3
"""Generated token ids start here (0..2 are special tokens in most vocabularies)."""


class Keys:
    """Serial content keys, so every new segment gets content no other segment has."""

    def __init__(self):
        self._next = 1

    def new(self) -> int:
        key, self._next = self._next, self._next + 1
        return key


_MASK = (1 << 64) - 1


def _mix64(a: int, b: int) -> int:
    """splitmix64-style mix of two 64-bit ints in plain Python (fast for scalars)."""
    x = (a * 0x9E3779B97F4A7C15 + b + 0x632BE59BD9B4E019) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    x ^= x >> 31
    return x - (1 << 64) if x >= 1 << 63 else x


def _bases(segments: list[Segment]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per segment: start token, end token, and the id base its offsets mix into. The base
    names every segment before it (key and length) and this segment's key."""
    starts, ends, bases = [], [], []
    before, pos = int(ROOT_HASH), 0
    for key, length in segments:
        base = _mix64(before, key)
        starts.append(pos)
        pos += length
        ends.append(pos)
        bases.append(base)
        before = _mix64(base, length)
    return (np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64),
            np.asarray(bases, dtype=np.int64))


def prefix_ids(segments: list[Segment], block: int, start_block: int = 0) -> np.ndarray:
    """One 64-bit prefix id per ``block`` tokens of the prompt, the last partial block included
    (from block ``start_block`` on).

    The id of the block ending at token ``e`` (``e`` = its end, or the prompt's end for the last
    block) depends only on the content of tokens ``0..e-1``.
    """
    starts, ends, bases = _bases(segments)
    total = int(ends[-1])
    block_ends = np.minimum(np.arange(start_block + 1, -(-total // block) + 1,
                                      dtype=np.int64) * block, total)
    seg = np.searchsorted(ends, block_ends, side="left")
    return mix(bases[seg], block_ends - starts[seg])


def token_ids(segments: list[Segment], vocab_size: int) -> np.ndarray:
    """Concrete token ids for the prompt, ``TOKEN_BASE..vocab_size-1`` (per-token; small use)."""
    parts = []
    for key, length in segments:
        hashed = mix(np.full(length, key, dtype=np.int64), np.arange(length, dtype=np.int64))
        parts.append(hashed.view(np.uint64) % np.uint64(vocab_size - TOKEN_BASE))
    return np.concatenate(parts).astype(np.int64) + TOKEN_BASE


#: Largest name :class:`FirstSeenNames` stores as int32 (past it, its names widen to int64).
MAX_NARROW_NAME = np.iinfo(np.int32).max


class FirstSeenNames:
    """Ids renamed to ``0, 1, 2, ...`` in first-seen order across a stream of id arrays, as
    Mooncake's ``hash_ids`` are, so generated files stay short and readable. Keeps 12 bytes
    per distinct id (a sorted array of ids, their names as int32 while they fit) and a dict
    of the ids seen since the arrays were last merged (at most a sixteenth as many)."""

    def __init__(self) -> None:
        self._ids = np.empty(0, dtype=np.int64)      # sorted
        self._names = np.empty(0, dtype=np.int32)
        self._recent: dict[int, int] = {}
        self.num_names = 0

    def rename(self, ids: np.ndarray) -> np.ndarray:
        """The names of ``ids`` (new ids named in their order here)."""
        out = np.empty(len(ids), dtype=np.int64)
        found = np.zeros(len(ids), dtype=bool)
        if len(self._ids):
            pos = np.minimum(np.searchsorted(self._ids, ids), len(self._ids) - 1)
            found = self._ids[pos] == ids
            out[found] = self._names[pos[found]]
        missing = np.flatnonzero(~found)
        if len(missing):
            out[missing] = [self._name(key) for key in ids[missing].tolist()]
        if len(self._recent) > max(1 << 12, len(self._ids) // 16):
            self._merge()
        return out

    def _name(self, key: int) -> int:
        name = self._recent.setdefault(key, self.num_names)
        if name == self.num_names:
            self.num_names += 1
        return name

    def _merge(self) -> None:
        """Move the recent ids into the sorted arrays."""
        new = np.fromiter(self._recent, np.int64, len(self._recent))
        dtype = np.int64 if self.num_names > MAX_NARROW_NAME else np.int32
        names = np.fromiter(self._recent.values(), dtype, len(self._recent))
        order = np.argsort(new)
        at = np.searchsorted(self._ids, new[order])
        self._ids = np.insert(self._ids, at, new[order])
        self._names = np.insert(self._names.astype(dtype, copy=False), at, names[order])
        self._recent.clear()
