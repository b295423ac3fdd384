"""Executors turn a :class:`~kvsim.cache.StepPlan` into elapsed seconds.

The simulator predicts durations (:class:`~kvsim.sim.perf.cost_model.CostModel`);
``kvsim.real_backend`` performs the step on real tensors and measures it
(:class:`~kvsim.real_backend.torch_executor.TorchExecutor`). Both run under the same replica loop.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from kvsim.cache.step_plan import StepPlan


class Executor(Protocol):
    """What the replica loop asks of an executor.

    Decode runs are an optional extension: an executor that sets ``supports_decode_runs``
    predicts a whole run of decode-only steps at once (:meth:`decode_durations`), which lets the
    loop wait out the run as one event; the loop asks for them through :meth:`decode_steps`,
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

    def decode_steps(self, stretches):
        """The durations of the steps of ``stretches``, one float at a time, lazily (a run
        stops asking at the next arrival): for each ``(num_steps, num_seqs, context tokens,
        prompt tokens)``, the :meth:`decode_durations` of ``num_steps`` decode steps, beside a
        whole prompt of that many tokens computed from nothing when there is one."""
        for num_steps, num_seqs, context, prompt in stretches:
            yield from self.decode_durations(num_seqs, context, num_steps,
                                             prefill=(0, prompt) if prompt else None).tolist()
