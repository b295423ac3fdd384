"""Executors for tests: fixed step and copy times, so stories can state exact timestamps."""

from __future__ import annotations

import numpy as np

from kvsim.cache.step_plan import StepPlan
from kvsim.sim.serving.executor import Executor


class FixedExecutor(Executor):
    """Every step takes ``step_s + per_token_s * tokens`` seconds; copies take
    ``per_block_s`` a block (for tests)."""

    supports_decode_runs = True

    def __init__(self, step_s: float = 0.01, per_token_s: float = 0.0, per_block_s: float = 0.0):
        self.step_s = step_s
        self.per_token_s = per_token_s
        self.per_block_s = per_block_s

    def step_duration(self, plan: StepPlan) -> float:
        t = self.step_s + self.per_token_s * plan.num_scheduled_tokens
        return t + self.transfer_time(plan) if plan.transfers else t

    def transfer_time(self, plan: StepPlan) -> float:
        return self.per_block_s * sum(t.num_blocks for t in plan.transfers)

    def decode_durations(self, num_seqs: int, total_context_tokens: int,
                         num_steps: int, prefill: tuple[int, int] | None = None) -> np.ndarray:
        tokens = num_seqs + (prefill[1] if prefill else 0)
        return np.full(num_steps, self.step_s + self.per_token_s * tokens)
