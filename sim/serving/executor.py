"""Executors turn a :class:`~kvsim.cache.StepPlan` into elapsed seconds.

The simulator predicts durations (:class:`~kvsim.sim.perf.cost_model.CostModel`);
``kvsim.real_backend`` performs the step on real tensors and measures it
(:class:`~kvsim.real_backend.torch_executor.TorchExecutor`). Both run under the same replica loop.
"""

from __future__ import annotations

from itertools import chain
from typing import Protocol

import numpy as np

from kvsim.cache.step_plan import StepPlan


class Executor(Protocol):
    """What the replica loop asks of an executor.

    Decode runs are an optional extension: an executor that sets ``supports_decode_runs``
    predicts a whole run of decode-only steps at once (:meth:`decode_durations`), which lets the
    loop wait out the run as one event; the loop asks for them through :meth:`steps_until`,
    which an executor may provide faster (one that does not gets this class's, built on
    :meth:`decode_durations`). The default (inherited by an executor that subclasses this
    protocol) does not support them, and the loop then takes every step one at a time.
    """

    #: True when :meth:`decode_durations` is implemented (the loop may skip ahead).
    supports_decode_runs: bool = False

    def step_duration(self, plan: StepPlan) -> float:
        """Seconds the step takes (compute plus the block copies it asks for)."""

    def transfer_time(self, plan: StepPlan) -> float:
        """Seconds of the plan's block copies (part of :meth:`step_duration`)."""

    def decode_durations(self, num_seqs: int, total_context_tokens: int,
                         num_steps: int, prefill: tuple[int, int] | None = None) -> np.ndarray:
        """Durations of ``num_steps`` decode steps of ``num_seqs`` requests whose computed
        context totals ``total_context_tokens`` before the first and grows by ``num_seqs``; each
        equal (``==``) to :meth:`step_duration` of the same step without block copies.
        ``prefill``: ``(num_computed, num_new)`` of one more request in each step, computing
        ``num_new`` prompt tokens on top of ``num_computed`` (growing by ``num_new`` a step).
        Called only when ``supports_decode_runs`` is true."""
        raise NotImplementedError(f"{type(self).__name__} does not predict decode runs "
                                  "(supports_decode_runs is False)")

    def steps_until(self, stretches, now: float, horizon: float) -> tuple:
        """The steps of ``stretches`` run back to back from ``now``, up to the first that ends
        at or after ``horizon`` (all of them if none does): ``(durations, before, end,
        crossed)``, ``durations`` a list of floats, ``end`` when the last of them ends (SimPy's
        sum, one step at a time), ``before`` when it starts, ``crossed`` whether it ends at or
        after ``horizon``. A stretch ``(num_steps, num_seqs, context tokens, prompt tokens)``
        is :meth:`decode_durations` of ``num_steps`` decode steps, beside a whole prompt of
        that many tokens computed from nothing when there is one. Lazily: a run usually meets
        the next arrival within a few dozen steps, so an executor may provide this faster."""
        return back_to_back(chain.from_iterable(
            self.decode_durations(num_seqs, context, num_steps,
                                  prefill=(0, prompt) if prompt else None).tolist()
            for num_steps, num_seqs, context, prompt in stretches), now, horizon)


def back_to_back(durations, now: float, horizon: float) -> tuple:
    """:meth:`Executor.steps_until` of steps taking ``durations`` (an iterable of floats)."""
    taken, before, end = [], now, now
    for duration in durations:
        taken.append(duration)
        before, end = end, end + duration
        if end >= horizon:
            return taken, before, end, True
    return taken, before, end, False
