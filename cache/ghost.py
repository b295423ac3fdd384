"""Ghost lists of the queue policies: hashes of evicted blocks, oldest first, at most so many.

ARC's ``B1``/``B2`` and S3-FIFO's ``G`` are each an ``OrderedDict`` used as a bounded FIFO: a
hash is added at the end (one already present keeps its place), the oldest goes when there
are too many, and a hash whose block comes back is taken out. :class:`Ghost` has exactly that
behaviour at less cost: a ghost is touched for every evicted block, and its hashes are spread
over a large table, so what counts is the number of dictionary operations per hash and the
Python code run per hash. Where ``cache/_intmap.c`` was built, :func:`ghost_list` gives its
``Ghost`` instead (the same behaviour, each batch one C loop: a hash table of positions and a
FIFO of 64-bit hashes, no int objects); :class:`Ghost` here is what runs without it.

An evicted block whose content no lookup can reach (``UNREACHABLE``: a finished request's
private blocks) leaves an *anonymous* entry: it has no hash, so nothing can find it or take
it out, but it takes its place in the FIFO and counts until it is the oldest and goes, as the
block's unique hash would have.
"""

from __future__ import annotations

from itertools import repeat

from kvsim.cache.bulk import delete_all
from kvsim.cache.intmap import COMPILED, CompiledGhost, add_new, hash_map
from kvsim.cache.policy_pool import UNREACHABLE


def ghost_list():
    """A new, empty ghost list: the compiled one where it was built (and knows anonymous
    entries: not a build older than them), else a :class:`Ghost`; ``UNREACHABLE`` given as
    a hash adds an anonymous entry."""
    return CompiledGhost(anonymous=UNREACHABLE) if _COMPILED_ANONYMOUS else Ghost()


def _compiled_knows_anonymous() -> bool:
    try:
        return COMPILED and CompiledGhost(anonymous=UNREACHABLE) is not None
    except TypeError:
        return False


_COMPILED_ANONYMOUS = _compiled_knows_anonymous()


class Ghost:
    """A bounded FIFO of hashes with an ``OrderedDict``'s order, membership and length.

    ``live`` holds the present hashes (the keys of a :func:`~kvsim.cache.intmap.hash_map`,
    their values None); ``fifo`` lists hashes in the order they were added,
    ``fifo[head:]`` still to go. A hash taken out (:meth:`discard`) leaves a *stale* entry in
    ``fifo``; ``stale`` counts them per hash. A hash's stale entries are always older than its
    live one (a FIFO), so when its turn comes an entry is stale exactly while ``stale`` counts
    one for its hash: no position is stored per hash (a set, not a dict of ints). An
    anonymous entry (``UNREACHABLE`` in ``fifo``) is never stale; ``num_anon`` counts them.
    """

    __slots__ = ("live", "fifo", "head", "stale", "num_anon")
    slack = 1024            # stale or gone entries kept in ``fifo`` before it is rebuilt

    def __init__(self) -> None:
        self.live: dict[int, None] = hash_map()
        self.fifo: list[int] = []
        self.head = 0
        self.stale: dict[int, int] = {}
        self.num_anon = 0

    def __len__(self) -> int:
        return len(self.live) + self.num_anon

    def __contains__(self, block_hash) -> bool:
        return block_hash in self.live

    def isdisjoint(self, hashes) -> bool:
        """Whether none of ``hashes`` is present."""
        return self.live.keys().isdisjoint(hashes)

    def first_present(self, hashes: list, start: int) -> int:
        """The first index from ``start`` whose hash is present, or ``len(hashes)``."""
        live = self.live
        for j in range(start, len(hashes)):
            if hashes[j] in live:
                return j
        return len(hashes)

    def take_run(self, hashes: list, start: int, stop: int) -> int:
        """Take out the hashes from ``start`` (before ``stop``) while each is present (one
        given twice is not, the second time); returns where that stopped."""
        live = self.live
        for j in range(start, min(stop, len(hashes))):
            if hashes[j] not in live:
                return j
            self.discard(hashes[j])
        return max(start, min(stop, len(hashes)))

    def __iter__(self):
        pending = dict(self.stale)
        for block_hash in self.fifo[self.head:]:
            if block_hash is UNREACHABLE:
                yield block_hash
            elif pending.get(block_hash):
                pending[block_hash] -= 1
            else:
                yield block_hash

    def discard(self, block_hash) -> None:
        """Take a present hash out (its block came back)."""
        del self.live[block_hash]
        self.stale[block_hash] = self.stale.get(block_hash, 0) + 1
        if len(self.fifo) - self.head > 2 * len(self) + self.slack:
            self._rebuild()

    def add(self, hashes, capacity: int) -> None:
        """As, for each of ``hashes`` in turn, ``ghost[h] = None`` then, with more than
        ``capacity`` present, ``ghost.popitem(last=False)``.

        In bulk when the hashes are all absent and distinct: each then adds one at the end
        and drops the oldest if that makes more than ``capacity`` (all of them do once the
        ghost is at or over it), and what goes is the oldest present hashes followed by the
        new ones, whenever the drops happen. One at a time otherwise."""
        hashes = list(hashes)
        if UNREACHABLE not in hashes and self._add_new(hashes):
            self.fifo += hashes
            self._drop(min(len(hashes), max(0, len(self) - capacity)))
            return
        for block_hash in hashes:
            self._add_one(block_hash, capacity)

    # --- internals -----------------------------------------------------------------------

    def _add_new(self, hashes: list) -> bool:
        """Make all of ``hashes`` present at once when none is yet and none comes twice
        (True); else change nothing (False)."""
        return add_new(self.live, hashes, repeat(None, len(hashes)))

    def _add_one(self, block_hash, capacity: int) -> None:
        if block_hash is UNREACHABLE:
            self.fifo.append(block_hash)
            self.num_anon += 1
        elif block_hash not in self.live:
            self.live[block_hash] = None
            self.fifo.append(block_hash)
        if len(self.live) + self.num_anon > capacity:
            self._drop_one()

    def _drop(self, n: int) -> None:
        """Drop the ``n`` oldest present hashes: in one step when none of the ``n`` oldest
        entries can be stale (the usual case), else one at a time."""
        if not n:
            return
        fifo, head = self.fifo, self.head
        olds = fifo[head:head + n]
        if len(olds) == n and (not self.stale or self.stale.keys().isdisjoint(olds)) and (
                not self.num_anon or UNREACHABLE not in olds):
            delete_all(self.live, olds)             # each the live entry of its hash
            self.head = head + n
            if self.head > self.slack and 2 * self.head > len(fifo):
                del fifo[:self.head]                       # the gone entries
                self.head = 0
            return
        for _ in range(n):
            self._drop_one()

    def _drop_one(self) -> None:
        """Drop the oldest present hash (stale entries before it go too)."""
        fifo, stale = self.fifo, self.stale
        while True:
            old = fifo[self.head]
            self.head += 1
            if old is UNREACHABLE:
                self.num_anon -= 1
                return
            count = stale.get(old)
            if not count:
                del self.live[old]
                return
            if count == 1:
                del stale[old]
            else:
                stale[old] = count - 1

    def _rebuild(self) -> None:
        """``fifo`` without its gone and stale entries."""
        self.fifo, self.head, self.stale = list(self), 0, {}
