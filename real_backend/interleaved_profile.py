"""A profile measured between a validation's real steps, so it sees the host at the run's speed.

On a shared CPU host the speed moves by 5-20 % within minutes (``reports/validation/``): a
profile made before the run describes the host as it was then, and the simulated run inherits
that offset (busy time +6.9 / -8.8 / +3.0 % in three repeats whose real runs and replays agreed
within 1 %). :class:`InterleavedProfile` measures the same grid as ``kvsim profile``
(:func:`~.profiling.default_grid` and the LM head table, each item in the steady state of
:func:`~.profiling.steady_median`) in slices *between* the real run's steps: after each step it
measures the next items of the grid, cycling through it, until profiling has used ``share``
times the wall time the run has used so far. Each item's time is the median of its passes. So
the samples spread evenly over the run (and over the noise floor's replay, which gets the same
hook), and a change of host speed reaches the profile and the run alike.

It runs on its own KV store and shares the run's model (weights and CPU LM head layouts): it
times the run's kernels on the run's weights and never touches the run's KV. A step is timed on
its own, so the profiling in between adds no time to any step. It does change what ran before
a step: some real steps follow profile kernels (other shapes, other KV) instead of only the
engine's host work, and may find colder caches. The replay is interleaved the same way (with
other items before other steps), so the noise floor includes that disturbance; measured on the
2-vCPU VM, the simulated busy time stayed within -4.8 to +4.5 % of real
(``reports/validation/``).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from kvsim.real_backend.kv_store import PagedKVStore
from kvsim.real_backend.model_runner import ModelRunner
from kvsim.real_backend.profiling import (MAX_BATCH_TABLE, Limits, blocks_needed, default_grid,
                                          head_inputs, point_call, profile_record, quiet,
                                          steady_median)
from kvsim.real_backend.session import BackendSettings, warm_up
from kvsim.real_backend.torch_executor import clock_fn


class InterleavedProfile:
    """The full profile grid, measured a few items at a time between a run's steps."""

    def __init__(self, runner: ModelRunner, settings: BackendSettings, model, limits: Limits,
                 share: float = 1.0, quick: bool = False, min_passes: int = 1,
                 wall: Callable[[], float] = time.perf_counter) -> None:
        self.settings, self.model, self.limits, self.share = settings, model, limits, share
        self.quick, self.min_passes, self._wall = quick, max(min_passes, 1), wall
        self.grid = default_grid(limits, quick=quick, seed=settings.seed)
        dev, host = blocks_needed(self.grid, settings.block_size)
        store = PagedKVStore.for_model(runner.model.cfg, num_blocks=dev,
                                       block_size=settings.block_size, num_host_blocks=host,
                                       dtype=settings.dtype, device=settings.device)
        self.runner = ModelRunner(runner.model, store)
        rows = min(limits.max_num_seqs, MAX_BATCH_TABLE)
        warm_up(self.runner, rows)
        self.calls = self._calls(rows)
        self.samples: list[list[float]] = [[] for _ in self.calls]
        self.num_between = 0        # items measured between steps (the rest by finish)
        self.spent_s = 0.0          # wall seconds spent profiling
        self._next, self._start = 0, None
        self._now = clock_fn(settings.clock)

    def _calls(self, rows: int) -> list[Callable[[], object]]:
        rng = np.random.default_rng(self.settings.seed)
        head = self.runner.model.logits
        return ([point_call(self.runner, p, rng) for p in self.grid.points]
                + [lambda x=x: head(x) for x in head_inputs(self.runner, rows)])

    def start(self) -> None:
        """The run starts now: from here, profiling keeps pace with it."""
        self._start = self._wall()

    def between_steps(self) -> None:
        """After a step: measure grid items while profiling is behind ``share`` of the run."""
        if self._start is None:
            self.start()
        run_s = self._wall() - self._start - self.spent_s
        while self.spent_s < self.share * run_s:
            self._measure_next()
            self.num_between += 1

    def _measure_next(self) -> None:
        start = self._wall()
        i = self._next
        with torch.inference_mode():
            self.samples[i].append(steady_median(self.calls[i], self.runner.device, self._now,
                                                 self.grid.warmup, self.grid.repeats))
        self._next = (i + 1) % len(self.calls)
        self.spent_s += self._wall() - start

    def finish(self) -> None:
        """Complete the pass in progress, and passes up to ``min_passes``: every item measured
        equally often."""
        while self._next or len(self.samples[0]) < self.min_passes:
            self._measure_next()

    @property
    def passes(self) -> int:
        return min(len(s) for s in self.samples)

    def profile(self, progress: Callable[[str], None] = quiet) -> dict:
        """:meth:`finish`, then the fitted profile of every complete pass (as ``kvsim
        profile`` writes it), with ``timing`` saying how it was measured."""
        self.finish()
        n, points = self.passes, len(self.grid.points)
        rounds = [[s[k] for s in self.samples[:points]] for k in range(n)]
        tables = [[s[k] for s in self.samples[points:]] for k in range(n)]
        out = profile_record(self.settings, self.model, self.runner, self.limits, self.quick,
                             self.grid, rounds, tables, self.spent_s)
        total = sum(len(s) for s in self.samples)
        out["timing"] = {"kind": "interleaved", "share": self.share, "items": len(self.calls),
                         "measured_between_steps": self.num_between / total if total else 0.0}
        progress(f"profile: measured between the real steps, {n} pass{'es' * (n != 1)} over "
                 f"{len(self.calls)} items in {self.spent_s:.1f}s "
                 f"({out['timing']['measured_between_steps']:.0%} between steps)")
        return out
