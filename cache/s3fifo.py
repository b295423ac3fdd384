"""S3-FIFO as a :class:`~kvsim.cache.queue_pool.QueuePolicy`: a small probation FIFO, a main
FIFO with CLOCK-like second chances and a ghost FIFO, driven one batch of blocks at a time.

Both queues only ever lose blocks at their head (promotion, eviction, a CLOCK pass) and gain
them at their tail, which allows cheaper structures than an ``OrderedDict`` with the same
order:

- ``S`` is ``_small[_small_head:]``, a list and its head;
- ``M`` is a ``deque`` of *runs*, lists of blocks that sit together in the queue (those
  promoted or filled in one batch), each with its live part (``ids[off:]``) and its number of
  free blocks (kept by ``release_many``/``acquire_many`` through ``_run_of``). The CLOCK hand
  is at the head run. Passing a block moves it to the tail; moving a whole run is the same,
  so a run whose blocks are all held (most of ``M``: the requests hitting them are running)
  is passed in O(1); in other runs the hand jumps from free block to free block (a scan in C:
  ``cache/_bulk.c``'s where the install compiled it, else ``operator.indexOf`` over the
  reference counts), and the blocks passed before a victim go to the tail as a run of their
  own.

The result is the victims, queue orders and counts of the textbook one-block-at-a-time form
(``tests/queue_reference.py``), with Python code run per free block met, not per block passed.
"""

from __future__ import annotations

from collections import deque
from itertools import chain, compress, count, groupby, takewhile
from operator import attrgetter, countOf, indexOf, itemgetter, not_, or_

from kvsim.cache.bulk import compiled_loop, gather, marked, set_all
from kvsim.cache.ghost import ghost_list
from kvsim.cache.queue_pool import QueuePolicy

_first_passing = compiled_loop("first_passing")
_free_of = attrgetter("free")
_num_passing = compiled_loop("num_passing")


class _Run:
    """Blocks next to each other in ``M``: ``ids[off:]``, ``free`` of them free."""

    __slots__ = ("ids", "off", "free")

    def __init__(self, ids: list[int], free: int):
        self.ids, self.off, self.free = ids, 0, free


class S3FIFOPolicy(QueuePolicy):
    """S3-FIFO (Yang et al., SOSP'23): a small FIFO ``S`` (10 % of the pool) for probation, a
    main FIFO ``M`` and a ghost FIFO ``G`` of hashes evicted from ``S``.

    - a filled block enters ``M`` when its hash is in ``G`` (it came back soon), else ``S``;
    - every hit raises the block's frequency, capped at 3;
    - eviction, while ``S`` holds at least its share: ``S``'s oldest block moves to ``M`` if it
      was hit since it entered (``freq >= 1``) or a request still holds it (in use is in use:
      re-queueing it in ``S`` would make every eviction rescan the held blocks), else it is
      evicted and its hash goes to ``G``;
      otherwise ``M``'s oldest block is evicted if its frequency is 0, else it is re-queued with
      the frequency lowered by one (CLOCK-like second chances);
    - queues keep held blocks too (fill order is the FIFO order); a held block met at ``M``'s
      eviction end is re-queued without a change (it cannot go yet).

    Scan resistance: a burst of one-off prompts passes through ``S`` only, so it cannot push
    the reused blocks in ``M`` out.
    """

    name = "s3fifo"
    max_freq = 3
    small_share = 0.1
    takes_late_fills = True
    orders_fills = True
    hears_private_fills = True

    def attach(self, pool) -> None:
        super().attach(pool)
        self.capacity = pool.num_blocks
        self.small_capacity = max(1, int(self.small_share * pool.num_blocks))
        self.reset()

    def reset(self) -> None:
        self._small: list[int] = []          # S is _small[_small_head:], oldest first
        self._small_head = 0
        self._runs: deque[_Run] = deque()    # M, from the hand
        self._run_of: list[_Run | None] = [None] * self.capacity
        self._main_len = 0
        self.ghost = ghost_list()
        self.freq = bytearray(self.capacity)          # bytes, not lists: a smaller footprint
        self.in_main = bytearray(self.capacity)       # in the CPU caches (1 or 0)
        self.num_main_free = 0          # free blocks in M: none -> skip its scan (O(1))

    # --- the queues, oldest first ------------------------------------------------------

    @property
    def small(self) -> list[int]:
        return self._small[self._small_head:]

    @property
    def main(self) -> list[int]:
        return list(chain.from_iterable(run.ids[run.off:] for run in self._runs))

    def order(self):
        refs = self.pool.ref_counts
        return [b for b in (*self.small, *self.main) if refs[b] == 0]

    # --- hooks ---------------------------------------------------------------------------

    def fill_many(self, block_ids, block_hashes):
        freq, in_main, ghost = self.freq, self.in_main, self.ghost
        set_all(freq, block_ids, 0)
        if ghost.isdisjoint(block_hashes):   # none came back: all into S
            set_all(in_main, block_ids, 0)
            self._small += block_ids
            return
        into_main = []
        for block_id, block_hash in zip(block_ids, block_hashes):
            back = block_hash in ghost
            if back:
                ghost.discard(block_hash)
            self.in_main[block_id] = back
            (into_main if back else self._small).append(block_id)
        self._append_main(into_main, 0)          # filled blocks are held

    def fill_private(self, block_ids):
        set_all(self.freq, block_ids, 0)
        set_all(self.in_main, block_ids, 0)
        self._small += block_ids

    def hit_many(self, block_ids):
        freq, top = self.freq, self.max_freq
        for block_id in block_ids:
            if freq[block_id] < top:
                freq[block_id] += 1

    def release_many(self, block_ids):
        """Queue order is fill order: nothing moves; the runs count their free blocks."""
        self.num_main_free += self._count_free(block_ids, 1)

    def acquire_many(self, block_ids):
        """Held blocks stay queued (skipped by eviction)."""
        self.num_main_free -= self._count_free(block_ids, -1)

    def _count_free(self, block_ids: list[int], step: int) -> int:
        """Add ``step`` to the free count of the run of each of ``block_ids`` in ``M`` (a
        request's blocks sit mostly in a few runs: one Python step per group); how many."""
        in_main = marked(self.in_main, block_ids)
        for run, group in groupby(gather(self._run_of, in_main)):
            run.free += step * countOf(group, run)
        return len(in_main)

    def takes_new_fills(self, block_hashes: list, num_new_blocks: int,
                        num_private: int = 0) -> bool:
        """Fills reported late (:meth:`order_fills` puts them in ``S`` in the order they came)
        change no victim while no ghost holds their hashes and either ``S`` stays under its
        share with all of them in it and ``M`` gives every victim (then no victim comes from
        ``S``), or ``S`` gives every victim, at its share or over before each without them
        (:meth:`_small_gives`: then it is with them too, and its scan never reaches them)."""
        num_fills = len(block_hashes) + num_private
        return ((len(self._small) - self._small_head + num_fills < self.small_capacity
                 and self._main_len > num_new_blocks <= self.num_main_free)
                or self._small_gives(num_new_blocks)) and self.ghost.isdisjoint(block_hashes)

    def _small_gives(self, n: int) -> bool:
        """Whether the next ``n`` victims all come from ``S`` while it holds its share before
        each (its oldest free block of frequency 0 goes, the blocks before it move to
        ``M``), nothing joining it meanwhile."""
        small, at, refs, freq = self._small, self._small_head, self.pool.ref_counts, self.freq
        for _ in range(n):
            if len(small) - at < self.small_capacity:
                return False
            at = first_evictable(refs, freq, small, at) + 1
            if at > len(small):
                return False
        return True

    def order_fills(self, block_ids: list[int]) -> None:
        """The last blocks to join ``S`` are ``block_ids``, filled in this order."""
        small, k = self._small, len(block_ids)
        if set(small[len(small) - k:]) != set(block_ids):
            raise ValueError("the blocks to order are not the last ones to join S")
        small[len(small) - k:] = block_ids

    # --- eviction ------------------------------------------------------------------------

    def victims(self, n, fills_before=None):
        """Per victim: ``S`` first while it holds its share (or ``M`` is empty); a queue whose
        free blocks were all promoted or held hands over to the other. Victims come in runs
        from one queue: from ``S`` while that rule holds after each, from ``M`` while ``S``
        is under its share (it does not change then): the next ``min(n, num_main_free)``.
        ``fills_before`` changes nothing here (:meth:`takes_new_fills`)."""
        out = []
        while len(out) < n:
            if self._small_first():
                got = self._from_small(n - len(out))
                if got:
                    out += got
                    continue
            if self.num_main_free:
                out += self._from_main(min(n - len(out), self.num_main_free))
                continue
            got = self._from_small(n - len(out), main_full=True)
            if got:
                out += got
            elif not self.num_main_free:
                raise ValueError(f"no free cached block left to evict ({len(out)} of {n})")
        return out

    def _small_first(self) -> bool:
        return (len(self._small) - self._small_head >= self.small_capacity
                or not self._main_len)

    def _from_small(self, n: int, main_full: bool = False) -> list[int]:
        """Scan ``S`` from its oldest block: a free block of frequency 0 goes (its hash to
        ``G``), the blocks before it move to ``M``; again while ``S`` comes first and fewer
        than ``n`` went, or, ``main_full`` (``M`` has no free block, ``S`` not first), while
        ``M`` still has none. Empty if every block moved (``S`` is empty then)."""
        small, head, refs, freq = self._small, self._small_head, self.pool.ref_counts, self.freq
        out = []
        while True:
            end = first_evictable(refs, freq, small, head)
            if end > head:
                self._promote(small[head:end])
            if end == len(small):
                self._small, self._small_head = [], 0
                break
            head = end + 1 + self._evictable_after(small, end + 1, n - len(out) - 1, main_full)
            out += small[end:head]
            self._small_head = head
            if len(out) == n or (self.num_main_free if main_full else not self._small_first()):
                if head > 1024 and 2 * head > len(small):
                    del small[:head]
                    self._small_head = 0
                break
        self.ghost.add(gather(self.pool.block_hashes, out),
                       self.capacity - self.small_capacity)
        return out

    def _evictable_after(self, small: list[int], start: int, most: int, main_full: bool) -> int:
        """How many of ``S``'s blocks from ``start`` go right after a victim, ``most`` at most:
        those free and of frequency 0, while ``S`` keeps its share (or ``M`` stays empty), or,
        ``main_full``, while no promotion gives ``M`` a free block (there is none between)."""
        if main_full:
            if self.num_main_free:
                return 0
        elif self._main_len:
            most = min(most, len(small) - start + 1 - self.small_capacity)
        return evictable(self.pool.ref_counts, self.freq, small, start, most) if most > 0 else 0

    def _promote(self, block_ids: list[int]) -> None:
        set_all(self.in_main, block_ids, True)
        self._append_main(block_ids, gather(self.pool.ref_counts, block_ids).count(0))

    def _append_main(self, block_ids: list[int], free: int) -> None:
        """``block_ids`` (``free`` of them free) join ``M``'s tail."""
        if block_ids:
            self._runs.append(self._new_run(block_ids, free))
            self._main_len += len(block_ids)
            self.num_main_free += free

    def _new_run(self, block_ids: list[int], free: int) -> _Run:
        run = _Run(block_ids, free)
        set_all(self._run_of, block_ids, run)
        return run

    def _from_main(self, k: int) -> list[int]:
        """CLOCK over ``M``: the next ``k`` free blocks of frequency 0 the hand meets (``k`` at
        most ``num_main_free``: every free block reaches 0 within four laps). A run without
        a free block is passed whole."""
        runs, out = self._runs, []
        while len(out) < k:
            run = runs[0]
            if not run.free:        # the hand passes the runs all held at once
                runs.rotate(-next(compress(count(), map(_free_of, runs))))
                run = runs[0]
            self._visit(run, k - len(out), out)
        self._main_len -= k
        self.num_main_free -= k
        return out

    def _visit(self, run: _Run, need: int, out: list[int]) -> None:
        """The hand goes through the head run until ``need`` more victims are in ``out`` or
        it leaves the run: it jumps from free block to free block (:func:`next_free`; no
        step here changes a reference count) and takes a stretch of free blocks of
        frequency 0 at once; a free block of frequency > 0 loses one and stays. The blocks
        passed before a victim go to the tail as a run of their own, or, when fewer blocks
        follow the victims, the run keeps them and goes to the tail while those that follow
        become the head run (fewer blocks change runs); a run passed to its end goes whole.
        Longer than most functions: one loop keeps the hot path's locals."""
        refs, freq = self.pool.ref_counts, self.freq
        ids, start = run.ids, run.off
        scan, kept = start, 0
        while need and run.free > kept:      # free blocks ahead of the hand in this run
            i = next_free(refs, ids, scan)
            block_id = ids[i]
            if freq[block_id]:
                freq[block_id] -= 1
                kept += 1
                scan = i + 1
                continue
            end = i + 1
            if need > 1:
                end += evictable(refs, freq, ids, end, need - 1)
            out += ids[i:end]
            need -= end - i
            if i > start:                    # blocks passed before the victims
                if i - start > len(ids) - end:
                    self._cut(run, start, i, end, kept)
                    return
                run.free -= kept
                self._runs.append(self._new_run(ids[start:i], kept))
                kept = 0
            run.free -= end - i
            start = scan = end
        run.off = start
        if start == len(ids):
            self._runs.popleft()
        elif need:                           # no free block left in it: passed to its end
            self._runs.rotate(-1)

    def _cut(self, run: _Run, start: int, i: int, end: int, kept: int) -> None:
        """``run`` (the head) lost ``ids[i:end]`` after passing ``ids[start:i]``, ``kept`` of
        them free: it keeps those and goes to the tail; ``ids[end:]`` become the head run."""
        runs, ids = self._runs, run.ids
        rest, rest_free = ids[end:], run.free - kept - (end - i)
        del ids[i:]
        run.off, run.free = start, kept
        runs.popleft()
        if rest:
            runs.appendleft(self._new_run(rest, rest_free))
        runs.append(run)


def next_free(refs: list[int], ids: list[int], start: int) -> int:
    """The index of the first free block in ``ids[start:]`` (there is one): a compiled scan,
    or ``indexOf`` over the reference counts."""
    if _first_passing is not None:
        found = _first_passing(refs, None, ids, start)
        if found is not NotImplemented:
            return found
    return start + indexOf(map(refs.__getitem__, tail(ids, start)), 0)


def first_evictable(refs: list[int], freq: bytearray, ids: list[int], start: int) -> int:
    """The index of the first free block of frequency 0 in ``ids[start:]`` (``len(ids)`` if
    none): a compiled scan, or one in windows that double (``gather`` and ``indexOf``)."""
    if _first_passing is not None:
        found = _first_passing(refs, freq, ids, start)
        if found is not NotImplemented:
            return found
    window = 32
    while start < len(ids):
        part = ids[start:start + window]
        try:        # refs | freq is 0 only for a free block never hit
            return start + indexOf(map(or_, gather(refs, part), gather(freq, part)), 0)
        except ValueError:
            start += len(part)
            window *= 2
    return len(ids)


def evictable(refs: list[int], freq: bytearray, ids: list[int], start: int, most: int) -> int:
    """How many blocks from ``ids[start]`` on, ``most`` at most, are in a row free and of
    frequency 0 (a compiled scan, or ``refs | freq``, 0 only for those, over a window)."""
    if _num_passing is not None:
        found = _num_passing(refs, freq, ids, start, most)
        if found is not NotImplemented:
            return found
    window = ids[start:start + most]
    if len(window) < 2:
        return 1 if window and not (refs[window[0]] or freq[window[0]]) else 0
    get = itemgetter(*window)
    held, hit = get(refs), get(freq)
    if not any(held) and not any(hit):
        return len(window)
    return countOf(takewhile(not_, map(or_, held, hit)), 0)


def tail(values: list, start: int):
    """An iterator over ``values[start:]`` without a copy (``islice`` would step over the
    first ``start`` items one by one)."""
    it = iter(values)
    it.__setstate__(start)
    return it
