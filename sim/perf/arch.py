"""Hugging Face ``config.json`` readers: every supported family becomes a
:class:`~kvsim.sim.perf.model_shape.ModelSpec`.

Dense llama, mistral, qwen2 and opt configs are read field by field (:func:`model_from_hf_config`);
Qwen3 (dense and MoE), Qwen2-MoE, Mixtral, Mistral with a sliding window, DeepSeek-V2/V3/R1 (MLA,
shared + routed experts, dense first layers), gpt-oss (alternating sliding-window and full
attention, MoE), Gemma 3 (local/global layers) and Llama 4 (chunked local attention, MoE). A
multimodal config's ``text_config`` is read (the vision tower is not counted).

Each becomes a :class:`~kvsim.sim.perf.models.ModelSpec`: the dense fields as for llama, plus
``layer_kinds`` (``full``/``sliding``/``chunked`` per layer, as vLLM's attention specs), MLA's
dimensions and the mixture-of-experts shape (:func:`~kvsim.sim.perf.model_shape.linear_params`
counts their weights).
"""

from __future__ import annotations

from pathlib import Path

from kvsim.errors import ConfigError
from kvsim.sim.perf._catalog import read_json_object
from kvsim.sim.perf.model_shape import ModelSpec
from kvsim.sim.perf.quantization import checkpoint_weight_dtype, kept_16bit

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
        out["sliding_window"] = _need(cfg, "sliding_window", path)
    if "chunked" in kinds:
        out["attention_chunk_size"] = _need(cfg, "attention_chunk_size", path)
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
    rope, nope = _need(cfg, "qk_rope_head_dim", path), _need(cfg, "qk_nope_head_dim", path)
    return dict(kv_lora_rank=_need(cfg, "kv_lora_rank", path),
                q_lora_rank=_size(cfg, "q_lora_rank", path, 0), qk_rope_head_dim=rope,
                qk_nope_head_dim=nope, v_head_dim=_need(cfg, "v_head_dim", path),
                head_dim=rope + nope, num_kv_heads=heads)


# --- mixture of experts -------------------------------------------------------------------------
def _moe_fields(cfg: dict, kind: str, layers: int, path: Path) -> dict:
    if kind in ("mixtral", "gpt_oss"):
        k = _size(cfg, "experts_per_token", path) or _need(cfg, "num_experts_per_tok", path)
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
    width = width or _need(cfg, "moe_intermediate_size", path)
    return dict(num_experts=_need(cfg, experts_key, path),
                experts_per_token=k or _need(cfg, "num_experts_per_tok", path),
                moe_intermediate_size=width, shared_expert_intermediate_size=shared,
                num_moe_layers=n_layers)


def _deepseek_moe(cfg: dict, layers: int, path: Path) -> dict:
    first = cfg.get("first_k_dense_replace") or 0
    freq = _size(cfg, "moe_layer_freq", path, 1)
    n = sum(1 for i in range(layers) if i >= first and i % freq == 0)
    width = _need(cfg, "moe_intermediate_size", path)
    shared = (cfg.get("n_shared_experts") or 0) * width
    return _moe(cfg, path, "n_routed_experts", None, width, shared, n)


def _llama4_moe(cfg: dict, layers: int, path: Path) -> dict:
    step = _size(cfg, "interleave_moe_layer_step", path, 1)
    moe = cfg.get("moe_layers") or list(range(step - 1, layers, step))
    width = _need(cfg, "intermediate_size", path)
    out = _moe(cfg, path, "num_local_experts", None, width, width, len(moe))
    out["intermediate_size"] = _size(cfg, "intermediate_size_mlp", path, width)
    return out


# --- the dense families, and dispatch ------------------------------------------------------------
_HF_FAMILIES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "opt": "opt"}
# The other families (qwen3, MoE, MLA, sliding-window and chunked attention): HF_FAMILIES.


def _architecture_name(cfg: dict) -> str:
    """``MixtralForCausalLM (model_type 'mixtral')``, or the model type alone (``no
    model_type`` where the config has none)."""
    kind = (f"model_type '{cfg['model_type']}'" if cfg.get("model_type") is not None
            else "no model_type")
    arch = cfg.get("architectures")
    return f"{', '.join(map(str, arch))} ({kind})" if isinstance(arch, list) and arch else kind


def model_from_hf_config(path: Path) -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` of a llama, mistral, qwen2
    or opt model."""
    return model_from_hf_dict(read_json_object(path, "model config", "model"), path)


def model_from_hf_dict(cfg: dict, path: Path) -> ModelSpec:
    """The :class:`ModelSpec` of a Hugging Face config dict read from ``path``."""
    family = _HF_FAMILIES.get(str(cfg.get("model_type", "")).lower())
    if family is None or _is_hybrid_config(cfg):
        if str(cfg.get("model_type", "")).lower() not in HF_FAMILIES:
            raise ConfigError(f"{_architecture_name(cfg)} is not supported; supported model "
                              f"types: {', '.join(dict.fromkeys([*_HF_FAMILIES, *HF_FAMILIES]))}",
                              location=str(path), field="model")
        return spec_from_hf(_model_name(cfg, path), cfg, str(path))
    build = _opt_fields if family == "opt" else _llama_fields
    return ModelSpec(name=_model_name(cfg, path), family=family, **build(cfg, path))


def _model_name(cfg: dict, path: Path) -> str:
    """A config's ``_name_or_path``, else the folder of a ``config.json`` (a downloaded
    model's), else the file as given (it was 'custom', which told nobody which)."""
    path = Path(path)
    folder = path.absolute().parent.name if path.name == "config.json" else ""  # (no link
    # followed: a Hugging Face snapshot's config.json links into blobs/)
    return str(cfg.get("_name_or_path") or folder or path)


def _is_hybrid_config(cfg: dict) -> bool:
    """A mistral config with a sliding window (every layer sliding, as vLLM reads it)."""
    return cfg.get("model_type") == "mistral" and cfg.get("sliding_window") is not None


_MOST_ROPE_FACTOR = 1024       # (YaRN and its kin stretch a context 2-64x)


def _context_len(cfg: dict, path: Path) -> int:
    """The model's context as vLLM derives it: ``max_position_embeddings``, times a RoPE
    scaling's ``factor`` (of YaRN's ``original_max_position_embeddings``), except for
    ``llama3`` and ``longrope`` scalings and Gemma 3 (whose length is scaled already)."""
    length = _need(cfg, "max_position_embeddings", path)
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, dict) or "gemma3" in str(cfg.get("model_type", "")):
        return length
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in ("su", "longrope", "llama3"):
        return length
    if kind == "yarn" and rope.get("original_max_position_embeddings") is not None:
        length = _size(rope, "original_max_position_embeddings", path)
    factor = rope.get("factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) \
            or not 0 < factor <= _MOST_ROPE_FACTOR:
        raise ConfigError(f"rope_scaling factor must be a number above 0 and at most "
                          f"{_MOST_ROPE_FACTOR}, got {factor!r}", location=str(path),
                          field="rope_scaling")
    return int(length * factor)


def _need(cfg: dict, key: str, path: Path) -> int:
    if cfg.get(key) is None:
        raise ConfigError(f"config is missing '{key}'", location=str(path), field=key)
    return _size(cfg, key, path)


def _size(cfg: dict, key: str, path: Path, default=None) -> int:
    """``cfg[key]`` as a positive integer (``default`` when absent or null)."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"expected a positive integer, got {value!r}", location=str(path),
                          field=key)
    most = _MOST.get(key, 1 << 40)
    if not 1 <= value <= most:
        raise ConfigError(f"must be an integer from 1 to {most:,}, got {value:,}",
                          location=str(path), field=key)
    return value


#: Sizes that set how many entries per-layer and per-expert tables hold: far above any model
#: (a billion layers took minutes and gigabytes before it was refused as too large to fit).
_MOST = {"num_hidden_layers": 10_000, "num_local_experts": 100_000, "n_routed_experts": 100_000,
         "num_experts": 100_000}


def _head_dim(cfg: dict, hidden: int, heads: int, path: Path) -> int:
    """``head_dim`` when given, else ``hidden_size / num_attention_heads`` (which must divide)."""
    given = _size(cfg, "head_dim", path)
    if given is None and hidden % heads:
        raise ConfigError(f"hidden_size {hidden} is not a multiple of {heads} heads (and no "
                          "head_dim is given)", location=str(path), field="num_attention_heads")
    return given or hidden // heads


def _llama_fields(cfg: dict, path: Path) -> dict:
    hidden, heads = _need(cfg, "hidden_size", path), _need(cfg, "num_attention_heads", path)
    kv_heads = _size(cfg, "num_key_value_heads", path, heads)
    if heads % kv_heads:
        raise ConfigError(f"{heads} attention heads are not a multiple of {kv_heads} KV heads",
                          location=str(path), field="num_key_value_heads")
    return dict(num_layers=_need(cfg, "num_hidden_layers", path), hidden_size=hidden,
                num_heads=heads, num_kv_heads=kv_heads,
                head_dim=_head_dim(cfg, hidden, heads, path),
                intermediate_size=_need(cfg, "intermediate_size", path),
                vocab_size=_need(cfg, "vocab_size", path),
                max_model_len=_context_len(cfg, path), gated_mlp=True,
                qkv_bias=cfg.get("model_type") == "qwen2" or bool(cfg.get("attention_bias")),
                tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                weight_dtype=checkpoint_weight_dtype(cfg, path), kept_16bit=kept_16bit(cfg))


def _opt_fields(cfg: dict, path: Path) -> dict:
    hidden, heads = _need(cfg, "hidden_size", path), _need(cfg, "num_attention_heads", path)
    max_len = _need(cfg, "max_position_embeddings", path)
    return dict(num_layers=_need(cfg, "num_hidden_layers", path), hidden_size=hidden,
                num_heads=heads, num_kv_heads=heads,
                head_dim=_head_dim({}, hidden, heads, path),
                intermediate_size=_need(cfg, "ffn_dim", path),
                vocab_size=_need(cfg, "vocab_size", path), max_model_len=max_len,
                gated_mlp=False, linear_bias=True, norm="layernorm",
                learned_positions=max_len + 2,
                tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
                weight_dtype=checkpoint_weight_dtype(cfg, path), kept_16bit=kept_16bit(cfg))
