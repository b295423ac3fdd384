"""Cost-model terms of mixture-of-experts, MLA and windowed-attention models.

These are MODELS (a roofline with an assumption), not measurements; none is calibrated yet:

* **Expert weights read per step.** With uniform, independent top-``k`` routing over ``E``
  experts, a step of ``B`` tokens touches ``E * (1 - (1 - k/E)^B)`` distinct experts on average
  (each expert is missed by one token with probability ``1 - k/E``). Each MoE layer reads those
  experts' weights; attention, dense MLPs (DeepSeek's first layers), shared experts and routers
  are read every step. Real routers are skewed, so more tokens share experts than this says:
  the bytes are an upper estimate for a given B.
* **Linear FLOPs** per token are ``2 * activated weights`` (top-k routed + shared experts).
* **Expert parallelism** (vLLM's ``--enable-expert-parallel`` over the ``tp`` GPUs): each GPU
  holds ``E / tp`` whole experts instead of a ``1/tp`` slice of each; on average it reads the
  same bytes per step (the touched experts divided by ``tp``), so the mean cost is the same.
  The slowest GPU's extra load under skewed routing, and the all-to-all replacing the
  all-reduce, are not modelled.
* **MLA attention** (DeepSeek): the cache holds the latent (``kv_lora_rank + qk_rope_head_dim``
  per token per layer, every TP rank reads all of it); attention runs on the latent with the
  absorbed projections as vLLM's decode kernels do: ``2 * heads * (2 * kv_lora_rank +
  qk_rope_head_dim)`` FLOPs per (query, cached token) pair per layer. Prefill in vLLM uses the
  decompressed path (``2 * heads * (qk_head_dim + v_head_dim)`` per pair), so long prefills are
  charged too many attention FLOPs (about 3.4x for DeepSeek-V3, attention part only).
* **Sliding-window / chunked-local layers** read at most the window (chunk) per request, so
  only full-attention layers scale with the context; each windowed layer is charged the whole
  window per running request per step (an upper estimate), at the attention bandwidth.
"""

from __future__ import annotations

import numpy as np

from kvsim.cache.attention_groups import CHUNKED, FULL, SLIDING
from kvsim.sim.perf.model_shape import mlp_params
from kvsim.sim.perf.models import ModelSpec


def expected_experts(num_experts: int, top_k: int, tokens):
    """Mean distinct experts ``tokens`` tokens touch with uniform top-``k`` of ``E`` routing.

    >>> float(expected_experts(8, 2, 1)), round(float(expected_experts(8, 2, 4)), 4)
    (2.0, 5.4688)
    """
    keep = 1.0 - top_k / num_experts
    return num_experts * (1.0 - np.power(keep, tokens))


def routed_expert_params(m: ModelSpec) -> int:
    """Weights of all routed experts of all MoE layers."""
    return m.num_moe_layers * m.num_experts * mlp_params(m, m.moe_intermediate_size)


def gemm_weights(m: ModelSpec) -> tuple[int, int, int]:
    """``(weights read every step, weights one expert has over all MoE layers, activated
    weights per token)``, all layers, whole model (divide by ``tp`` per GPU)."""
    routed = routed_expert_params(m) if m.is_moe else 0
    per_expert = m.num_moe_layers * mlp_params(m, m.moe_intermediate_size) if m.is_moe else 0
    return m.linear_params_total - routed, per_expert, m.active_linear_params_total


def attention_flops_per_unit(m: ModelSpec, tp: int) -> float:
    """Attention FLOPs per unit ``q * (2c + q + 1)`` (half a query-key pair) per GPU, summed
    over the layers whose attention grows with the context (full attention)."""
    layers = full_attention_layers(m)
    if m.is_mla:
        return layers * m.num_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim) / tp
    return layers * 2 * m.num_heads * m.head_dim / tp


def full_attention_layers(m: ModelSpec) -> int:
    return m.layer_kinds.count(FULL) if m.layer_kinds else m.num_layers


def windowed_bytes_per_request(m: ModelSpec, tp: int, dtype: str) -> float:
    """KV bytes the sliding-window and chunked layers read per running request per step (per
    GPU): the whole window or chunk, an upper estimate."""
    per_layer = m.kv_bytes_per_token_per_layer_per_gpu(tp, dtype)
    kinds = m.layer_kinds
    return per_layer * (kinds.count(SLIDING) * m.sliding_window
                        + kinds.count(CHUNKED) * m.attention_chunk_size)


def is_special(m: ModelSpec) -> bool:
    """Whether :func:`adjust` changes anything for ``m`` (a dense full-attention model: no)."""
    return m.is_moe or m.is_mla or bool(m.layer_kinds)
