"""Model architectures: the catalog in ``catalog/models.json`` and Hugging Face ``config.json`` files.

A :class:`ModelSpec` holds the published architecture numbers and derives what the cost model and
the KV pool sizing need: parameter count, weight bytes, KV bytes per token, linear FLOPs per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from kvsim.errors import ConfigError
from kvsim.sim._catalog import close_matches, load_catalog, read_json_object

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
               "half": 2, "fp8": 1, "int8": 1}
#: Weight storage formats: the dtypes above, plus ``int4``: 4-bit weights with an fp16 scale and
#: zero point per group of 128 (AWQ, GPTQ), 4 + 32/128 = 4.25 bits per weight.
WEIGHT_DTYPE_BYTES = {**DTYPE_BYTES, "int4": 4.25 / 8}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (``bf16``, ``fp16``, ``fp32``, ``fp8``, ``int8``)."""
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise ConfigError(f"unknown dtype '{dtype}'; known: {', '.join(sorted(DTYPE_BYTES))}") from None


def weight_dtype_bytes(dtype: str) -> float:
    """Bytes per weight stored as ``dtype`` (a :data:`DTYPE_BYTES` dtype, or ``int4``)."""
    try:
        return WEIGHT_DTYPE_BYTES[dtype.lower()]
    except KeyError:
        known = ", ".join(sorted(WEIGHT_DTYPE_BYTES))
        raise ConfigError(f"unknown weight dtype '{dtype}'; known: {known}",
                          field="weight_dtype") from None


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's architecture (one model, not sharded)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    gated_mlp: bool = True
    family: str = "llama"
    qkv_bias: bool = False
    linear_bias: bool = False
    norm: str = "rmsnorm"
    learned_positions: int = 0
    tied_embeddings: bool = False
    aliases: tuple[str, ...] = field(default=(), compare=False)
    # --- attention other than full, MLA, mixture of experts (see kvsim.sim.arch) ---------------
    #: Per layer ``full``, ``sliding`` or ``chunked``; empty: every layer full attention.
    layer_kinds: tuple[str, ...] = ()
    sliding_window: int = 0
    attention_chunk_size: int = 0
    #: Multi-head latent attention (DeepSeek): the cache holds kv_lora_rank + qk_rope_head_dim.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    #: Mixture of experts: ``num_moe_layers`` layers route each token to ``experts_per_token``
    #: of ``num_experts`` experts of width ``moe_intermediate_size``, plus shared experts of
    #: total width ``shared_expert_intermediate_size``; other layers have a dense MLP.
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    num_moe_layers: int = 0

    # --- per layer ----------------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of the four GEMMs of one layer: QKV, output projection, MLP up(+gate), down."""
        h, i = self.hidden_size, self.intermediate_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        return attn + (3 if self.gated_mlp else 2) * h * i

    @property
    def bias_params_per_layer(self) -> int:
        """Bias and norm parameters of one layer (small; counted for weight bytes)."""
        h, i = self.hidden_size, self.intermediate_size
        norms = 2 * h * (2 if self.norm == "layernorm" else 1)
        biases = self.q_size + 2 * self.kv_size if self.qkv_bias else 0
        if self.linear_bias:
            biases = self.q_size + 2 * self.kv_size + h + i + h
        return norms + biases

    # --- whole model --------------------------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        """Input embedding, LM head (unless tied), learned positions and the final norm."""
        emb = self.vocab_size * self.hidden_size
        head = 0 if self.tied_embeddings else emb
        final_norm = self.hidden_size * (2 if self.norm == "layernorm" else 1)
        return emb + head + self.learned_positions * self.hidden_size + final_norm

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and self.num_moe_layers > 0

    @property
    def linear_params_total(self) -> int:
        """Weights of every layer's GEMMs (all experts counted)."""
        if self.is_mla or self.is_moe:
            from kvsim.sim.arch import linear_params
            return linear_params(self, active=False)
        return self.num_layers * self.linear_params_per_layer

    @property
    def active_linear_params_total(self) -> int:
        """Weights one token passes through (top-k routed experts plus shared ones)."""
        if self.is_mla or self.is_moe:
            from kvsim.sim.arch import linear_params
            return linear_params(self, active=True)
        return self.linear_params_total

    @property
    def num_params(self) -> int:
        """Total parameter count."""
        per_layer = self.bias_params_per_layer
        return self.linear_params_total + self.num_layers * per_layer + self.embedding_params

    @property
    def active_params(self) -> int:
        """Parameters one token activates (equal to :attr:`num_params` for a dense model)."""
        inactive = self.linear_params_total - self.active_linear_params_total
        return self.num_params - inactive

    def weight_bytes(self, dtype: str = "bf16") -> int:
        """Bytes of all weights stored in ``dtype`` (``int4`` included, scales counted)."""
        return int(-(-self.num_params * weight_dtype_bytes(dtype) // 1))

    def kv_bytes_per_token(self, dtype: str = "bf16") -> int:
        """KV cache bytes of one token over all layers: 2 * layers * kv_heads * head_dim * bytes
        (MLA: layers * (kv_lora_rank + qk_rope_head_dim) * bytes, one latent "head", no V)."""
        if self.is_mla:
            return self.num_layers * self.mla_cache_dim * dtype_bytes(dtype)
        return 2 * self.num_layers * self.kv_size * dtype_bytes(dtype)

    @property
    def mla_cache_dim(self) -> int:
        """Elements MLA caches per token per layer: the latent plus the shared rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def kv_bytes_per_token_per_layer_per_gpu(self, tp: int, dtype: str = "bf16") -> int:
        """One token's KV bytes in one layer on one of ``tp`` GPUs (vLLM's page size / block
        size). MLA's latent is not split over tensor-parallel ranks: each holds all of it."""
        if self.is_mla:
            return self.mla_cache_dim * dtype_bytes(dtype)
        return 2 * self.kv_heads_per_gpu(tp) * self.head_dim * dtype_bytes(dtype)

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads each of ``tp`` GPUs holds (replicated when tp exceeds the KV head count)."""
        return max(1, -(-self.num_kv_heads // tp))

    def kv_bytes_per_token_per_gpu(self, tp: int, dtype: str = "bf16") -> int:
        """KV cache bytes of one token on one of ``tp`` tensor-parallel GPUs, all layers."""
        return self.num_layers * self.kv_bytes_per_token_per_layer_per_gpu(tp, dtype)

    @property
    def linear_flops_per_token(self) -> int:
        """FLOPs of the linear layers for one token: 2 * linear weights (all layers, LM head excluded)."""
        return 2 * self.active_linear_params_total

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size


def _from_entry(name: str, entry: dict) -> ModelSpec:
    fields = {k: v for k, v in entry.items() if k != "aliases"}
    return ModelSpec(name=name, aliases=tuple(entry.get("aliases", ())), **fields)


def list_models() -> list[str]:
    """Catalog names, sorted (``models.json`` and the Hugging Face configs of ``hf_models.json``)."""
    return sorted([*load_catalog("models.json")["models"], *load_catalog("hf_models.json")["models"]])


def resolve_model(name_or_path: str | Path) -> ModelSpec:
    """A catalog name (``llama-2-7b``), a Hugging Face id (``meta-llama/Llama-2-7b-hf``, case
    ignored) or a path to a Hugging Face ``config.json`` (or a folder holding one)."""
    text = str(name_or_path)
    path = Path(text)
    if path.suffix == ".json" or (path / "config.json").is_file():
        return model_from_hf_config(path / "config.json" if path.is_dir() else path)
    models = load_catalog("models.json")["models"]
    hf_models = load_catalog("hf_models.json")["models"]
    index = {}
    for catalog in (models, hf_models):
        index.update({k.lower(): k for k in catalog})
        for key, entry in catalog.items():
            index.update({a.lower(): key for a in entry.get("aliases", ())})
    key = index.get(text.lower())
    if key is None:
        return _from_hub_cache(text, index, list_models())
    if key in hf_models:
        from kvsim.sim.arch import spec_from_hf
        entry = hf_models[key]
        return spec_from_hf(key, entry["config"], f"catalog hf_models.json:{key}",
                            tuple(entry.get("aliases", ())))
    return _from_entry(key, models[key])


def _from_hub_cache(text: str, index: dict, known: list[str]) -> ModelSpec:
    """A Hugging Face id that is no catalog alias, from the local Hugging Face cache."""
    from .hf_cache import cached_config, hub_cache_dir, is_repo_id
    config = cached_config(text) if is_repo_id(text) else None
    if config is not None:
        spec = model_from_hf_config(config)
        return spec if spec.name == text else replace(spec, name=text)
    hint = close_matches(text.lower(), index)
    cache = (f", not in the local Hugging Face cache ({hub_cache_dir()}; `huggingface-cli "
             f"download {text} config.json` puts it there)") if is_repo_id(text) else ""
    raise ConfigError(f"unknown model '{text}'{hint}{cache}; known: "
                      f"{', '.join(known)}, a Hugging Face id in the local cache, "
                      "or a path to a Hugging Face config.json", field="model")


# --- Hugging Face config.json -------------------------------------------------------------------
_HF_FAMILIES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "opt": "opt"}
# The other families (qwen3, MoE, MLA, sliding-window and chunked attention) are read by
# :mod:`kvsim.sim.arch`.


def _architecture_name(cfg: dict) -> str:
    """``MixtralForCausalLM (model_type 'mixtral')``, or the model type alone."""
    arch, kind = cfg.get("architectures"), f"model_type '{cfg.get('model_type')}'"
    return f"{', '.join(map(str, arch))} ({kind})" if isinstance(arch, list) and arch else kind


def model_from_hf_config(path: Path) -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` of a llama, mistral, qwen2
    or opt model."""
    cfg = read_json_object(path, "model config", "model")
    family = _HF_FAMILIES.get(str(cfg.get("model_type", "")).lower())
    from kvsim.sim.arch import HF_FAMILIES, spec_from_hf
    if family is None or _is_hybrid_config(cfg):
        if str(cfg.get("model_type", "")).lower() not in HF_FAMILIES:
            raise ConfigError(f"{_architecture_name(cfg)} is not supported; supported model "
                              f"types: {', '.join(dict.fromkeys([*_HF_FAMILIES, *HF_FAMILIES]))}",
                              location=str(path), field="model")
        name = str(cfg.get("_name_or_path") or Path(path).parent.name or "custom")
        return spec_from_hf(name, cfg, str(path))
    build = _opt_fields if family == "opt" else _llama_fields
    return ModelSpec(name=str(cfg.get("_name_or_path") or Path(path).parent.name or "custom"),
                     family=family, **build(cfg, path))


def _is_hybrid_config(cfg: dict) -> bool:
    """A mistral config with a sliding window (every layer sliding, as vLLM reads it)."""
    return cfg.get("model_type") == "mistral" and cfg.get("sliding_window") is not None


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
    if not 1 <= value <= 1 << 40:
        raise ConfigError(f"must be a positive integer, got {value}", location=str(path),
                          field=key)
    return value


def _head_dim(cfg: dict, hidden: int, heads: int, path: Path) -> int:
    """``head_dim`` when given, else ``hidden_size / num_attention_heads`` (which must divide)."""
    given = _size(cfg, "head_dim", path)
    if given is None and hidden % heads:
        raise ConfigError(f"hidden_size {hidden} is not a multiple of {heads} heads (and no "
                          "head_dim is given)", location=str(path), field="num_attention_heads")
    return given or hidden // heads


def check_tensor_parallel(model: ModelSpec, tp: int) -> None:
    """vLLM's rules: the attention heads divide evenly over the ``tp`` GPUs, and the KV heads
    either divide evenly too or are replicated (``tp`` a multiple of their count)."""
    if model.num_heads % tp:
        raise ConfigError(f"{model.name} has {model.num_heads} attention heads, which do not "
                          f"divide over {tp} GPUs (vLLM refuses this)", field="tp")
    kv = model.num_kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise ConfigError(f"{model.name} has {kv} KV heads: tp must divide them or be a "
                          f"multiple of them, got {tp} (vLLM refuses this)", field="tp")


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
                max_model_len=_need(cfg, "max_position_embeddings", path), gated_mlp=True,
                qkv_bias=cfg.get("model_type") == "qwen2" or bool(cfg.get("attention_bias")),
                tied_embeddings=bool(cfg.get("tie_word_embeddings", False)))


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
                tied_embeddings=bool(cfg.get("tie_word_embeddings", True)))
