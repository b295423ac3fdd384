"""Where a step's time goes: an opt-in per-part timer on a :class:`~.runner.ModelRunner`.

``StepBreakdown(now).attach(runner)`` times every forward pass (``runner.greedy``) and, inside
it, these parts (seconds, on the given clock):

- ``prepare``: host work before the model runs (packing token ids, block tables, positions,
  slot mapping, decode masks: Python and small tensor builds, :meth:`ModelRunner.prepare`);
- ``attention``: every layer's ``self_attn`` (QKV and output projections, RoPE, the paged
  attention itself);
- ``mlp``: every layer's SwiGLU MLP;
- ``lm_head``: the logits (:meth:`LlamaForCausalLM.logits`);
- ``other``: the rest of the forward pass: the total less the parts above (embedding, norms,
  residual adds, argmax and ``tolist`` of the sampling, Python glue between modules).

Each forward pass appends one record ``{part: seconds, ..., "total": seconds}`` to
``records``. The hooks cost a few microseconds per module call, so a step timed with the
breakdown attached is a little slower than without; ``detach`` removes every hook and wrapper.
On a GPU the parts would need synchronising; the breakdown is meant for the CPU backend.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

PARTS = ("prepare", "attention", "mlp", "lm_head", "other")
TIMED_PARTS = PARTS[:-1]


class StepBreakdown:
    """Per-part seconds of every forward pass of the runners it is attached to."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self.records: list[dict[str, float]] = []
        self._open: dict[str, float] | None = None
        self._handles: list = []
        self._wrapped: list[tuple[object, str]] = []

    def attach(self, runner) -> "StepBreakdown":
        """Time ``runner``'s forward passes from now on."""
        for layer in runner.model.layers:
            self._hook(layer.self_attn, "attention")
            self._hook(layer.mlp, "mlp")
        self._wrap(runner.model, "logits", "lm_head")
        self._wrap(runner, "prepare", "prepare")
        self._wrap_pass(runner)
        return self

    def detach(self) -> None:
        """Remove every hook and wrapper (the runner runs untimed again)."""
        for handle in self._handles:
            handle.remove()
        for obj, name in self._wrapped:
            delattr(obj, name)   # the class's method shows through again
        self._handles, self._wrapped = [], []

    def add(self, part: str, seconds: float) -> None:
        """Charge ``seconds`` to ``part`` of the forward pass in progress (outside one: none)."""
        if self._open is not None:
            self._open[part] += seconds

    def begin(self) -> None:
        self._open = dict.fromkeys(TIMED_PARTS, 0.0)

    def end(self, total: float) -> dict[str, float]:
        """Close the forward pass that took ``total`` seconds; returns its record."""
        record = dict(self._open or dict.fromkeys(TIMED_PARTS, 0.0))
        record["other"] = max(total - sum(record.values()), 0.0)
        record["total"] = total
        self.records.append(record)
        self._open = None
        return record

    # --- instrumentation ------------------------------------------------------------------
    def _hook(self, module, part: str) -> None:
        starts: list[float] = []
        self._handles.append(module.register_forward_pre_hook(
            lambda _m, _args: starts.append(self.now())))
        self._handles.append(module.register_forward_hook(
            lambda _m, _args, _out: self.add(part, self.now() - starts.pop())))

    def _wrap(self, obj, name: str, part: str) -> None:
        inner = getattr(obj, name)

        def timed(*args, **kwargs):
            start = self.now()
            out = inner(*args, **kwargs)
            self.add(part, self.now() - start)
            return out
        setattr(obj, name, timed)
        self._wrapped.append((obj, name))

    def _wrap_pass(self, runner) -> None:
        inner = runner.greedy

        def timed_pass(batch):
            self.begin()
            start = self.now()
            out = inner(batch)
            self.end(self.now() - start)
            return out
        runner.greedy = timed_pass
        self._wrapped.append((runner, "greedy"))


def mean_record(records: list[dict[str, float]]) -> dict[str, float]:
    """Part by part mean of some forward passes (one step run ``repeats`` times); zeros for
    none (a step of block copies only)."""
    keys = PARTS + ("total",)
    if not records:
        return dict.fromkeys(keys, 0.0)
    return {k: sum(r[k] for r in records) / len(records) for k in keys}


def part_table(steps: dict) -> dict:
    """``{part: {mean_s, share, step_median_abs_rel_diff, total_signed_rel_diff}}`` from a
    report's ``steps`` (the last two only with ``replayed_parts``)."""
    parts, again = steps["parts"], steps.get("replayed_parts")
    total = float(np.sum(parts["total"])) or 1.0
    out = {}
    for part, values in parts.items():
        a = np.asarray(values, dtype=float)
        row = {"mean_s": float(a.mean()) if a.size else 0.0, "share": float(a.sum()) / total}
        if again is not None:
            b = np.asarray(again[part], dtype=float)
            timed = a > 0
            row["step_median_abs_rel_diff"] = (float(np.median(np.abs(b[timed] / a[timed] - 1)))
                                               if timed.any() else None)
            row["total_signed_rel_diff"] = float(b.sum() / a.sum() - 1) if a.sum() else None
        out[part] = row
    return out
