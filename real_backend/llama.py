"""A Llama-architecture decoder in torch with random weights, run over a packed token stream.

Its shape is a :class:`~kvsim.real_backend.backend_model.LlamaConfig` (the simulator's
:class:`~kvsim.sim.perf.model_shape.ModelSpec` plus RoPE theta and norm eps).

RMSNorm, rotary position embeddings (RoPE, the HF ``rotate_half`` convention), grouped-query
attention through the paged KV store, a SwiGLU MLP, token embedding and LM head. Like vLLM, every
request's new tokens are packed into one ``[total_tokens, hidden]`` stream for the linear layers;
only attention splits the stream per request (see :mod:`kvsim.real_backend.attention`).

Weights are drawn from a seeded generator on the CPU in fp32 and then cast and moved, so a given
seed gives the same model on every device and dtype. Nothing is ever downloaded.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from kvsim.real_backend.attention import AttentionMetadata, paged_attention
from kvsim.real_backend.backend_model import LlamaConfig
from kvsim.real_backend.cpu_head import CpuHead

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map ``"fp32" | "bf16" | "fp16"`` (or their long names, or a torch dtype) to a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)}") from None


class RMSNorm(nn.Module):
    """Root-mean-square layer norm; the statistics are taken in fp32 as in HF Llama."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and hasattr(F, "rms_norm"):   # fused, torch >= 2.4
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """RoPE over the two halves of each head (HF ``rotate_half``).

    The cos/sin tables are plain fp32 tensors (not buffers, so casting the model to bf16 leaves
    them exact); they are rebuilt on the positions' device and grown on demand.
    """

    def __init__(self, head_dim: int, theta: float, max_position: int) -> None:
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
        self.inv_freq = (1.0 / theta ** exponents).float()
        self.max_position = max_position
        self.cos = self.sin = torch.empty(0)

    def _tables(self, positions: torch.Tensor,
                max_position: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[positions, head_dim/2]`` (fp32), rebuilt when too short or elsewhere.

        Pass ``max_position`` when known on the host to avoid a device sync.
        """
        if max_position is None:
            max_position = int(positions.max()) if positions.numel() else 0
        needed = max_position + 1
        if needed > self.cos.shape[0] or self.cos.device != positions.device:
            length = max(needed, self.max_position, 2 * self.cos.shape[0])
            pos = torch.arange(length, dtype=torch.float32, device=positions.device)
            freqs = torch.outer(pos, self.inv_freq.to(positions.device))
            self.cos, self.sin = freqs.cos(), freqs.sin()
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype,
                max_position: int | None = None) -> "RopeAngles":
        """The rotation for each token of the stream, in ``dtype``."""
        cos, sin = self._tables(positions, max_position)
        return cos.to(dtype), sin.to(dtype)


RopeAngles = tuple[torch.Tensor, torch.Tensor]


def apply_rope(x: torch.Tensor, rope: RopeAngles) -> torch.Tensor:
    """Rotate ``x`` of shape ``[tokens, heads, head_dim]`` by each token's position."""
    cos, sin = rope
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class LlamaAttention(nn.Module):
    """Fused QKV projection, RoPE, paged grouped-query attention, output projection."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=False)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.scale = 1.0 / math.sqrt(cfg.head_dim)

    def forward(self, x: torch.Tensor, rope: RopeAngles,
                kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: AttentionMetadata) -> torch.Tensor:
        cfg = self.cfg
        qk, v = self.qkv_proj(x).split([cfg.q_size + cfg.kv_size, cfg.kv_size], dim=-1)
        # Query and key heads are adjacent in the fused output: rotate them in one pass.
        qk = apply_rope(qk.reshape(-1, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim), rope)
        q, k = qk.split([cfg.num_heads, cfg.num_kv_heads], dim=1)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        out = paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(out.reshape(-1, cfg.q_size))


class LlamaMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` with gate and up fused into one matmul."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm residual block: attention then MLP."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x: torch.Tensor, rope: RopeAngles,
                kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    """Embedding, decoder layers, final norm and LM head over a packed token stream."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.max_position)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                meta: AttentionMetadata, logits_indices: torch.Tensor) -> torch.Tensor:
        """Logits ``[len(logits_indices), vocab]`` (fp32) at the chosen stream positions."""
        x = self.embed_tokens(input_ids)
        rope = self.rotary(positions, x.dtype, meta.max_position)
        for layer, kv_cache in zip(self.layers, kv_caches):
            x = layer(x, rope, kv_cache, meta)
        x = self.norm(x.index_select(0, logits_indices))
        return self.logits(x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """LM head, fp32 out; on the CPU through :class:`~.cpu_head.CpuHead` (steadier and
        faster for few rows than ``F.linear``)."""
        if x.device.type != "cpu":
            return self.lm_head(x).float()
        return self.cpu_head()(x).float()

    def cpu_head(self) -> CpuHead:
        """The CPU LM head for the current weight (rebuilt if the weight changed)."""
        head = getattr(self, "_cpu_head", None)
        if head is None or not head.matches(self.lm_head.weight):
            self._cpu_head = head = CpuHead(self.lm_head.weight)
        return head


@torch.no_grad()
def init_random_weights(model: nn.Module, seed: int) -> None:
    """Fill every weight from ``torch.Generator(seed)``: matrices ~ N(0, 1/fan_in), embeddings
    ~ N(0, 1), norm gains ~ N(1, 0.1). Activations stay O(1), so attention is not uniform.
    The generator lives on the parameters' device (CPU and CUDA draw different numbers)."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen, device=device)
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * noise)
        elif "embed_tokens" in name:
            p.copy_(noise)
        else:
            p.copy_(noise / math.sqrt(p.shape[-1]))


def build_model(cfg: LlamaConfig, *, seed: int = 0, dtype: str | torch.dtype = "fp32",
                device: str | torch.device = "cpu") -> LlamaForCausalLM:
    """A randomly initialised, inference-only model in ``dtype`` on ``device``.

    The modules are built on the ``meta`` device and then given uninitialised storage, so
    torch's default initialisation (slow for billions of weights) is skipped:
    :func:`init_random_weights` writes every parameter anyway. On CUDA the weights are drawn on
    the GPU (an 8B model's 32 GB of fp32 draws take minutes on one CPU thread).
    """
    target = torch.device(device)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model.to_empty(device=target if target.type == "cuda" else "cpu")
    model.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.max_position)
    if cfg.tie_word_embeddings:   # to_empty gives each module its own storage
        model.lm_head.weight = model.embed_tokens.weight
    init_random_weights(model, seed)
    model.requires_grad_(False).eval()
    return model.to(device=target, dtype=resolve_dtype(dtype))
