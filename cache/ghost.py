"""Ghost lists of the queue policies: hashes of evicted blocks, oldest first, at most so many.

ARC's ``B1``/``B2`` and S3-FIFO's ``G`` are each an ``OrderedDict`` used as a bounded FIFO: a
hash is added at the end (one already present keeps its place), the oldest goes when there
are too many, and a hash whose block comes back is taken out. :class:`Ghost` has exactly that
behaviour at less cost: a ghost is touched for every evicted block, and its hashes are spread
over a large table, so what counts is the number of dictionary operations per hash and the
Python code run per hash.
"""

from __future__ import annotations

from itertools import count, repeat
from operator import eq


class Ghost:
    """A bounded FIFO of hashes with an ``OrderedDict``'s order, membership and length.

    ``fifo`` lists the hashes in the order they were added, ``fifo[head:]`` still to go;
    ``live`` maps each present hash to its position (``base`` + index in ``fifo``). A hash
    taken out (:meth:`discard`) leaves a stale entry in ``fifo``, skipped when its turn to go
    comes (an entry is live while ``live`` gives its position).
    """

    __slots__ = ("live", "fifo", "head", "base")
    slack = 1024            # stale or gone entries kept in ``fifo`` before it is rebuilt

    def __init__(self) -> None:
        self.live: dict[int, int] = {}
        self.fifo: list[int] = []
        self.head = self.base = 0

    def __len__(self) -> int:
        return len(self.live)

    def __contains__(self, block_hash) -> bool:
        return block_hash in self.live

    def __iter__(self):
        live, head = self.live, self.head
        return (h for at, h in zip(count(self.base + head), self.fifo[head:]) if live.get(h) == at)

    def discard(self, block_hash) -> None:
        """Take a present hash out (its block came back)."""
        del self.live[block_hash]
        if len(self.fifo) - self.head > 2 * len(self.live) + self.slack:
            self._rebuild()

    def add(self, hashes, capacity: int) -> None:
        """As, for each of ``hashes`` in turn, ``ghost[h] = None`` then, with more than
        ``capacity`` present, ``ghost.popitem(last=False)``.

        In bulk when the hashes are all absent and distinct: each then adds one at the end
        and drops the oldest if that makes more than ``capacity`` (all of them do once the
        ghost is at or over it), and what goes is the oldest present hashes followed by the
        new ones, whenever the drops happen. One at a time otherwise."""
        hashes = list(hashes)
        live, before = self.live, len(self.live)
        if live.keys().isdisjoint(hashes):
            pushed = self.base + len(self.fifo)
            live.update(zip(hashes, count(pushed)))
            if len(live) - before == len(hashes):
                self.fifo += hashes
                self._drop(min(len(hashes), max(0, before + len(hashes) - capacity)))
                return
            for block_hash in hashes:        # a hash twice: undone, then one at a time
                live.pop(block_hash, None)
        for block_hash in hashes:
            self._add_one(block_hash, capacity)

    # --- internals -----------------------------------------------------------------------

    def _add_one(self, block_hash, capacity: int) -> None:
        live = self.live
        if block_hash not in live:
            live[block_hash] = self.base + len(self.fifo)
            self.fifo.append(block_hash)
        if len(live) > capacity:
            self._drop_one()

    def _drop(self, n: int) -> None:
        """Drop the ``n`` oldest present hashes: in one step when none of the ``n`` oldest
        entries is stale (the usual case), else one at a time."""
        if not n:
            return
        live, fifo, head = self.live, self.fifo, self.head
        olds = fifo[head:head + n]
        found = list(map(live.pop, olds, repeat(None)))
        if len(olds) == n and all(map(eq, found, count(self.base + head))):
            self.head = head + n
            if self.head > self.slack and 2 * self.head > len(fifo):
                del fifo[:self.head]                       # the gone entries
                self.base += self.head
                self.head = 0
            return
        for block_hash, position in zip(olds, found):      # undone (a stale entry among them)
            if position is not None:
                live[block_hash] = position
        for _ in range(n):
            self._drop_one()

    def _drop_one(self) -> None:
        """Drop the oldest present hash (stale entries before it go too)."""
        live, fifo = self.live, self.fifo
        while True:
            old, at = fifo[self.head], self.base + self.head
            self.head += 1
            found = live.pop(old, None)
            if found == at:
                return
            if found is not None:                          # stale: the hash is live later
                live[old] = found

    def _rebuild(self) -> None:
        """``fifo`` without its gone and stale entries."""
        kept = list(self)
        self.base += self.head
        self.fifo, self.head = kept, 0
        self.live = dict(zip(kept, count(self.base)))
