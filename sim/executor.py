"""Executors turn a :class:`~kvsim.cache.StepPlan` into elapsed seconds.

The simulator predicts durations (:class:`CostModelExecutor`); ``kvsim.real_backend`` performs the
step on real tensors and measures it. Both run under the same replica loop.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from kvsim.cache.step_plan import StepPlan


@runtime_checkable
class Executor(Protocol):
    def step_duration(self, plan: StepPlan) -> float:
        """Seconds the step takes (compute plus the block copies it asks for)."""


@runtime_checkable
class DecodeRunPredictor(Protocol):
    """An executor that can predict a run of decode-only steps at once (lets the loop skip
    ahead). Must equal :meth:`Executor.step_duration` of the same steps exactly."""

    def decode_durations(self, num_seqs: int, total_context_tokens: int,
                         num_steps: int) -> np.ndarray:
        """Durations of ``num_steps`` decode steps of ``num_seqs`` requests whose computed
        context totals ``total_context_tokens`` before the first and grows by ``num_seqs``."""


class FixedExecutor:
    """Every step takes ``prefill_s_per_token * tokens + decode_s`` seconds (for tests)."""

    def __init__(self, step_s: float = 0.01, per_token_s: float = 0.0):
        self.step_s = step_s
        self.per_token_s = per_token_s

    def step_duration(self, plan: StepPlan) -> float:
        return self.step_s + self.per_token_s * plan.num_scheduled_tokens

    def decode_durations(self, num_seqs: int, total_context_tokens: int,
                         num_steps: int) -> np.ndarray:
        return np.full(num_steps, self.step_s + self.per_token_s * num_seqs)
