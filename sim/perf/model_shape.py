"""A model's shape: the one definition of a decoder's architecture numbers.

A :class:`ModelSpec` holds the published architecture numbers and derives what the cost model,
the KV pool sizing and the real backend need: parameter count, weight bytes, KV bytes per token,
linear FLOPs per token. :mod:`kvsim.sim.perf.models` finds one by name (the catalog, Hugging Face
ids), :mod:`kvsim.sim.perf.arch` reads one from a Hugging Face ``config.json``, and the real backend's
:class:`~kvsim.real_backend.backend_model.LlamaConfig` is one plus its RoPE and norm constants.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvsim.errors import ConfigError

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
    #: How a quantized checkpoint stores its weights (``int4``, ``int8``, ``fp8``; its
    #: config.json's ``quantization_config``): the default of ``--weight-dtype``.
    weight_dtype: str | None = None
    #: Layer parts a quantized checkpoint keeps 16-bit in every layer (``attention``,
    #: ``router``: its ``modules_to_not_convert``), whatever the weight dtype.
    kept_16bit: tuple[str, ...] = ()
    aliases: tuple[str, ...] = field(default=(), compare=False)
    # --- attention other than full, MLA, mixture of experts (see kvsim.sim.perf.arch) ---------------
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
            return linear_params(self, active=False)
        return self.num_layers * self.linear_params_per_layer

    @property
    def active_linear_params_total(self) -> int:
        """Weights one token passes through (top-k routed experts plus shared ones)."""
        if self.is_mla or self.is_moe:
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
        """Bytes of all weights stored in ``dtype`` (``int4`` included, scales counted). A
        quantized dtype (narrower than 16 bits) stores the layers' GEMM weights only: the
        embeddings, LM head, norms and biases stay 16-bit, as vLLM's quantization methods
        keep them, and so do the parts of :attr:`kept_16bit`."""
        per = weight_dtype_bytes(dtype)
        if per >= 2:
            return int(-(-self.num_params * per // 1))
        quantized = self.linear_params_total - self.kept_linear_params
        return int(-(-(quantized * per + (self.num_params - quantized) * 2) // 1))

    @property
    def kept_linear_params(self) -> int:
        """GEMM weights (whole model) that stay 16-bit when the others are quantized: the
        parts in :attr:`kept_16bit`."""
        kept = self.num_layers * attention_params(self) if "attention" in self.kept_16bit else 0
        if "router" in self.kept_16bit and self.is_moe:
            kept += self.num_moe_layers * self.hidden_size * self.num_experts
        return kept

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
