"""S3-FIFO as a :class:`~kvsim.cache.queue_pool.QueuePolicy`: a small probation FIFO, a main
FIFO with CLOCK-like second chances and a ghost FIFO, driven one batch of blocks at a time.

Both queues only ever lose blocks at their head (promotion, eviction, a CLOCK pass) and gain
them at their tail, so each is kept as plain lists and a head index instead of an
``OrderedDict``:

- ``S`` is ``_small[_small_head:]``;
- ``M``, the CLOCK's ring read from its hand, is ``_ahead[_hand:] + _behind``: a pass of the
  hand moves a block from ``_ahead`` to the end of ``_behind`` (the tail), and when ``_ahead``
  is used up ``_behind`` takes its place.

Most blocks of ``M`` are held (the requests hitting them are running) and the hand passes them
unchanged; the scans find the next free block in C (``operator.indexOf`` over the reference
counts) and move the held ones skipped over in slices, so the Python code runs once per free
block met, not once per block passed.
"""

from __future__ import annotations

from collections import OrderedDict
from operator import countOf, indexOf, or_

from kvsim.cache.queue_pool import QueuePolicy, set_all


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

    def attach(self, pool) -> None:
        super().attach(pool)
        self.capacity = pool.num_blocks
        self.small_capacity = max(1, int(self.small_share * pool.num_blocks))
        self.reset()

    def reset(self) -> None:
        self._small: list[int] = []          # S is _small[_small_head:], oldest first
        self._small_head = 0
        self._ahead: list[int] = []          # M is _ahead[_hand:] + _behind, from the hand
        self._hand = 0
        self._behind: list[int] = []
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.freq = [0] * self.capacity
        self.in_main = [False] * self.capacity
        self.num_main_free = 0          # free blocks in M: none -> skip its scan (O(1))

    # --- the queues, oldest first ------------------------------------------------------

    @property
    def small(self) -> list[int]:
        return self._small[self._small_head:]

    @property
    def main(self) -> list[int]:
        return self._ahead[self._hand:] + self._behind

    def order(self):
        refs = self.pool.ref_counts
        return [b for b in (*self.small, *self.main) if refs[b] == 0]

    # --- hooks ---------------------------------------------------------------------------

    def fill_many(self, block_ids, block_hashes):
        set_all(self.freq, block_ids, 0)
        ghost = self.ghost
        if ghost.keys().isdisjoint(block_hashes):        # none came back: all into S
            set_all(self.in_main, block_ids, False)
            self._small += block_ids
            return
        for block_id, block_hash in zip(block_ids, block_hashes):
            into_main = block_hash in ghost
            if into_main:
                del ghost[block_hash]
            self.in_main[block_id] = into_main
            (self._behind if into_main else self._small).append(block_id)

    def hit_many(self, block_ids):
        freq, top = self.freq, self.max_freq
        for block_id in block_ids:
            if freq[block_id] < top:
                freq[block_id] += 1

    def release_many(self, block_ids):
        """Queue order is fill order: nothing moves."""
        self.num_main_free += sum(map(self.in_main.__getitem__, block_ids))

    def acquire_many(self, block_ids):
        """Held blocks stay queued (skipped by eviction)."""
        self.num_main_free -= sum(map(self.in_main.__getitem__, block_ids))

    # --- eviction ------------------------------------------------------------------------

    def victims(self, n):
        """Per victim: ``S`` first while it holds its share (or ``M`` is empty); a queue whose
        free blocks were all promoted or held hands over to the other. Victims from ``M`` come
        in runs: while ``S`` is under its share it does not change, so the next
        ``min(n, num_main_free)`` victims all come from ``M``."""
        out = []
        while len(out) < n:
            if (len(self._small) - self._small_head >= self.small_capacity
                    or len(self._ahead) - self._hand + len(self._behind) == 0):
                block_id = self._from_small()
                if block_id is not None:
                    out.append(block_id)
                    continue
            if self.num_main_free:
                out += self._from_main(min(n - len(out), self.num_main_free))
                continue
            block_id = self._from_small()
            if block_id is not None:
                out.append(block_id)
            elif not self.num_main_free:
                raise ValueError(f"no free cached block left to evict ({len(out)} of {n})")
        return out

    def _from_small(self) -> int | None:
        """Scan ``S`` once from its oldest block: the first free block of frequency 0 goes
        (its hash to ``G``), the blocks before it move to ``M``; None if every block moved."""
        small, head, refs = self._small, self._small_head, self.pool.ref_counts
        try:        # refs | freq is 0 only for a free block never hit
            end = head + indexOf(map(or_, map(refs.__getitem__, tail(small, head)),
                                     map(self.freq.__getitem__, tail(small, head))), 0)
        except ValueError:
            end = len(small)
        if end > head:
            self._promote(small[head:end])
        if end == len(small):
            self._small, self._small_head = [], 0
            return None
        block_id, self._small_head = small[end], end + 1
        if self._small_head > 1024 and 2 * self._small_head > len(small):
            del small[:self._small_head]
            self._small_head = 0
        ghost = self.ghost
        ghost[self.pool.block_hashes[block_id]] = None
        if len(ghost) > self.capacity - self.small_capacity:
            ghost.popitem(last=False)
        return block_id

    def _promote(self, block_ids: list[int]) -> None:
        set_all(self.in_main, block_ids, True)
        self._behind += block_ids
        self.num_main_free += countOf(map(self.pool.ref_counts.__getitem__, block_ids), 0)

    def _from_main(self, k: int) -> list[int]:
        """CLOCK over ``M``: the next ``k`` free blocks of frequency 0 the hand meets (``k`` at
        most ``num_main_free``: every free block reaches 0 within four laps).

        The hand jumps from free block to free block (``indexOf`` over the reference counts,
        which no step here changes); a free block of frequency > 0 loses one and stays; the
        blocks passed are moved behind in slices, up to each victim and at each lap's end.
        Longer than most functions: one loop, so the hot path keeps its locals.
        """
        refs, freq = self.pool.ref_counts, self.freq
        ahead, behind, passed = self._ahead, self._behind, self._hand
        out = []
        while True:                                  # one lap of ``ahead`` per iteration
            scan = passed
            frees = map(refs.__getitem__, tail(ahead, scan))
            while True:
                try:
                    i = scan + indexOf(frees, 0)
                except ValueError:
                    break
                scan = i + 1
                block_id = ahead[i]
                if freq[block_id]:
                    freq[block_id] -= 1
                    continue
                behind += ahead[passed:i]
                passed = scan
                out.append(block_id)
                if len(out) == k:
                    self._ahead, self._behind, self._hand = ahead, behind, passed
                    self.num_main_free -= k
                    return out
            behind += ahead[passed:]
            if not behind:
                raise ValueError("M has no free block left to evict")
            ahead, behind, passed = behind, [], 0


def tail(values: list, start: int):
    """An iterator over ``values[start:]`` without a copy (``islice`` would step over the
    first ``start`` items one by one)."""
    it = iter(values)
    it.__setstate__(start)
    return it
