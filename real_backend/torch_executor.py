"""TorchExecutor: perform a :class:`~kvsim.cache.StepPlan` on real tensors and time it.

It is an :class:`kvsim.sim.serving.executor.Executor` (``step_duration(plan) -> seconds``), so
``kvsim.sim.serving.runner.simulate(requests, config, executor=TorchExecutor(...))`` replays a trace with
the same scheduler and cache manager as a simulated run, the clock advancing by measured time.
It deliberately does not support decode runs (``supports_decode_runs`` is false): the loop then
never skips ahead, and every step really runs. ``transfer_time(plan)`` is the measured time of
the copies of the plan it performed last.

One step, all inside the timed region:

1. every block copy of ``plan.transfers`` through the :class:`PagedKVStore` (before the forward,
   as a swap-in must land before attention reads it);
2. one forward pass over exactly the scheduled tokens: per scheduled request a
   :class:`RequestChunk` of its token ids ``[c, c + n)`` at ``c = num_computed_tokens``, through
   its live block table ``plan.block_table(request_id)``;
3. greedy sampling; a request whose chunk reached the end of its known tokens gets the argmax
   token appended (the scheduler emits an output token exactly then), so a recompute after
   preemption re-reads the tokens it generated.

``repeats > 1`` runs the forward pass that many times and takes the median (a forward pass is
idempotent: it rewrites the same K/V into the same slots and samples the same tokens); block
copies run once. Each repeat after the first follows :func:`interlude` (the host work an engine
does between steps, as ``kvsim profile`` times its grid), so a repeat is not faster than a
step for having run just before. It tames timing noise on a shared host at the cost of that
many forwards.

Timing: ``clock="wall"`` (default) is ``time.perf_counter`` on the CPU and CUDA events on a
GPU; ``clock="cpu"`` is the process CPU time (CPU only), which ignores time lost to other
processes on a shared host (equal to wall time on an idle machine with one torch thread).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Iterable, TypeVar

import torch

from kvsim.cache.step_plan import StepPlan
from kvsim.sim.serving.executor import Executor

from kvsim.real_backend.model_runner import ModelRunner, RequestChunk
from kvsim.real_backend.tokens import token_ids_for

CLOCKS = ("wall", "cpu")


def clock_fn(clock: str) -> Callable[[], float]:
    """``time.perf_counter`` for ``wall``, ``time.process_time`` for ``cpu``."""
    return time.process_time if clock == "cpu" else time.perf_counter
T = TypeVar("T")

#: Host work :func:`interlude` does (untimed) before a timed step: a Python loop over this many
#: small dicts, ~0.4 ms on the 2-vCPU EPYC host, about what the engine's scheduler and cache
#: manager do between two steps of ``kvsim validate`` (its wall time less its step time). That
#: work evicts the interpreter's and torch dispatcher's state from the core's caches and
#: predictors: timed without it, a small decode step measured ~7 % faster than after it.
INTERLUDE_ITEMS = 6000
_INTERLUDE = [{"id": i, "blocks": [i, i + 1]} for i in range(INTERLUDE_ITEMS)]


def interlude() -> int:
    """Engine-like host work between two timed steps (see :data:`INTERLUDE_ITEMS`)."""
    total = 0
    for item in _INTERLUDE:
        total += item["id"] + len(item["blocks"])
    return total


class TorchExecutor(Executor):
    """Executes step plans on a :class:`ModelRunner` and returns measured seconds."""

    supports_decode_runs = False

    def __init__(self, runner: ModelRunner, requests: Iterable, *, clock: str = "wall",
                 repeats: int = 1) -> None:
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
        if clock == "cpu" and runner.device.type == "cuda":
            raise ValueError("clock='cpu' measures host CPU time; use 'wall' on a GPU")
        if repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {repeats}")
        self.runner = runner
        self.clock = clock
        self.repeats = repeats
        self._now = clock_fn(clock)
        self.block_size = runner.kv_store.block_size
        self.vocab_size = runner.model.cfg.vocab_size
        self._requests = {r.request_id: r for r in requests}
        self._tokens: dict[int, list[int]] = {}
        self.outputs: dict[int, list[int]] = {}   # finished request -> its generated tokens
        self.num_steps = 0
        self.bytes_copied = 0
        self._copied: tuple[StepPlan | None, float] = (None, 0.0)   # last plan, its copy time

    # --- tokens ---------------------------------------------------------------------------
    def tokens(self, request_id: int) -> list[int]:
        """The request's known tokens: prompt, then every token generated so far."""
        toks = self._tokens.get(request_id)
        if toks is None:
            request = self._requests[request_id]
            toks = token_ids_for(request, self.block_size, self.vocab_size).tolist()
            self._tokens[request_id] = toks
        return toks

    def generated(self, request_id: int) -> list[int]:
        """Tokens the model generated for the request so far (all of them once finished)."""
        if request_id in self.outputs:
            return self.outputs[request_id]
        return self.tokens(request_id)[self._requests[request_id].prompt_tokens:]

    def _chunks(self, plan: StepPlan) -> list[RequestChunk]:
        chunks = []
        for s in plan.scheduled:
            toks = self.tokens(s.request_id)
            end = s.num_computed_tokens + s.num_new_tokens
            if end > len(toks):
                raise RuntimeError(f"request {s.request_id}: step asks for tokens up to {end} "
                                   f"but only {len(toks)} are known")
            chunks.append(RequestChunk(toks[s.num_computed_tokens:end], s.num_computed_tokens,
                                       plan.block_table(s.request_id)))
        return chunks

    # --- one step -------------------------------------------------------------------------
    def step_duration(self, plan: StepPlan) -> float:
        """Perform the step and return its measured duration in seconds."""
        self.num_steps += 1
        seconds = self._timed(lambda: self._copy_blocks(plan))[0] if plan.transfers else 0.0
        self._copied = (plan, seconds)
        if plan.scheduled:
            chunks = self._chunks(plan)
            runs = [self._timed(lambda: self.runner.greedy(chunks))]
            for _ in range(self.repeats - 1):
                interlude()
                runs.append(self._timed(lambda: self.runner.greedy(chunks)))
            seconds += statistics.median(r for r, _ in runs) if self.repeats > 1 else runs[0][0]
            self._append_sampled(plan, runs[-1][1])
        return seconds

    def transfer_time(self, plan: StepPlan) -> float:
        """Measured seconds of the block copies of ``plan``, the step performed last."""
        performed, seconds = self._copied
        if plan is not performed:
            raise ValueError("a TorchExecutor times copies by performing them: ask for the "
                             "transfer time of the plan its last step_duration ran")
        return seconds

    def _copy_blocks(self, plan: StepPlan) -> None:
        for transfer in plan.transfers:
            self.bytes_copied += self.runner.kv_store.copy_blocks(transfer.kind, transfer.pairs)

    def _append_sampled(self, plan: StepPlan, sampled: list[int]) -> None:
        for s, token in zip(plan.scheduled, sampled):
            toks = self._tokens[s.request_id]
            if s.num_computed_tokens + s.num_new_tokens == len(toks):
                toks.append(int(token))
            self._forget_if_done(s.request_id)

    def _forget_if_done(self, request_id: int) -> None:
        request = self._requests[request_id]
        toks = self._tokens[request_id]
        if len(toks) >= request.prompt_tokens + request.output_tokens:
            self.outputs[request_id] = toks[request.prompt_tokens:]
            del self._tokens[request_id]

    def _timed(self, fn: Callable[[], T]) -> tuple[float, T]:
        """``(seconds, fn())``: CUDA events on a GPU, else the executor's clock."""
        if self.runner.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3, out
        t0 = self._now()
        out = fn()
        return self._now() - t0, out
