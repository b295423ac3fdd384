"""The model-shape keys ``summary.json`` adds for every run: KV bytes per token and the layer
groups (``kv``), total and activated parameters (``model``)."""

from __future__ import annotations

from kvsim.sim.perf.kv_layout import kv_layout
from kvsim.sim.perf.models import resolve_model


def kv_extra(cfg, dep) -> dict:
    """``kv.bytes_per_token`` (all layers, one full-attention token, whole model),
    ``kv.bytes_per_token_per_gpu`` and ``kv.groups`` (vLLM's KV cache groups, per GPU)."""
    model = resolve_model(cfg.model)
    layout = dep.layout or kv_layout(model, cfg.tp, cfg.block_size, cfg.dtype)
    return {"bytes_per_token": model.kv_bytes_per_token(cfg.dtype),
            "bytes_per_token_per_gpu": layout.bytes_per_token,
            "bytes_per_block_per_gpu": layout.bytes_per_block,
            "groups": layout.describe()}


def model_info(cfg) -> dict:
    """``model``: name, family, parameters (total, activated per token), MoE/MLA shape."""
    m = resolve_model(cfg.model)
    out = {"name": m.name, "family": m.family, "num_layers": m.num_layers,
           "num_params": m.num_params, "active_params": m.active_params,
           "attention": "mla" if m.is_mla else "mha" if m.num_kv_heads == m.num_heads else "gqa",
           "max_model_len": m.max_model_len, "weight_dtype": m.weight_dtype}
    if m.is_moe:
        out["moe"] = {"num_experts": m.num_experts, "experts_per_token": m.experts_per_token,
                      "num_moe_layers": m.num_moe_layers,
                      "shared_expert_intermediate_size": m.shared_expert_intermediate_size}
    return out
