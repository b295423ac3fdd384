"""Roofline cost model: how long one engine step (a :class:`StepPlan`) takes on a TP group.

Per step, on each of ``tp`` GPUs (weights, heads and KV split ``tp`` ways)::

    step_overhead + per_seq_overhead * seqs
    + layers * (4 * gemm_latency + max(linear FLOPs(rows) / (peak * eff_c), weight bytes / (bw * eff_m)))
    + LM head (a GEMM of ``seqs`` rows, same roofline)
    + layers * sum_op max(min_time_op + row_op, tokens * bytes_op / (bw * eff_op))  # norms, rope, ...
    + layers * (attn_latency + max(attn FLOPs / (peak * eff_p), KV bytes read / (bw * eff_d)))
    + layers * 2 * (ar_latency + tokens * hidden * bytes * 2(tp-1)/tp / bus_bw)   # tp > 1
    + block transfers: host<->device bytes / (pcie * eff), compaction 2 * bytes / (bw * eff)

Attention of a request with ``q`` new tokens on ``c`` cached ones costs
``4 * heads * head_dim * q * (c + (q + 1) / 2)`` FLOPs per layer (causal) and reads ``c + q``
tokens of KV per layer; the step's attention is a roofline over the batch (one varlen kernel):
prefill-heavy steps are bound by FLOPs, decode steps by KV bytes read. A step depends on requests
only through four sums (tokens, requests, KV tokens ``c + q``, attention units
``q * (2c + q + 1)``), which is what lets :meth:`CostModel.decode_durations` reproduce
:meth:`CostModel.step_duration` bit for bit.

With a *fitted* profile (``kvsim profile``, see :class:`kvsim.sim.perf.profile.Fitted`) the roofline
is replaced by measured linear coefficients over the same four sums (the roofline terms are
zero and ``kv_tok_s``/``attn_unit_s`` carry the attention), plus an optional measured table of
seconds per batch size (``per_batch_s``: costs irregular in the number of requests, such as a CPU
LM head), and transfers by measured copy times.

``rows`` (:meth:`kvsim.sim.perf.profile.Roofline.rows`) is the profile's measured compute-efficiency
curve over tokens per step and its wave quantization: the rows whose FLOPs a GEMM over the
step's tokens costs (more than the tokens near the roofline's ridge, where a hard corner was
~20% too fast); ``row_op`` is a kernel's per-row time (bytes of one token's row times
``row_s_per_byte``), its floor at small batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from kvsim.cache.step_plan import COMPACT, DEVICE_TO_HOST, HOST_TO_DEVICE, StepPlan
from kvsim.errors import ConfigError
from kvsim.sim.serving.executor import Executor
from kvsim.sim.perf.gemm import elementwise_bytes, gemm_shapes, gemm_time, smooth_max
from kvsim.sim.perf.gpus import GpuSpec, resolve_gpu
from kvsim.sim.perf.models import (ModelSpec, dtype_bytes, list_models, resolve_model,
                                   weight_dtype_bytes)
from kvsim.sim.perf.profile import ELEMENTWISE_OPS, Profile, Roofline, load_profile
from kvsim.sim.perf import moe


@dataclass(frozen=True)
class _Coeffs:
    """Per-step constants (seconds, or seconds per unit), all already summed over layers."""

    fixed_s: float
    per_seq_s: float
    gemm_flop_s: float      # per token
    gemm_byte_s: float      # per step (weights read once)
    head_flop_s: float      # per sequence
    head_byte_s: float
    elem_min_s: tuple[float, ...]
    elem_tok_s: tuple[float, ...]
    attn_flop_s: float      # per unit of q * (2c + q + 1)
    attn_byte_s: float      # per KV token read (c + q)
    ar_tok_s: float         # per token
    kv_tok_s: float = 0.0   # additive, per KV token read (fitted profiles only)
    attn_unit_s: float = 0.0  # additive, per attention unit (fitted profiles only)
    batch_s: tuple[float, ...] = ()  # additive, seconds for 1, 2, ... requests (fitted only)
    batch_slope_s: float = 0.0       # per request beyond the batch_s table
    moe_expert_s: float = 0.0   # per distinct routed expert touched (all MoE layers), per step
    moe_experts: int = 0        # routed experts E (0: not a mixture of experts)
    moe_top_k: int = 0
    rows: object = None     # GEMM rows per token count (the profile's Roofline.rows)
    gemm_s: object = None   # shaped profiles: seconds of all layers' GEMMs per token count
    head_s: object = None   # shaped profiles: seconds of the LM head per request count
    elem_q: tuple[float, ...] = ()   # soft-maximum exponent per kernel (0: hard maximum)


def batch_time(table, slope: float, seqs):
    """A fitted profile's ``per_batch_s`` at ``seqs`` requests (a python or numpy scalar: a
    step's request count): the table's entry, beyond it the last one plus ``slope`` per
    request. ``table`` must not be empty."""
    n = len(table)
    i = int(seqs)
    if i <= n:
        return table[max(i, 1) - 1]
    return table[-1] + (seqs - n) * slope


def _time_without_attention(c: _Coeffs, tokens, seqs, maximum=np.maximum):
    """The forward-pass terms that do not read the KV cache (summed first; then
    :func:`_with_attention`). One expression for python floats (``maximum=max``: the fast
    scalar path) and numpy arrays alike: both do the same IEEE operations in the same order,
    so they agree bit for bit."""
    t = c.fixed_s + seqs * c.per_seq_s
    if c.batch_s:
        t = t + batch_time(c.batch_s, c.batch_slope_s, seqs)
    gemm_bytes = c.gemm_byte_s
    if c.moe_experts:
        gemm_bytes = gemm_bytes + c.moe_expert_s * moe.expected_experts(
            c.moe_experts, c.moe_top_k, tokens)
    if c.gemm_s is not None:
        t = t + c.gemm_s(tokens) + c.head_s(seqs)
    else:
        t = t + maximum(c.rows(tokens) * c.gemm_flop_s, gemm_bytes)
        t = t + maximum(c.rows(seqs) * c.head_flop_s, c.head_byte_s)
    for floor, per_token, q in zip(c.elem_min_s, c.elem_tok_s, c.elem_q or (0.0,) * len(c.elem_min_s)):
        t = t + smooth_max(floor, tokens * per_token, q, maximum)
    return t + tokens * c.ar_tok_s


def _with_attention(c: _Coeffs, t, kv_tokens, attn_units, maximum=np.maximum):
    """``t`` (:func:`_time_without_attention`) plus the attention and KV terms, in order."""
    t = t + maximum(attn_units * c.attn_flop_s, kv_tokens * c.attn_byte_s)
    return t + kv_tokens * c.kv_tok_s + attn_units * c.attn_unit_s


def _decode_step(c: _Coeffs, base: float, kv_tokens: int) -> float:
    """A decode-only step's time on python floats: ``base`` (its time without attention)
    with ``kv_tokens`` read and ``2 * kv_tokens`` attention units (one new token each)."""
    x = float(kv_tokens)
    return _with_attention(c, base, x, 2 * x, max)


def _decode_slope(c: _Coeffs) -> float:
    """Seconds a decode step adds per KV token read, where :func:`_decode_step` is
    ``base + kv_tokens * slope`` bit for bit (else 0.0): without the fitted additive terms,
    ``max(2x * a, x * b)`` is ``x * max(2a, b)`` exactly (doubling is exact and rounding
    is monotone), and adding 0.0 changes nothing."""
    return 0.0 if c.kv_tok_s or c.attn_unit_s else max(2 * c.attn_flop_s, c.attn_byte_s)


def _other_shape(fitted: dict, shape: dict, name: str, tp: int, measured: str | None) -> str:
    """Why a fitted profile does not fit this run: the shape and tp it was measured at, and
    the catalog model of that shape, if one is (else the config.json it names, ``measured``)."""
    differ = [f"{k} {fitted[k]:,} (not {shape[k]:,})" for k in fitted if fitted[k] != shape[k]]
    differ += [f"tp 1 (not {tp})"] * (tp != 1)
    same = [m for m in list_models()
            if {k: getattr(resolve_model(m), k) for k in fitted} == fitted]
    use = (f"run it with --model {' or '.join(same)}" if same else
           f"run it with --model {measured}, the model it was measured on" if measured else
           "give --model the config.json of the model it was measured on")
    return (f"the fitted profile was measured on another model than {name}: "
            f"{', '.join(differ)}; {use}" + (" and --tp 1" if tp != 1 else ""))


class CostModel(Executor):
    """Predicts step durations for ``model`` on a group of ``tp`` ``gpu``\\ s."""

    supports_decode_runs = True

    def __init__(self, model: ModelSpec | str, gpu: GpuSpec | str, tp: int = 1,
                 block_size: int = 16, profile: None | str | Path | dict = None,
                 dtype: str = "bf16", kv_dtype: str | None = None,
                 weight_dtype: str | None = None):
        self.model = model if isinstance(model, ModelSpec) else resolve_model(model)
        self.gpu = resolve_gpu(gpu)
        self.tp, self.block_size, self.dtype = tp, block_size, dtype
        self.weight_dtype = weight_dtype or self.model.weight_dtype or dtype
        self.profile: Profile = load_profile(self.gpu.name, profile)
        self._profile_file = str(profile) if isinstance(profile, (str, Path)) else None
        kv_token = self.model.kv_bytes_per_token_per_gpu(tp, kv_dtype or dtype)
        self.block_bytes = block_size * kv_token
        fitted = self.profile.fitted
        self._c = self._fitted_coefficients(fitted) if fitted else self._coefficients(kv_token)
        # a step's time without attention by (tokens, requests): steps repeat their sizes
        self._bases: dict[tuple[float, float], float] = {}
        self._decode_slope = _decode_slope(self._c)

    # --- public --------------------------------------------------------------------------------
    def step_duration(self, plan: StepPlan) -> float:
        """Seconds the step takes: forward pass (if any tokens) plus its block transfers."""
        t = 0.0
        if plan.scheduled:
            tokens, seqs, kv_tokens, attn_units = map(float, self.step_sums(plan))
            t = float(_with_attention(self._c, self._base(tokens, seqs), kv_tokens, attn_units,
                                      max))
        elif plan.transfers:
            t = self._c.fixed_s if self.profile.fitted else self.profile.step_overhead_s
        if plan.transfers:
            t = t + self.transfer_time(plan)
        return t

    def decode_durations(self, num_seqs: int, total_context_tokens: int,
                         num_steps: int, prefill: tuple[int, int] | None = None) -> np.ndarray:
        """Durations of ``num_steps`` decode-only steps of ``num_seqs`` requests whose summed
        computed tokens start at ``total_context_tokens`` and grow by ``num_seqs`` per step;
        equal (``==``) to :meth:`step_duration` of the corresponding plans. ``prefill``:
        ``(num_computed, num_new)`` of one more request that computes ``num_new`` prompt
        tokens in each step, on top of ``num_computed`` before the first (``num_seqs`` may
        then be 0)."""
        if num_seqs < (0 if prefill else 1) or num_steps < 0:
            raise ValueError(f"need num_seqs >= 1 (0 with a prefill) and num_steps >= 0, got "
                             f"{num_seqs}, {num_steps}")
        if prefill:
            return self._durations_with_prefill(num_seqs, total_context_tokens, num_steps,
                                                *prefill)
        base = self._base(float(num_seqs), float(num_seqs))   # the same in every step
        if num_steps == 1:  # (the scalar path, the same operations)
            return np.array([_decode_step(self._c, base, total_context_tokens + num_seqs)])
        kv = np.arange(num_steps, dtype=np.float64)
        kv *= num_seqs
        kv += total_context_tokens + num_seqs
        out = _with_attention(self._c, base, kv, 2 * kv)
        return np.asarray(out, dtype=np.float64)

    def steps_until(self, stretches, now: float, horizon: float) -> tuple:
        """:meth:`Executor.steps_until` on python floats, one step at a time (the same
        operations as :meth:`decode_durations`, so the same values): a run usually meets the
        next arrival within a few dozen steps, where numpy's calls cost more than the steps."""
        durations, before, end = [], now, now
        append, slope = durations.append, self._decode_slope
        for num_steps, num_seqs, context, prompt in stretches:
            if prompt:
                for duration in ((self._prefill_step(num_seqs, context, 0, prompt),)
                                 if num_steps == 1 else   # (a run's admitting step)
                                 self._durations_with_prefill(num_seqs, context, num_steps, 0,
                                                              prompt).tolist()):
                    append(duration)
                    before, end = end, end + duration
                    if end >= horizon:
                        return durations, before, end, True
                continue
            base = self._base(float(num_seqs), float(num_seqs))
            kv, grow = float(context + num_seqs), float(num_seqs)
            for _ in range(num_steps):
                duration = base + kv * slope if slope else _decode_step(self._c, base, kv)
                append(duration)
                before, end = end, end + duration
                if end >= horizon:
                    return durations, before, end, True
                kv += grow
        return durations, before, end, False

    def _durations_with_prefill(self, num_seqs: int, total_context_tokens: int,
                                num_steps: int, computed: int, new: int) -> np.ndarray:
        """:meth:`decode_durations` with a prefill of ``new`` tokens a step beside: its sums
        ``c + q`` and ``q * (2c + q + 1)``, ``c`` growing by ``q`` per step (exact integers)."""
        if num_steps == 1:  # (a run's admitting step: the scalar path, the same operations)
            return np.array([self._prefill_step(num_seqs, total_context_tokens, computed, new)])
        base, kv, units = self._prefill_sums(num_seqs, total_context_tokens, computed, new)
        step = np.arange(num_steps, dtype=np.int64)
        kv = step * (num_seqs + new) + kv
        units = step * (2 * num_seqs + 2 * new * new) + units
        out = _with_attention(self._c, base, kv.astype(np.float64), units.astype(np.float64))
        return np.asarray(out, dtype=np.float64)

    def _prefill_step(self, num_seqs: int, total_context_tokens: int, computed: int,
                      new: int) -> float:
        """The first step of :meth:`_durations_with_prefill`, on python floats."""
        base, kv, units = self._prefill_sums(num_seqs, total_context_tokens, computed, new)
        return _with_attention(self._c, base, float(kv), float(units), max)

    def _prefill_sums(self, num_seqs: int, total_context_tokens: int, computed: int,
                      new: int) -> tuple[float, int, int]:
        """The first step's time without attention, KV tokens and attention units."""
        base = self._base(float(num_seqs + new), float(num_seqs + 1))
        kv = total_context_tokens + num_seqs + computed + new
        return base, kv, 2 * (total_context_tokens + num_seqs) + new * (2 * computed + new + 1)

    def _base(self, tokens: float, seqs: float) -> float:
        """:func:`_time_without_attention` of a step of ``tokens`` tokens over ``seqs``
        requests, memoised (forgotten past 65,536 sizes)."""
        base = self._bases.get((tokens, seqs))
        if base is None:
            if len(self._bases) >= 65536:
                self._bases.clear()
            base = self._bases[tokens, seqs] = _time_without_attention(self._c, tokens, seqs, max)
        return base

    @staticmethod
    def step_sums(plan: StepPlan) -> tuple[np.float64, np.float64, np.float64, np.float64]:
        """(tokens, requests, KV tokens read ``sum c+q``, attention units ``sum q*(2c+q+1)``)."""
        tokens = kv = units = 0
        for s in plan.scheduled:
            q, c = s.num_new_tokens, s.num_computed_tokens
            tokens += q
            kv += c + q
            units += q * (2 * c + q + 1)
        f = np.float64
        return f(tokens), f(len(plan.scheduled)), f(kv), f(units)

    def transfer_time(self, plan: StepPlan) -> float:
        """Seconds of the plan's block copies: host<->device by PCIe, compaction by HBM."""
        host = sum(plan.num_transfer_blocks(k) for k in HOST_TO_DEVICE + DEVICE_TO_HOST)
        moved = plan.num_transfer_blocks(COMPACT)
        f = self.profile.fitted
        if f is not None:
            return (f.copy_call_s * sum(1 for t in plan.transfers if t.pairs)
                    + self.block_bytes * (host * f.host_copy_s_per_byte
                                          + moved * f.device_copy_s_per_byte))
        pcie = self.gpu.pcie_host_bandwidth_bytes_per_s * self.profile.pcie_efficiency
        hbm = self.gpu.hbm_bandwidth_bytes_per_s * self.profile.copy_memory_efficiency
        return host * self.block_bytes / pcie + moved * 2 * self.block_bytes / hbm

    # --- constants -----------------------------------------------------------------------------
    def _coefficients(self, kv_token: int) -> _Coeffs:
        m, g, p, tp, L = self.model, self.gpu, self.profile, self.tp, self.model.num_layers
        peak, bw, b = g.dense_bf16_flops, g.hbm_bandwidth_bytes_per_s, dtype_bytes(self.dtype)
        pc, pm = peak * p.gemm.compute_efficiency, bw * p.gemm.memory_efficiency
        layer_w = m.linear_params_per_layer / tp
        head_w = m.lm_head_params / tp
        ar_lat, ar_bytes = self._all_reduce_terms()
        elem = elementwise_bytes(m, tp, self.dtype)
        ops = [p.elementwise[op] for op in ELEMENTWISE_OPS]
        gemm_lat = 0.0 if p.gemm.shaped else p.gemm.latency_s   # shaped: inside gemm_time
        fixed = (p.step_overhead_s + L * (4 * gemm_lat + p.attn_latency_s + ar_lat) + gemm_lat)
        c = _Coeffs(
            fixed_s=fixed, per_seq_s=p.per_seq_overhead_s,
            gemm_flop_s=L * 2 * layer_w / pc,
            gemm_byte_s=(L * layer_w * weight_dtype_bytes(self.weight_dtype)
                         + self._kept_extra_bytes()) / pm,
            head_flop_s=2 * head_w / pc, head_byte_s=head_w * b / pm,
            elem_min_s=tuple(L * (e.min_time_s + elem[op] * e.row_s_per_byte)
                             for op, e in zip(ELEMENTWISE_OPS, ops)),
            elem_tok_s=tuple(L * elem[op] / (bw * e.memory_efficiency)
                             for op, e in zip(ELEMENTWISE_OPS, ops)),
            attn_flop_s=L * 2 * m.num_heads * m.head_dim / tp / (peak * p.attn_prefill_compute_efficiency),
            attn_byte_s=kv_token / (bw * p.attn_decode_memory_efficiency),
            ar_tok_s=ar_bytes * L * m.hidden_size * b,
            rows=p.gemm.rows, elem_q=tuple(e.smoothness for e in ops))
        if moe.is_special(m):
            return self._architecture_terms(replace(c, fixed_s=c.fixed_s + (
                (4 * L + 1) * p.gemm.latency_s if p.gemm.shaped else 0.0)), kv_token)
        return replace(c, **self._shaped_gemms()) if p.gemm.shaped else c

    def _kept_extra_bytes(self) -> float:
        """Bytes per GPU that the weights a quantized checkpoint keeps 16-bit
        (``ModelSpec.kept_16bit``) add to one read of the layers' weights."""
        wb, kept = weight_dtype_bytes(self.weight_dtype), self.model.kept_linear_params
        return kept / self.tp * (2 - wb) if kept and wb < 2 else 0.0

    def _shaped_gemms(self) -> dict:
        """``gemm_s``/``head_s`` of a shaped profile: each GEMM by its own matrix shape
        (:func:`gemm_time`), memoised per token count (steps repeat their sizes)."""
        m, g, tp, L = self.model, self.gpu, self.tp, self.model.num_layers
        p, wb, ab = self.profile.gemm, weight_dtype_bytes(self.weight_dtype), dtype_bytes(self.dtype)
        kept = 2.0 if "attention" in m.kept_16bit and wb < 2 else wb
        shapes = tuple((n, k, kept if name.startswith("attn") else wb)
                       for name, (n, k) in gemm_shapes(m, tp).items())

        scalar = dict(ceil=math.ceil, minimum=min, maximum=max)

        @lru_cache(maxsize=16384)
        def layers(tokens: float) -> float:
            return float(L * sum(gemm_time(p, g, tokens, n, k, b, ab, **scalar)
                                 for n, k, b in shapes))

        @lru_cache(maxsize=4096)
        def head(seqs: float) -> float:
            return float(gemm_time(p, g, seqs, m.lm_head_params / m.hidden_size / tp,
                                   m.hidden_size, ab, ab, **scalar))
        return {"gemm_s": lambda tokens: layers(float(tokens)),
                "head_s": lambda seqs: head(float(seqs))}

    def _architecture_terms(self, c: _Coeffs, kv_token: int) -> _Coeffs:
        """MoE, MLA and windowed-attention terms (see :mod:`kvsim.sim.perf.moe`: models, not
        measurements)."""
        m, g, p, tp = self.model, self.gpu, self.profile, self.tp
        pc = g.dense_bf16_flops * p.gemm.compute_efficiency
        pm = g.hbm_bandwidth_bytes_per_s * p.gemm.memory_efficiency
        wb = weight_dtype_bytes(self.weight_dtype)
        always, per_expert, active = moe.gemm_weights(m)
        attn_bw = g.hbm_bandwidth_bytes_per_s * p.attn_decode_memory_efficiency
        full_share = moe.full_attention_layers(m) / m.num_layers
        window_s = moe.windowed_bytes_per_request(m, tp, self.dtype) / attn_bw
        return replace(
            c, gemm_flop_s=2 * active / tp / pc,
            gemm_byte_s=(always / tp * wb + self._kept_extra_bytes()) / pm,
            moe_expert_s=per_expert / tp * wb / pm, moe_experts=m.num_experts if m.is_moe else 0,
            moe_top_k=m.experts_per_token, per_seq_s=c.per_seq_s + window_s,
            attn_flop_s=moe.attention_flops_per_unit(m, tp) / (
                g.dense_bf16_flops * p.attn_prefill_compute_efficiency),
            attn_byte_s=kv_token * full_share / attn_bw)

    def _fitted_coefficients(self, f) -> _Coeffs:
        """A fitted profile's measured coefficients (linear terms only; tp must be 1)."""
        shape = {k: getattr(self.model, k) for k in f.model_shape}
        if shape != f.model_shape or self.tp != 1:
            raise ConfigError(_other_shape(f.model_shape, shape, self.model.name, self.tp,
                                           self.profile.raw.get("sim_model")),
                              location=self._profile_file, field="profile")
        return _Coeffs(fixed_s=f.step_s, per_seq_s=f.per_seq_s, gemm_flop_s=f.per_token_s,
                       gemm_byte_s=0.0, head_flop_s=0.0, head_byte_s=0.0, elem_min_s=(),
                       elem_tok_s=(), attn_flop_s=0.0, attn_byte_s=0.0, ar_tok_s=0.0,
                       kv_tok_s=f.per_kv_token_s, attn_unit_s=f.per_attn_unit_s,
                       batch_s=f.per_batch_s, batch_slope_s=f.per_batch_slope_s,
                       rows=Roofline(1.0, 1.0, 0.0).rows)

    def _all_reduce_terms(self) -> tuple[float, float]:
        """(latency per layer, seconds per all-reduced byte per layer) for two all-reduces."""
        if self.tp == 1:
            return 0.0, 0.0
        lat, bus = self.profile.all_reduce_params(self.tp, self.gpu.interconnect_bandwidth_bytes_per_s)
        ring = 2 * (self.tp - 1) / self.tp
        return 2 * lat, 2 * ring / bus
