"""The LM head on the CPU: the faster of two GEMM layouts, chosen per row count.

With a large vocabulary the head is the biggest matrix of a small model, and CPU BLAS is
erratic on few rows: measured with torch 2.13 on an AMD EPYC host, one thread, vocab 32000 x
hidden 256, ``x @ W.T`` (``F.linear``) took 4.8 ms for 1 row and 14 ms for 3 rows but 8 ms for 8
rows; ``x @ Wt`` (a contiguous transpose) 1.9 / 4.9 / 5.9 ms; ``(W @ x.T).T`` 4.8 / 2.4 / 4.2 ms.
Step time should grow smoothly with the batch (the cost model is linear in it), so
:meth:`CpuHead.tune` times ``x @ Wt`` against ``(W @ x.T).T`` for every row count up to
:data:`TUNED_ROWS` once, and each call uses the faster (``x @ Wt`` when untuned). Both give the
same logits up to float summation order. Even so the head's time is irregular in the row count
(a fitted profile measures it per row count: ``kvsim.sim.perf.profile.Fitted.per_batch_s``), and the
choice can differ between processes when both layouts are close, so ``kvsim profile`` records
the choices (:meth:`CpuHead.layouts`) and ``kvsim validate`` reuses them
(:meth:`CpuHead.set_layouts`).
"""

from __future__ import annotations

import statistics
import time
from typing import Iterable

import torch

TUNED_ROWS = 32


class CpuHead:
    """Logits ``x @ weight.T`` for a fixed ``[vocab, hidden]`` weight on the CPU."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.version = weight._version
        self.weight_t = weight.t().contiguous()
        self.row_major: dict[int, bool] = {}   # rows -> use (W @ x.T).T

    def matches(self, weight: torch.Tensor) -> bool:
        """Still valid for ``weight`` (same tensor, unchanged, same dtype)?"""
        return (weight is self.weight and weight._version == self.version
                and weight.dtype == self.weight_t.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.row_major.get(x.shape[0], False):
            return (self.weight @ x.t()).t()
        return x @ self.weight_t

    def layouts(self) -> dict[int, bool]:
        """The layout chosen per row count (``True``: ``(W @ x.T).T``)."""
        return dict(self.row_major)

    def set_layouts(self, layouts: dict) -> None:
        """Use ``layouts`` (as :meth:`layouts` returns, keys may be strings) instead of tuning."""
        self.row_major = {int(k): bool(v) for k, v in layouts.items()}

    @torch.inference_mode()
    def tune(self, max_rows: int = TUNED_ROWS, repeats: int = 5,
             row_counts: Iterable[int] | None = None) -> dict[int, bool]:
        """Time both layouts for 1 .. ``max_rows`` rows (or the given ``row_counts``;
        interleaved, median of ``repeats``) and remember the faster; returns the choices."""
        hidden = self.weight.shape[1]
        for rows in range(1, max_rows + 1) if row_counts is None else row_counts:
            x = torch.randn(rows, hidden, dtype=self.weight.dtype)
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(repeats):
                for layout in (False, True):
                    self.row_major[rows] = layout
                    start = time.perf_counter()
                    self(x)
                    times[layout].append(time.perf_counter() - start)
            self.row_major[rows] = statistics.median(times[True]) < statistics.median(times[False])
        return dict(self.row_major)
