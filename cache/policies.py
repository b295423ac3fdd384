"""Eviction policies: which free *cached* block a :class:`~kvsim.cache.BlockPool` reuses next.

Every policy keeps vLLM's first rule: free blocks without a hash (nothing cached in them) are
reused first. They differ in the order in which free cached blocks (reference count 0, still
findable by hash) are given up:

- ``lru`` (default): vLLM v1 exactly - the free queue is an LRU list by release time, a released
  request's tail block first. It runs on the plain :class:`BlockPool` code path (an
  ``OrderedDict``), untouched by this module.
- ``lfu``: fewest hits first (prefix hits taken on the block since it was filled), LRU among
  equals.
- ``priority``: a block carries the best (numerically lowest) priority of the requests that
  used it since it was filled; the worst priority is evicted first, LRU within a class.
- ``hybrid``: a GreedyDual-Size-Frequency score, see :class:`HybridPolicy`.
- ``arc``, ``s3fifo``: the classical scan-resistant queue policies (ARC, S3-FIFO), run by a
  :class:`~kvsim.cache.queue_pool.QueuePool`, see :mod:`kvsim.cache.queue_pool`.
- ``lookahead``: online, for multi-turn traffic: protects blocks that queued requests will look
  up and keeps reused chains one cache lifetime longer, see :mod:`kvsim.cache.lookahead`.
- ``belady``: offline optimal, the block whose next use is farthest in the future goes first;
  needs a :class:`BeladyOracle` built from the whole trace, see :class:`BeladyPolicy`.

A non-LRU pool (:class:`~kvsim.cache.scored_pool.ScoredBlockPool`) asks the policy for the key
of each cached block it releases (reference count down to 0; :meth:`CachePolicy.entries`, the
keys of one release packed by :func:`heap_entry`) and evicts the block with the smallest key (a
tuple of ints). Keys are fixed at release: they only matter while a block is free, and a free
block takes no hits. Every key ends with the pool's release clock, so ties go LRU. The pool
keeps the chain property for every policy: only a block no other cached block names as its
parent (or one whose content another block also holds) can be evicted. ``hybrid`` and
``lookahead``, whose keys are a release clock plus a per-class offset, run on FIFO lanes
instead (:class:`~kvsim.cache.lane_pool.LanePool`), with the same victims.
"""

from __future__ import annotations

import math
from operator import add
from typing import Iterable, Sequence

import numpy as np

from kvsim.cache.bulk import gather

POLICY_NAMES = ("lru", "lfu", "priority", "hybrid", "arc", "s3fifo", "lookahead",
                "belady")

INF = math.inf
NEVER = 1 << 62     # a next use beyond any trace position (keys are ints)
#: bits of every key part after the first (release clocks, clocks plus a credit): below 2 ** 48
KEY_PART_BITS = 48


def heap_entry(key: tuple, block_id: int, id_bits: int,
               part_bits: tuple = (KEY_PART_BITS,)) -> int:
    """``key`` (a tuple of ints, part ``i + 1`` in ``[0, 2 ** part_bits[i])``; by default two
    parts) and ``block_id`` packed into one int that orders as the tuple ``(*key, block_id)``."""
    if len(key) != len(part_bits) + 1:
        raise ValueError(f"a key of {len(part_bits) + 1} parts was expected, not {key!r}")
    packed = key[0]
    for part, bits in zip(key[1:], part_bits):
        packed = (packed << bits) + part
    return (packed << id_bits) + block_id


def unpack_key(entry: int, id_bits: int, part_bits: tuple = (KEY_PART_BITS,)) -> tuple:
    """The key packed into ``entry`` by :func:`heap_entry`."""
    packed, parts = entry >> id_bits, []
    for bits in reversed(part_bits):
        parts.append(packed & ((1 << bits) - 1))
        packed >>= bits
    return (packed, *reversed(parts))


class CachePolicy:
    """Base policy. ``key(pool, block_id, block_hash, clock)`` orders free cached blocks
    (smallest evicted first); ``clock`` counts releases, so it is the LRU tie-break.

    ``entries`` is the pool's hot path: the :func:`heap_entry` of the key of every block of one
    release, in one pass. The base class computes it from ``key``; a policy may compute it
    directly (it must equal the definition, which the tests check). ``key_part_bits``: the
    bits of each key part after the first, as :func:`heap_entry` packs them."""

    name = "base"
    is_lru = False
    key_part_bits: tuple = (KEY_PART_BITS,)
    uses_priority = False       # whether keys read the requests' priorities (pool.prio)
    reads_block_hashes = False  # whether keys read the blocks' hashes

    def begin(self, request_id) -> None:
        """The pool is about to take or touch blocks for ``request_id``."""

    def key(self, pool, block_id: int, block_hash: int, clock: int) -> tuple:
        raise NotImplementedError

    def entries(self, pool, block_ids: list[int], clock: int, id_bits: int) -> list[int]:
        """Heap entries of ``block_ids``, released in this order at clocks ``clock, clock+1,
        ...``."""
        key, hashes = self.key, pool.block_hashes
        bits = self.key_part_bits
        return [heap_entry(key(pool, b, hashes[b], c), b, id_bits, bits)
                for c, b in enumerate(block_ids, clock)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LRUPolicy(CachePolicy):
    """vLLM's order. A pool given this policy is the plain :class:`BlockPool`; ``key`` is only
    used when a :class:`ScoredBlockPool` is built with it explicitly (tests)."""

    name = "lru"
    is_lru = True

    def key(self, pool, block_id, block_hash, clock):
        return (clock, 0)


class LFUPolicy(CachePolicy):
    """Fewest prefix hits since the block was filled first; least recently released among
    equals."""

    name = "lfu"

    def key(self, pool, block_id, block_hash, clock):
        return (pool.hits[block_id], clock)

    def entries(self, pool, block_ids, clock, id_bits):
        hits, bits = pool.hits, KEY_PART_BITS
        if len(block_ids) > 1 and not any(gather(hits, block_ids)):    # (most releases: the
            step = 1 << id_bits              # entries are the clocks, shifted, plus the ids)
            return list(map(add, range(clock * step, (clock + len(block_ids)) * step, step),
                            block_ids))
        return [(((hits[b] << bits) + c) << id_bits) + b for c, b in enumerate(block_ids, clock)]


class PriorityPolicy(CachePolicy):
    """Worst priority first (the block's priority is the lowest value among the requests that
    allocated or hit it since it was filled); least recently released within a class."""

    name = "priority"
    pool_class = "lanes"          # :class:`~kvsim.cache.lane_pool.LanePool`: one lane a level
    uses_priority = True
    priority_limit = None         # every level its own class

    @staticmethod
    def lane_credit(num_blocks: int) -> int:
        """No credit for reuse: the lanes are the priority levels."""
        return 0

    @staticmethod
    def priority_weight(num_blocks: int) -> int:
        """A level's offset: more than any release clock, so a level is a class barrier."""
        return 1 << KEY_PART_BITS

    @staticmethod
    def lane_key(clock: int, offset: int) -> tuple:
        """The key of a block released at ``clock`` into the lane at ``offset`` (``-priority``
        levels of ``2**KEY_PART_BITS``)."""
        return (offset >> KEY_PART_BITS, clock)

    def key(self, pool, block_id, block_hash, clock):
        return (-pool.prio[block_id], clock)

    def entries(self, pool, block_ids, clock, id_bits):
        prio, bits = pool.prio, KEY_PART_BITS
        return [(((-prio[b] << bits) + c) << id_bits) + b for c, b in enumerate(block_ids, clock)]


class HybridPolicy(CachePolicy):
    """Recency, reuse and priority in one key, GreedyDual-style (issue 17)::

        key(b) = release clock + N * (R(b) / 2 - priority(b)),  evict the smallest

    - ``R = 1`` for a block of a *reused chain* (a prompt that continued an earlier one past its
      first block, and every block after it; see
      :meth:`~kvsim.cache.lane_pool.LanePool.chain_mark`),
      else 0: frequency, taken per chain rather than per block;
    - ``priority``: each level (lower value = more important, as vLLM) is worth one cache
      lifetime, so high-priority prefixes outlive low-priority ones without an absolute class
      barrier (the ``priority`` policy is that barrier);
    - ``N``: the pool size. The release clock counts released blocks, so ``N`` of it is about
      one *cache lifetime*: reuse keeps a block half a lifetime, one priority level one
      lifetime longer than an unreused block of priority 0 released at the same time, which is
      ordered exactly as LRU. Only chain leaves are evicted (the chain rule, which
      :class:`~kvsim.cache.lane_pool.LanePool` keeps).

    It is GreedyDual-Size-Frequency (Cherkasova 1998) in log scale, with the inflation value
    replaced by the release clock. Earlier forms fell below LRU: GDSF's own ``L + F * C * W``
    with ``C = 1 + depth`` pinned the deep tails of long one-off prompts (only chain leaves can
    be evicted, and those leaves are the deepest blocks: 11 % below LRU on the Mooncake
    conversation trace), a per-block hit count kept a finished chat's early blocks, hit
    once per turn, over the returning turns of others (1-6 % below LRU on the ``chat`` preset),
    and a whole lifetime for reuse gave up newly loaded documents for reused ones on the
    ``long-doc`` preset, where every document is asked about again at random (2.6 % below LRU
    at 16,000 blocks; half a lifetime: 1.1 %).
    """

    name = "hybrid"
    pool_class = "lanes"          # :class:`~kvsim.cache.lane_pool.LanePool`
    uses_priority = True
    priority_limit = 60           # levels beyond +-60 count as +-60

    @staticmethod
    def priority_weight(num_blocks: int) -> int:
        """A priority level's offset: one cache lifetime."""
        return num_blocks

    def __init__(self) -> None:
        self.pool = None

    @staticmethod
    def lane_credit(num_blocks: int) -> int:
        """The offset of a reused block (its lane in a :class:`LanePool`): half a lifetime."""
        return num_blocks // 2

    @staticmethod
    def lane_key(clock: int, offset: int) -> tuple:
        """The key of a block released at ``clock`` into the lane at ``offset``."""
        return (clock + offset, clock)

    def key(self, pool, block_id, block_hash, clock):
        prio = min(max(pool.prio[block_id], -60), 60)
        n = pool.num_blocks
        return (clock + (n // 2) * pool.reused[block_id] - n * prio, clock)


class BeladyPolicy(CachePolicy):
    """Offline optimal (Belady's MIN): evict the block whose content is next *looked up*
    farthest in the future; never again, or next touched only where it cannot be a hit (the last
    block of a block-aligned prompt, re-inserted for free then), goes first; LRU among equals.

    It reads the future from a :class:`BeladyOracle`, so it is an upper bound for the online
    policies, not a policy a server could run. ``now`` is the trace position of the latest
    request that took blocks (the admission frontier). In the cache-only replay
    (:mod:`kvsim.cache.hitrate`) requests are served one by one in order and the bound is exact
    for block hits; in a full simulation requests overlap, wait and are preempted, so "next use"
    is measured from the frontier, a request routed to another replica still counts as a use,
    and the result is a near-optimal reference rather than a proof.
    """

    name = "belady"
    reads_block_hashes = True   # (its key is the hash's next use: every block is registered)

    def __init__(self, oracle: "BeladyOracle"):
        self.oracle = oracle
        self.now = -1
        self._cursor = oracle.start[:-1].copy()

    def begin(self, request_id) -> None:
        position = self.oracle.position(request_id)
        if position > self.now:
            self.now = position

    def key(self, pool, block_id, block_hash, clock):
        next_use = self.oracle.next_use(block_hash, self.now, self._cursor)
        return (-(NEVER if next_use == INF else next_use), clock)


class BeladyOracle:
    """The future of a trace: for every block hash, the trace positions (request indices, in
    arrival order) where a request holds it, and whether that use can be a hit (the block lies
    within the lookup range, i.e. it does not cover the prompt's last token).

    Built from the whole trace up front (``from_hashes`` or ``from_requests``), so a simulation
    with ``belady`` materialises its request list. Memory: one int64 per block occurrence (a few
    more while building) plus a dict over the distinct hashes; a policy adds one cursor per
    distinct hash.
    """

    def __init__(self, ids: np.ndarray, positions: np.ndarray, counted: np.ndarray,
                 num_ids: int, dense: dict | None = None, request_positions: dict | None = None):
        order = np.lexsort((positions, ids))
        self.occ = (positions[order].astype(np.int64) << 1) | counted[order].astype(np.int64)
        self.start = np.searchsorted(ids[order], np.arange(num_ids + 1))
        self._dense = dense
        self._positions = request_positions

    @classmethod
    def from_hashes(cls, per_request: Sequence[np.ndarray], lookup_blocks: Sequence[int],
                    request_ids: Iterable | None = None) -> "BeladyOracle":
        """From each request's block hashes (in trace order) and how many of its leading
        blocks a lookup may cover."""
        lengths = np.array([len(h) for h in per_request], dtype=np.int64)
        flat = np.concatenate(per_request) if len(per_request) else np.zeros(0, np.int64)
        uniq, ids = np.unique(flat, return_inverse=True)
        positions = np.repeat(np.arange(len(per_request)), lengths)
        offsets = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        counted = offsets < np.repeat(np.asarray(lookup_blocks, dtype=np.int64), lengths)
        dense = dict(zip(uniq.tolist(), range(len(uniq))))
        where = ({rid: i for i, rid in enumerate(request_ids)} if request_ids is not None
                 else None)
        return cls(ids.reshape(-1), positions, counted, len(uniq), dense, where)

    @classmethod
    def from_requests(cls, requests: Sequence, block_size: int) -> "BeladyOracle":
        """From :class:`~kvsim.workloads.Request` objects in arrival order (prompt blocks)."""
        hashes = [np.asarray(r.block_hashes(block_size), dtype=np.int64) for r in requests]
        lookups = [max(r.prompt_tokens - 1, 0) // block_size for r in requests]
        return cls.from_hashes(hashes, lookups, [r.request_id for r in requests])

    def position(self, request_id) -> int:
        """Trace position of ``request_id`` (the id itself when built without ids)."""
        if self._positions is None:
            return request_id
        return self._positions.get(request_id, -1)

    def next_use(self, block_hash: int, now: int, cursor: np.ndarray) -> float:
        """Position of the next use after ``now`` that can hit, ``inf`` if none comes before
        the hash is next held without a possible hit. ``cursor`` (one int per hash, owned by
        the caller) only moves forward, so ``now`` must never decrease for one cursor."""
        i = self._dense.get(block_hash) if self._dense is not None else block_hash
        if i is None:
            return INF
        c, end, occ = int(cursor[i]), int(self.start[i + 1]), self.occ
        while c < end and int(occ[c]) >> 1 <= now:
            c += 1
        cursor[i] = c
        if c == end:
            return INF
        value = int(occ[c])
        return value >> 1 if value & 1 else INF


def prepare_eviction(name: str, requests: Iterable, block_size: int):
    """``(requests, oracle)`` for a simulation with eviction policy ``name``: ``belady``
    materialises the request stream into a list and builds its oracle; other policies leave
    the stream as it is (oracle ``None``)."""
    if name != "belady":
        return requests, None
    requests = list(requests)
    return requests, BeladyOracle.from_requests(requests, block_size)
