"""Engine steps folded as they come, in memory that does not grow with the run.

- :class:`StepTotals`: per step column its sum, its duration-weighted sum and its maximum, over
  all steps and over the steps after which a request waited ("under load"): everything
  ``summary.json`` reads from the steps (weighted means, totals, peaks).
- :class:`Timeline`: the steps on a grid of at most ``max_rows`` time bins. A bin's width is a
  power of two seconds; when the run outgrows the grid, neighbouring bins merge pairwise and the
  width doubles. States (running, KV blocks, slots) are kept as exact time integrals, the state
  a step leaves holding until that replica's next step starts; counts (tokens, preemptions,
  transfers) fall in the bin where their step ends. Merging adds, so the final grid is what
  binning every step directly at the final width would give.

Both take steps in blocks (a float64 matrix, one row per step, columns in
:data:`STEP_COLUMNS` order).
"""

from __future__ import annotations

import math

import numpy as np

STEP_COLUMNS = (
    "t_start", "duration", "replica", "batch_size", "scheduled_tokens", "output_tokens",
    "num_running", "num_waiting", "kv_used_blocks", "kv_cached_idle_blocks",
    "token_slots", "internal_slots", "reserved_slots", "external_slots",
    "preemptions", "prefix_queries_tokens", "prefix_hit_tokens",
    "swap_out_blocks", "swap_in_blocks", "offload_blocks", "promote_blocks", "compact_blocks",
    "host_used_blocks", "transfer_s",
)
STATE_COLUMNS = ("num_running", "num_waiting", "kv_used_blocks", "kv_cached_idle_blocks",
                 "token_slots", "internal_slots", "reserved_slots", "external_slots",
                 "host_used_blocks")
COUNT_COLUMNS = ("output_tokens", "preemptions", "prefix_queries_tokens", "prefix_hit_tokens",
                 "swap_out_blocks", "swap_in_blocks", "offload_blocks", "promote_blocks",
                 "compact_blocks", "transfer_s")
#: Steps buffered before they are folded (bounds the buffer, amortises the numpy calls).
CHUNK_STEPS = 4096
#: Most rows of the timeline (even: bins merge in pairs).
MAX_TIMELINE_ROWS = 2000
#: Width of a bin before the run outgrows the grid: 2**-20 s (about a microsecond). Widths stay
#: powers of two, so a whole number of blocks times a width is an exact float.
FIRST_BIN_S = 2.0 ** -20

_COL = {name: i for i, name in enumerate(STEP_COLUMNS)}
_T, _D, _R, _W = _COL["t_start"], _COL["duration"], _COL["replica"], _COL["num_waiting"]
_STATE = [_COL[c] for c in STATE_COLUMNS]
_COUNT = [_COL[c] for c in COUNT_COLUMNS]


class _Sum:
    """A vector of running sums, compensated (Neumaier) so that the order in which blocks
    arrive does not pile up rounding error."""

    def __init__(self, size: int) -> None:
        self.total = np.zeros(size)
        self.carry = np.zeros(size)

    def add(self, values: np.ndarray) -> None:
        total = self.total + values
        big = np.abs(self.total) >= np.abs(values)
        self.carry += np.where(big, (self.total - total) + values, (values - total) + self.total)
        self.total = total

    @property
    def value(self) -> np.ndarray:
        return self.total + self.carry


class StepTotals:
    """Sums, duration-weighted sums and maxima of every step column; ``under_load``: the same
    over the steps that left a request waiting (``num_waiting > 0``)."""

    def __init__(self, with_under_load: bool = True) -> None:
        size = len(STEP_COLUMNS)
        self.num_steps = 0
        self._sums, self._weighted = _Sum(size), _Sum(size)
        self._maxima = np.full(size, -np.inf)
        self.under_load = StepTotals(False) if with_under_load else None

    def add(self, block: np.ndarray) -> None:
        """Fold a block of steps."""
        self._add_columns(np.ascontiguousarray(block.T))

    def _add_columns(self, columns: np.ndarray) -> None:
        """Fold steps given as one C-contiguous row per column: numpy then sums each row
        pairwise, whatever the number of steps or where they come from."""
        if not columns.shape[1]:
            return
        self.num_steps += columns.shape[1]
        self._sums.add(columns.sum(axis=1))
        self._weighted.add((columns * columns[_D]).sum(axis=1))
        self._maxima = np.maximum(self._maxima, columns.max(axis=1))
        if self.under_load is not None:     # (``compress``: C order, 6x a boolean index)
            self.under_load._add_columns(columns.compress(columns[_W] > 0, axis=1))

    def sum(self, name: str) -> float:
        """Total of column ``name`` over the steps."""
        return float(self._sums.value[_COL[name]])

    def weighted_sum(self, name: str) -> float:
        """Sum of column ``name`` times each step's duration."""
        return float(self._weighted.value[_COL[name]])

    def time_average(self, name: str) -> float:
        """Mean of column ``name`` weighted by step duration (0.0 when no time passed)."""
        seconds = self.sum("duration")
        return self.weighted_sum(name) / seconds if seconds else 0.0

    def mean(self, name: str) -> float:
        """Mean of column ``name`` per step (0.0 without steps)."""
        return self.sum(name) / self.num_steps if self.num_steps else 0.0

    def max(self, name: str) -> float:
        """Largest value of column ``name`` (0.0 without steps)."""
        return float(self._maxima[_COL[name]]) if self.num_steps else 0.0


class Timeline:
    """Steps binned on a bounded grid of time bins (see the module docstring)."""

    def __init__(self, max_rows: int = MAX_TIMELINE_ROWS, first_width_s: float = FIRST_BIN_S):
        if max_rows < 2 or max_rows % 2:
            raise ValueError(f"max_rows must be an even number >= 2, got {max_rows}")
        self.max_rows, self.width_s = max_rows, first_width_s
        self.state = np.zeros((max_rows, len(STATE_COLUMNS)))    # time integrals
        self.counts = np.zeros((max_rows, len(COUNT_COLUMNS)))
        self.num_steps = np.zeros(max_rows)
        self.batch_sum = np.zeros(max_rows)
        self.duration_s: float | None = None
        self._last: dict[float, tuple[float, np.ndarray]] = {}   # replica: its latest step

    @property
    def num_rows(self) -> int:
        """Rows of the closed timeline: bins up to the end of the run."""
        if not self.duration_s or self.duration_s <= 0:
            return 1
        return max(1, math.ceil(self.duration_s / self.width_s))

    def add(self, block: np.ndarray) -> None:
        """Fold a block of steps (each replica's steps in time order)."""
        ends = block[:, _T] + block[:, _D]
        self._cover(float(ends.max()))
        self._add_counts(block, ends)
        replicas = block[:, _R]
        if (replicas == replicas[0]).all():     # (one replica: no selection to copy)
            self._add_states(replicas[0], block)
            return
        for replica in np.unique(replicas):
            self._add_states(replica, block[replicas == replica])

    def held_mean(self, name: str) -> float:
        """Column ``name`` of :data:`STATE_COLUMNS` averaged over the closed run's whole time,
        summed over replicas: what a step left holds until that replica's next step (idle
        gaps too), the last until the end."""
        if not self.duration_s or self.duration_s <= 0:
            return 0.0
        return float(self.state[:, STATE_COLUMNS.index(name)].sum()) / self.duration_s

    def close(self, duration_s: float) -> None:
        """End the run at ``duration_s``: each replica's last state holds until then; then
        widen the bins until there are no more rows than steps."""
        self.duration_s = duration_s
        if duration_s <= 0:
            return
        self._cover(duration_s)
        for start, values in self._last.values():
            self._integrate(np.array([start]), np.array([max(start, duration_s)]),
                            values[None, :])
        self._last.clear()
        while self.num_rows > max(1.0, self.num_steps.sum()):
            self._double()

    def _cover(self, t: float) -> None:
        while t > self.max_rows * self.width_s:
            self._double()

    def _double(self) -> None:
        half = self.max_rows // 2
        for name in ("state", "counts", "num_steps", "batch_sum"):
            bins = getattr(self, name)
            merged = bins.reshape(half, 2, *bins.shape[1:]).sum(axis=1)
            setattr(self, name, np.concatenate([merged, np.zeros_like(merged)]))
        self.width_s *= 2

    def _bins(self, t: np.ndarray) -> np.ndarray:
        return np.minimum((t / self.width_s).astype(np.int64), self.max_rows - 1)

    def _add_counts(self, block: np.ndarray, ends: np.ndarray) -> None:
        k, n = self._bins(ends), self.max_rows
        for j, col in enumerate(_COUNT):
            if np.count_nonzero(block[:, col]):     # (adding zeros changes no bit)
                self.counts[:, j] += np.bincount(k, weights=block[:, col], minlength=n)
        self.num_steps += np.bincount(k, minlength=n)
        self.batch_sum += np.bincount(k, weights=block[:, _COL["batch_size"]], minlength=n)

    def _add_states(self, replica: float, steps: np.ndarray) -> None:
        """Each step's state holds from its start until the replica's next step starts."""
        starts, values = steps[:, _T], steps[:, _STATE]
        last = self._last.get(replica)
        if last is not None:
            starts = np.concatenate([[last[0]], starts])
            values = np.vstack([last[1][None, :], values])
        held = np.flatnonzero(values[:-1].any(axis=0))     # (zeros held add no bit)
        if len(held) == values.shape[1]:
            self._integrate(starts[:-1], starts[1:], values[:-1])
        elif len(held):
            self._integrate(starts[:-1], starts[1:], values[:-1, held], held)
        self._last[replica] = (float(starts[-1]), values[-1].copy())

    def _integrate(self, a: np.ndarray, b: np.ndarray, values: np.ndarray,
                   columns: np.ndarray | None = None) -> None:
        """Add ``values`` held over ``[a, b)`` (one row per interval) to the bins' integrals
        (of the state ``columns`` of ``values``' columns; default all, in order)."""
        if not len(a):
            return
        w, n = self.width_s, self.max_rows
        ka, kb = self._bins(a), self._bins(b)
        one = ka == kb
        head_end = np.where(one, b, (ka + 1) * w)
        _add_rows(self.state, ka, values * (head_end - a)[:, None], columns)
        many = ~one
        if many.any():
            ka, kb, a, b, v = ka[many], kb[many], a[many], b[many], values[many]
            _add_rows(self.state, kb, v * (b - kb * w)[:, None], columns)
            between = np.zeros((n + 1, values.shape[1]))   # whole bins ka+1 .. kb-1
            _add_rows(between, ka + 1, v * w)
            _add_rows(between, kb, -v * w)
            if columns is None:
                self.state += np.cumsum(between, axis=0)[:n]
            else:
                self.state[:, columns] += np.cumsum(between, axis=0)[:n]

    def rows(self) -> dict[str, np.ndarray]:
        """The closed timeline's columns: ``time_s``, ``interval_s`` (the last row ends with the
        run, so it may be shorter), time-averaged :data:`STATE_COLUMNS`, summed
        :data:`COUNT_COLUMNS`, ``num_steps`` and mean ``batch_size``."""
        if self.duration_s is None:
            raise ValueError("close the timeline first")
        n = self.num_rows
        if self.duration_s <= 0:
            time_s, interval = np.zeros(1), np.ones(1)
        else:
            time_s = np.arange(n) * self.width_s
            interval = np.minimum(self.width_s, self.duration_s - time_s)
        out = {"time_s": time_s, "interval_s": interval}
        out.update({c: self.state[:n, j] / interval for j, c in enumerate(STATE_COLUMNS)})
        out.update({c: self.counts[:n, j] for j, c in enumerate(COUNT_COLUMNS)})
        steps = self.num_steps[:n]
        out["num_steps"] = steps.astype(np.int64)
        out["batch_size"] = np.divide(self.batch_sum[:n], steps, out=np.zeros(n),
                                      where=steps > 0)
        return out


def _add_rows(target: np.ndarray, index: np.ndarray, values: np.ndarray,
              columns: np.ndarray | None = None) -> None:
    """``target[index[i], columns] += values[i]`` for every ``i`` in turn (repeated indexes add
    up; ``columns``: of ``target``, one per column of ``values``, default all), as
    ``np.add.at`` does, to the last bit: ``bincount`` adds its weights in order, the target's
    own value first (``0.0 + x == x``), column by column (``np.add.at`` on rows is ~20x
    slower)."""
    n = len(target)
    rows = np.concatenate([np.arange(n), index])
    for j, col in enumerate(range(target.shape[1]) if columns is None else columns.tolist()):
        target[:, col] = np.bincount(
            rows, weights=np.concatenate([target[:, col], values[:, j]]), minlength=n)
