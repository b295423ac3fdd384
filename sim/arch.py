"""Hugging Face ``config.json`` readers for the families beyond plain dense attention.

Qwen3 (dense and MoE), Qwen2-MoE, Mixtral, Mistral with a sliding window, DeepSeek-V2/V3/R1 (MLA,
shared + routed experts, dense first layers), gpt-oss (alternating sliding-window and full
attention, MoE), Gemma 3 (local/global layers) and Llama 4 (chunked local attention, MoE). A
multimodal config's ``text_config`` is read (the vision tower is not counted).

Each becomes a :class:`~kvsim.sim.models.ModelSpec`: the dense fields as for llama, plus
``layer_kinds`` (``full``/``sliding``/``chunked`` per layer, as vLLM's attention specs), MLA's
dimensions and the mixture-of-experts shape. :func:`linear_params` counts their weights.
"""

from __future__ import annotations

from pathlib import Path

from kvsim.errors import ConfigError
from kvsim.sim.models import ModelSpec, _llama_fields, _size

#: model_type -> the family name kvsim reports.
HF_FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "qwen2_moe": "qwen2_moe",
               "mixtral": "mixtral", "mistral": "mistral", "deepseek_v2": "deepseek",
               "deepseek_v3": "deepseek", "gpt_oss": "gpt_oss", "gemma3": "gemma3",
               "gemma3_text": "gemma3", "llama4": "llama4", "llama4_text": "llama4"}
_LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding",
                "chunked_attention": "chunked"}


def spec_from_hf(name: str, cfg: dict, location: str, aliases: tuple = ()) -> ModelSpec:
    """The :class:`ModelSpec` of Hugging Face config ``cfg`` (read from ``location``)."""
    cfg = _text_config(cfg)
    kind = str(cfg.get("model_type", "")).lower()
    if kind not in HF_FAMILIES:
        raise ConfigError(f"model_type '{cfg.get('model_type')}' is not supported "
                          f"(supported: {', '.join(HF_FAMILIES)})", location=location)
    where = Path(location)
    fields = _llama_fields(cfg, where)
    if kind.startswith("deepseek"):
        fields.update(_mla_fields(cfg, where, fields["num_heads"]))
    if kind.startswith("gemma"):
        fields["tied_embeddings"] = bool(cfg.get("tie_word_embeddings", True))
    fields.update(_attention_fields(cfg, kind, fields["num_layers"], where))
    fields.update(_moe_fields(cfg, kind, fields["num_layers"], where))
    return ModelSpec(name=name, family=HF_FAMILIES[kind], aliases=tuple(aliases), **fields)


def _text_config(cfg: dict) -> dict:
    text = cfg.get("text_config")
    return {**cfg, **text} if isinstance(text, dict) else cfg


# --- attention ----------------------------------------------------------------------------------
def _attention_fields(cfg: dict, kind: str, layers: int, path: Path) -> dict:
    kinds = _layer_kinds(cfg, kind, layers, path)
    if all(k == "full" for k in kinds):
        return {}
    out = {"layer_kinds": tuple(kinds)}
    if "sliding" in kinds:
        out["sliding_window"] = _need_pos(cfg, "sliding_window", path)
    if "chunked" in kinds:
        out["attention_chunk_size"] = _need_pos(cfg, "attention_chunk_size", path)
    return out


def _layer_kinds(cfg: dict, kind: str, layers: int, path: Path) -> list[str]:
    types = cfg.get("layer_types")
    if types is not None:
        return _explicit_kinds(types, layers, path)
    if kind.startswith("gemma3"):
        pattern = _size(cfg, "sliding_window_pattern", path, 6)
        return ["sliding" if (i + 1) % pattern else "full" for i in range(layers)]
    if kind.startswith("llama4") and cfg.get("attention_chunk_size") is not None:
        rope = cfg.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]
        if not isinstance(rope, list) or len(rope) != layers:
            raise ConfigError(f"expected a list of {layers} flags", location=str(path),
                              field="no_rope_layers")
        return ["chunked" if flag else "full" for flag in rope]
    if kind in ("mistral", "mixtral") and cfg.get("sliding_window") is not None:
        return ["sliding"] * layers
    return ["full"] * layers


def _explicit_kinds(types, layers: int, path: Path) -> list[str]:
    if not isinstance(types, list) or len(types) != layers:
        raise ConfigError(f"expected a list of {layers} layer types (one per layer)",
                          location=str(path), field="layer_types")
    unknown = sorted({str(t) for t in types} - set(_LAYER_TYPES))
    if unknown:
        raise ConfigError(f"unknown layer type {unknown[0]!r}; known: "
                          f"{', '.join(_LAYER_TYPES)}", location=str(path), field="layer_types")
    return [_LAYER_TYPES[t] for t in types]


def _mla_fields(cfg: dict, path: Path, heads: int) -> dict:
    rope, nope = _need_pos(cfg, "qk_rope_head_dim", path), _need_pos(cfg, "qk_nope_head_dim", path)
    return dict(kv_lora_rank=_need_pos(cfg, "kv_lora_rank", path),
                q_lora_rank=_size(cfg, "q_lora_rank", path, 0), qk_rope_head_dim=rope,
                qk_nope_head_dim=nope, v_head_dim=_need_pos(cfg, "v_head_dim", path),
                head_dim=rope + nope, num_kv_heads=heads)


# --- mixture of experts -------------------------------------------------------------------------
def _moe_fields(cfg: dict, kind: str, layers: int, path: Path) -> dict:
    if kind in ("mixtral", "gpt_oss"):
        k = _size(cfg, "experts_per_token", path) or _need_pos(cfg, "num_experts_per_tok", path)
        return _moe(cfg, path, "num_local_experts", k, cfg["intermediate_size"], 0, layers)
    if kind in ("qwen3_moe", "qwen2_moe"):
        step, dense = _size(cfg, "decoder_sparse_step", path, 1), cfg.get("mlp_only_layers") or []
        n = sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
        shared = _size(cfg, "shared_expert_intermediate_size", path, 0)
        return _moe(cfg, path, "num_experts", None, None, shared, n)
    if kind.startswith("deepseek"):
        return _deepseek_moe(cfg, layers, path)
    if kind.startswith("llama4") and cfg.get("num_local_experts"):
        return _llama4_moe(cfg, layers, path)
    return {}


def _moe(cfg, path, experts_key, k, width, shared, n_layers) -> dict:
    width = width or _need_pos(cfg, "moe_intermediate_size", path)
    return dict(num_experts=_need_pos(cfg, experts_key, path),
                experts_per_token=k or _need_pos(cfg, "num_experts_per_tok", path),
                moe_intermediate_size=width, shared_expert_intermediate_size=shared,
                num_moe_layers=n_layers)


def _deepseek_moe(cfg: dict, layers: int, path: Path) -> dict:
    first = cfg.get("first_k_dense_replace") or 0
    freq = _size(cfg, "moe_layer_freq", path, 1)
    n = sum(1 for i in range(layers) if i >= first and i % freq == 0)
    width = _need_pos(cfg, "moe_intermediate_size", path)
    shared = (cfg.get("n_shared_experts") or 0) * width
    return _moe(cfg, path, "n_routed_experts", None, width, shared, n)


def _llama4_moe(cfg: dict, layers: int, path: Path) -> dict:
    step = _size(cfg, "interleave_moe_layer_step", path, 1)
    moe = cfg.get("moe_layers") or list(range(step - 1, layers, step))
    width = _need_pos(cfg, "intermediate_size", path)
    out = _moe(cfg, path, "num_local_experts", None, width, width, len(moe))
    out["intermediate_size"] = _size(cfg, "intermediate_size_mlp", path, width)
    return out


def _need_pos(cfg: dict, key: str, path: Path) -> int:
    if cfg.get(key) is None:
        raise ConfigError(f"config is missing '{key}'", location=str(path), field=key)
    return _size(cfg, key, path)


# --- weights ------------------------------------------------------------------------------------
def attention_params(m: ModelSpec) -> int:
    """Weights of one layer's attention projections (MLA: the low-rank q and kv paths)."""
    h, heads = m.hidden_size, m.num_heads
    if not m.is_mla:
        return h * (m.q_size + 2 * m.kv_size) + m.q_size * h
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    q = h * m.q_lora_rank + m.q_lora_rank * heads * qk if m.q_lora_rank else h * heads * qk
    kv = h * m.mla_cache_dim + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
    return q + kv + heads * m.v_head_dim * h


def mlp_params(m: ModelSpec, width: int) -> int:
    """Weights of one MLP (or expert) of ``width``: gate + up + down, or up + down."""
    return (3 if m.gated_mlp else 2) * m.hidden_size * width


def moe_layer_params(m: ModelSpec, experts: int) -> int:
    """One MoE layer's weights when ``experts`` routed experts count: those, the shared
    experts and the router."""
    return (experts * mlp_params(m, m.moe_intermediate_size)
            + mlp_params(m, m.shared_expert_intermediate_size) + m.hidden_size * m.num_experts)


def linear_params(m: ModelSpec, active: bool) -> int:
    """All layers' GEMM weights; ``active``: only the top-k routed experts of each MoE layer."""
    n, dense = m.num_moe_layers, m.num_layers - m.num_moe_layers
    experts = m.experts_per_token if active else m.num_experts
    moe = n * moe_layer_params(m, experts) if m.is_moe else 0
    return m.num_layers * attention_params(m) + dense * mlp_params(m, m.intermediate_size) + moe
