"""A finished request's private blocks in a scored pool, released and evicted as one run.

A finished request's private blocks (cached as ``UNREACHABLE``: no lookup can reach them) form
one chain, released tail first by one ``free_blocks``: the tail is queued in the heap, every other
block is parked behind its only child (the chain rule), and their entries ascend from the tail
(one release, consecutive clocks). Evicting the tail wakes its parent, which
:meth:`~kvsim.cache.scored_pool.ScoredBlockPool._evict_many` evicts at once while its entry is
below the heap's smallest, and so on up the chain, one block per turn of its longest path.

:class:`PrivateRuns` remembers each such chain as a *run*, and :class:`PrivateRunBlocks` (a base
of the scored pool) releases a run without a per-block pass and takes, in a few list operations,
the blocks of a run that the eviction loop would have taken one by one: the same victims in the
same order, the same state after. Until then a parked block of a run keeps its entry in the run
only, and its links (parent hash, holder, cached children) are not written
(:meth:`PrivateRunBlocks._settle_runs` writes both out for the readers that need every block).
A run is kept only while nothing but that loop can reach its blocks: none is in the index,
and the parked ones get a heap entry only from the pool's compaction and its fallback victim,
which settle and forget every run.
"""

from __future__ import annotations

from bisect import bisect_left
from heapq import heappush

from kvsim.cache.bulk import gather, set_all, set_each
from kvsim.cache.policy_pool import UNREACHABLE


class PrivateRuns:
    """Runs of private blocks by their *front* (the next to go): ``(blocks, entries, start)``,
    the chain tail first, the heap entries the blocks got when released, and the front's
    position."""

    __slots__ = ("_runs", "_chain")

    def __init__(self) -> None:
        self._runs: dict[int, tuple[list[int], list[int], int]] = {}
        self._chain: list[int] | None = None     # the chain just cached, its root first

    def __bool__(self) -> bool:
        return bool(self._runs)

    def values(self):
        return self._runs.values()

    def note_chain(self, block_ids: list[int]) -> None:
        """``block_ids`` (root first) were just cached as one private chain."""
        self._chain = block_ids if len(block_ids) > 1 else None

    @property
    def has_chain(self) -> bool:
        return self._chain is not None

    def take_chain(self) -> list[int] | None:
        """The chain cached last (root first), once: the next release may start with it."""
        chain, self._chain = self._chain, None
        return chain

    def take(self, block_id: int, entry: int) -> tuple[list[int], list[int], int] | None:
        """The run whose front is ``block_id``, just popped from the heap with ``entry`` (None:
        none, or one left from an earlier life of the block)."""
        run = self._runs.pop(block_id, None)
        return run if run is not None and run[1][run[2]] == entry else None

    def keep(self, blocks: list[int], entries: list[int], start: int) -> None:
        """The run goes on from ``blocks[start]``."""
        self._runs[blocks[start]] = (blocks, entries, start)

    def clear(self) -> None:
        self._runs.clear()
        self._chain = None


def num_taken_inline(entries: list[int], start: int, heap_min: int | None, left: int) -> int:
    """How many blocks of a run, from its front at ``start``, the eviction loop takes in one
    turn: the front, then each next block while victims are still wanted (``left`` in all) and
    its entry is below the heap's smallest (``heap_min``, None: the heap is empty)."""
    end = len(entries) if heap_min is None else bisect_left(entries, heap_min, start + 1)
    return min(left, end - start)


class PrivateRunBlocks:
    """Releasing and evicting private runs, for :class:`~kvsim.cache.scored_pool.ScoredBlockPool`
    (whose lists these methods read and write). A run's blocks after the root are not linked
    (parent hash, holder, cached children) while it lasts: only its eviction reads those, and it
    knows them; :meth:`_settle_runs` writes them out with the entries."""

    def _link_rest(self, chain: list[int]) -> None:
        """Link the blocks of a private chain (root first) after its root, as
        :meth:`cache_unreachable` would have at once."""
        if len(chain) > 1:
            self._link_chain(chain[1:], [UNREACHABLE] * (len(chain) - 1), chain[0])

    def _link_pending(self) -> None:
        """A chain cached as unreachable and not released yet (not as the caller should):
        linked now."""
        if self._runs.has_chain:
            self._link_rest(self._runs.take_chain())

    def _split_run(self, block_ids: list[int], chain: list[int]) -> list[int]:
        """Take the run out of ``block_ids`` (a release, in order) when the chain cached last
        (``chain``, root first) is there, tail first, after at most one uncached block, each
        of its blocks held once; they are free from here on. Returns it, tail first ([]: not
        there)."""
        k, run = len(chain), chain[::-1]
        at = 0 if block_ids[:k] == run else 1 if (
            block_ids[1:k + 1] == run and self.block_hashes[block_ids[0]] is None) else -1
        if at < 0 or gather(self.ref_counts, run).count(1) != k:
            return []
        set_all(self.ref_counts, run, 0)
        del block_ids[at:at + k]
        return run

    def _queue_run(self, run: list[int], packed: list[int]) -> None:
        """Queue a run released with entries ``packed``: its tail (a leaf) in the heap, its
        other blocks parked with their entries in the run only; or, when the entries do not
        ascend, linked and queued block by block."""
        if packed != sorted(packed) or self.num_children[run[0]] or self._shared[run[0]]:
            self._link_rest(run[::-1])
            self._queue_released(run, packed)
            return
        self._runs.keep(run, packed, 0)     # (first: a compaction the push makes settles it)
        self._entry[run[0]] = packed[0]
        self._push(run[0])

    def _evict_run(self, run: tuple, left: int, victims: list[int]) -> tuple[int | None, int]:
        """Take the blocks of a run that the loop of :meth:`_evict_many` would take inline from
        its front and queue the next front, as the loop would. The chain's root, linked to its
        shared parent, is left to the loop: returns it (None if it stays) and the victims
        still wanted."""
        blocks, entries, start = run
        heap = self._heap
        last = start + num_taken_inline(entries, start, heap[0] if heap else None, left) - 1
        root = last == len(blocks) - 1
        taken = blocks[start:last] if root else blocks[start:last + 1]
        if taken:
            set_all(self.block_hashes, taken, None)
            victims.extend(taken)
            set_all(self.ref_counts, taken, 1)     # (their hits stay 0: never indexed, never hit)
            if self.priorities_seen:
                set_all(self.prio, taken, self._priority)
        set_all(self.num_children, blocks[start:last + 1], 0)     # (their only child went)
        if root:
            return blocks[last], left - len(taken)
        front = blocks[last + 1]        # its only child gone: a leaf, queued
        self.num_children[front] = 0
        self._runs.keep(blocks, entries, last + 1)
        entry = self._entry[front] = self._live[front] = entries[last + 1]
        heappush(heap, entry)
        return None, left - len(taken)

    def _settle_runs(self, forget: bool = False) -> None:
        """Write out the entries and links of the runs' parked blocks (a reader of every block
        follows); ``forget``: then forget the runs (their parked blocks are about to get heap
        entries)."""
        self._link_pending()
        entries, parents, holders = self._entry, self.parent_hashes, self._parent_holder
        for blocks, run_entries, start in self._runs.values():
            members = blocks[start:]
            set_each(entries, members[1:], run_entries[start + 1:])
            set_all(parents, members[:-1], UNREACHABLE)
            set_each(holders, members[:-1], members[1:])
            set_all(self.num_children, members[1:], 1)
        if forget:
            self._runs.clear()
