"""Where the steps of a decode run open blocks, and the slots left empty in the last blocks.

Before step ``s`` of a run, request ``i`` has ``num_computed[i] + s`` computed tokens; their
remainder by the block size is its *offset* in its last block. It takes part in steps up to
``finish_step[i]`` (from ``joined[i]``, the step admitting it, when it joined the run) and
decodes in those after its admission; it *opens* a block at a decode step where its offset is 0,
and it *stays* (holds its blocks after the step) at the steps before its finish.

Two formulations of the same numbers, equal element for element (``tests/test_cache_run_grid.py``):

- :class:`StepGrid`: steps x requests matrices, a handful of numpy calls (cheapest for short
  runs and small batches; the fill matrix comes from it too);
- :func:`open_events` and :func:`tail_offsets`: from each request's arithmetic progression of
  offsets, in work that grows with the events and the requests, not with steps times requests
  (Vidur's request set: runs of 434 steps over 24 requests on average, one open in 16 cells).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

#: Fewest steps x requests for which a commit finds its opens and tails by arithmetic rather
#: than from the matrices (below it the matrices' few calls cost less).
MIN_ARITHMETIC_CELLS = 5000


class StepGrid:
    """Steps ``first..first+n-1`` of ``run`` as steps x requests matrices."""

    def __init__(self, run, first: int, n: int, block_size: int):
        self.run, self.first, self.n, self.block_size = run, first, n, block_size
        self.steps = np.arange(first, first + n, dtype=np.int64)

    @cached_property
    def offset(self) -> np.ndarray:
        """Each request's offset in its last block before each step."""
        bs = self.block_size
        offset = self.run.num_computed[None, :] + self.steps[:, None]
        if bs & (bs - 1):
            offset %= bs
        else:           # (a power of two: the same values, negative tokens too, cheaper)
            offset &= bs - 1
        return offset

    @cached_property
    def _membership(self) -> tuple[np.ndarray, np.ndarray]:
        """(decoding, staying): who decodes at each step, who holds its blocks after it."""
        run, steps = self.run, self.steps[:, None]
        taking_part = steps <= run.finish_step[None, :]
        staying = steps < run.finish_step[None, :]
        if run.joined is None:
            return taking_part, staying
        started = steps >= run.joined[None, :]
        # (each joins at or before its finish: those finished are among those started)
        return taking_part & (steps > run.joined[None, :]), staying & started

    @cached_property
    def opens(self) -> np.ndarray:
        """Where a request opens a block."""
        return (self.offset == 0) & self._membership[0]

    def fills(self, registers: np.ndarray) -> np.ndarray:
        """Where a request whose ``registers`` is set fills a block (after its open, if
        both)."""
        return (self.offset == self.block_size - 1) & registers & self._membership[0]

    def open_events(self) -> tuple[np.ndarray, np.ndarray]:
        """``np.nonzero(self.opens)``: steps and requests of the opens, step by step."""
        return np.nonzero(self.opens)

    def tail_offsets(self) -> np.ndarray:
        """Per step, the offsets of the requests staying after it, summed."""
        return (self.offset * self._membership[1]).sum(axis=1)


def _intervals(run, first: int, n: int, after_join: int):
    """Each request's first and last step within ``first..first+n-1`` of those it decodes in
    (``after_join`` 1: after its admission step; its finish step included) or stays after
    (``after_join`` 0: from its admission step; its finish step excluded)."""
    lo = np.full(len(run.finish_step), first, dtype=np.int64)
    if run.joined is not None:
        lo = np.maximum(lo, run.joined + after_join)
    hi = np.minimum(run.finish_step - (1 - after_join), first + n - 1)
    return lo, hi


def _progression(c: np.ndarray, lo: np.ndarray, hi: np.ndarray, bs: int):
    """The first step ``s >= lo`` with ``(c + s) % bs == 0``, and how many such steps there
    are up to ``hi`` (0 where none)."""
    start = lo + (-(c + lo)) % bs
    count = np.where(start <= hi, (hi - start) // bs + 1, 0)
    return start, count


def _unfold(start: np.ndarray, count: np.ndarray, bs: int) -> tuple[np.ndarray, np.ndarray]:
    """The terms of the progressions ``start[i] + k * bs`` (``k < count[i]``) and the ``i``
    of each, progression after progression."""
    total = int(count.sum())
    who = np.repeat(np.arange(len(count)), count)
    k = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
    return start[who] + bs * k, who


def open_events(run, first: int, n: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`StepGrid.open_events`: the opens in steps ``first..first+n-1`` (steps counted
    from ``first``) and who opens, sorted by step and then by request."""
    lo, hi = _intervals(run, first, n, 1)
    steps, who = _unfold(*_progression(run.num_computed, lo, hi, block_size), block_size)
    num = len(lo)
    key = (steps - first) * num + who
    key.sort()
    return np.divmod(key, num)


def tail_offsets(run, first: int, n: int, block_size: int, events=None) -> np.ndarray:
    """:meth:`StepGrid.tail_offsets`, from the run's :func:`open_events` in these steps
    (``events``, found when not given). A request staying at steps ``lo..hi`` has offset
    ``c + s - bs * floor((c + s) / bs)`` at step ``s``: the floor starts at
    ``floor((c + lo) / bs)`` and grows by one at each of its opens after ``lo`` and before its
    finish step."""
    bs, c = block_size, run.num_computed
    rows, who = open_events(run, first, n, bs) if events is None else events
    lo, hi = _intervals(run, first, n, 0)
    wraps = rows[(rows + first > lo[who]) & (rows + first <= hi[who])]
    live = lo <= hi
    c_sum, count, floors = _staying_sums(c[live], lo[live], hi[live], wraps, first, n, bs)
    return c_sum + np.arange(first, first + n, dtype=np.int64) * count - bs * floors


def _staying_sums(c, lo, hi, wraps, first: int, n: int, bs: int) -> np.ndarray:
    """Per step of ``first..first+n-1``, summed over the requests staying then (at steps
    ``lo..hi``): ``c``, the number of requests, and the floors of :func:`tail_offsets`
    (``wraps``: the steps where one grows). Three difference rows in one bincount (float
    weights: whole numbers far below 2**53, so exact), summed along the steps."""
    begin, end, width = lo - first, hi - first + 1, n + 1
    at = np.concatenate((begin, end, begin + width, end + width, begin + 2 * width,
                         end + 2 * width, wraps + 2 * width))
    ones = np.ones(len(c))
    weights = np.concatenate((c, -c, ones, -ones, (c + lo) // bs, -((c + hi) // bs),
                              np.ones(len(wraps))))
    delta = np.bincount(at, weights, 3 * width).astype(np.int64).reshape(3, width)
    return np.cumsum(delta[:, :n], axis=1)
