"""The per-layer GEMMs and memory-bound kernels of a decoder model, as the cost model prices
them: their weights and shapes on one of ``tp`` GPUs, a GEMM's time by its shape on a measured
roofline, and the bytes each elementwise kernel moves per token."""

from __future__ import annotations

import numpy as np

from kvsim.sim.perf.gpus import GpuSpec
from kvsim.sim.perf.models import ModelSpec, dtype_bytes
from kvsim.sim.perf.profile import Roofline


def gemm_params(model: ModelSpec) -> dict[str, int]:
    """Weights of each GEMM of one layer, keyed by Vidur's operator names."""
    h, i = model.hidden_size, model.intermediate_size
    return {"attn_pre_proj": h * (model.q_size + 2 * model.kv_size),
            "attn_post_proj": model.q_size * h,
            "mlp_up_proj": h * i * (2 if model.gated_mlp else 1),
            "mlp_down_proj": i * h}


def gemm_shapes(model: ModelSpec, tp) -> dict[str, tuple]:
    """``(N, K)`` of each GEMM of one layer on one of ``tp`` GPUs (``tokens x K`` activations
    times a ``K x N`` weight shard), keyed like :func:`gemm_params`; ``tp`` may be an array."""
    h, i = model.hidden_size, model.intermediate_size
    return {"attn_pre_proj": ((model.q_size + 2 * model.kv_size) / tp, h),
            "attn_post_proj": (h, model.q_size / tp),
            "mlp_up_proj": (i * (2 if model.gated_mlp else 1) / tp, h),
            "mlp_down_proj": (h, i / tp)}


def smooth_max(a, b, q: float, maximum=np.maximum):
    """``(a^q + b^q)^(1/q)``, a rounded maximum of ``a, b >= 0``; ``maximum(a, b)`` when q is 0."""
    if not q:
        return maximum(a, b)
    return (a ** q + b ** q) ** (1.0 / q)


def gemm_time(g: Roofline, gpu: GpuSpec, tokens, n, k, weight_bytes: float = 2.0,
              act_bytes: float = 2.0, ceil=np.ceil, minimum=np.minimum, maximum=np.maximum):
    """Seconds of one ``tokens x k`` by ``k x n`` GEMM by its shape (a profile with
    :attr:`Roofline.shaped`; numpy arrays and scalars alike): the soft maximum of

    - memory: ``memory_latency + (weights + activations in and out) / (bw * memory_eff)``;
    - compute: ``latency +`` the fastest tile shape's ``waves * tile FLOPs / (SM peak * eff)``,
      with ``ceil(tokens / tile_m) * ceil(n / tile_n)`` tiles over ``num_sms`` SMs and
      ``waves = tiles / sms + wave_tail * (ceil(tiles / sms) - tiles / sms)`` (the last wave's
      idle SMs, paid in part).

    ``ceil``, ``minimum`` and ``maximum`` may be python's (``math.ceil``, ``min``, ``max``) for
    python numbers: the same IEEE operations, three times faster than numpy's scalars."""
    mem = g.memory_latency_s + (n * k * weight_bytes + tokens * (n + k) * act_bytes) / (
        gpu.hbm_bandwidth_bytes_per_s * g.memory_efficiency)
    sm_flops, comp = gpu.dense_bf16_flops / g.num_sms, None
    for tile_m, tile_n, eff in g.tiles:
        tiles = ceil(tokens / tile_m) * ceil(n / tile_n) / g.num_sms
        waves = tiles + g.wave_tail * (ceil(tiles) - tiles)
        t = waves * 2.0 * tile_m * tile_n * k / (sm_flops * eff)
        comp = t if comp is None else minimum(comp, t)
    return smooth_max(mem, g.latency_s + comp, g.smoothness, maximum)


def elementwise_bytes(model: ModelSpec, tp: int, dtype: str = "bf16") -> dict[str, float]:
    """Bytes read + written per token per layer on one GPU by each memory-bound kernel."""
    b, h = dtype_bytes(dtype), model.hidden_size
    act_in = (2 if model.gated_mlp else 1) * model.intermediate_size
    return {"input_layernorm": 2.0 * h * b, "post_attention_layernorm": 2.0 * h * b,
            "attn_rope": 2.0 * (model.q_size + model.kv_size) * b / tp,
            "mlp_act": (act_in + model.intermediate_size) * b / tp,
            "add": 3.0 * h * b}
