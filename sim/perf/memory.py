"""KV pool sizing the way vLLM does it, per GPU of a tensor-parallel group.

``num_gpu_blocks = floor((gpu_memory_utilization * memory - weights/tp - activation_reserve)
/ (block_size * kv_bytes_per_token_per_gpu))``. vLLM measures the activation peak with a profiling
forward pass of ``max_num_batched_tokens`` tokens; :func:`estimate_activation_bytes` estimates it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.errors import ConfigError
from kvsim.sim.perf.gpus import GpuSpec, resolve_gpu
from kvsim.sim.perf.kv_layout import KvLayout, kv_layout
from kvsim.sim.perf.models import ModelSpec, dtype_bytes, resolve_model, weight_dtype_bytes

GIB = 1 << 30


@dataclass(frozen=True)
class KvPool:
    """The KV pool of one tensor-parallel replica; every byte count is per GPU."""

    num_gpu_blocks: int
    block_size: int
    bytes_per_block: int
    usable_bytes: int
    weight_bytes: int
    activation_reserve_bytes: int
    kv_bytes: int
    explanation: str
    layout: KvLayout | None = None

    @property
    def num_token_slots(self) -> int:
        return self.num_gpu_blocks * self.block_size


def estimate_activation_bytes(model: ModelSpec, tp: int = 1, dtype: str = "bf16",
                              max_num_batched_tokens: int = 8192, max_num_seqs: int = 256) -> int:
    """Peak activation memory of one forward pass, per GPU (an estimate of vLLM's profiling run).

    Per token: the MLP's up(+gate) output and activation output (sharded over ``tp``) plus four
    hidden-sized buffers (residual, normed input, attention output, QKV's share); plus fp32 logits
    for ``max_num_seqs`` rows.
    """
    b = dtype_bytes(dtype)
    mlp = (3 if model.gated_mlp else 2) * model.intermediate_size // tp
    per_token = (mlp + 4 * model.hidden_size) * b
    logits = max_num_seqs * model.vocab_size * 4
    return max_num_batched_tokens * per_token + logits


def kv_pool(model: ModelSpec | str, gpu: GpuSpec | str, tp: int = 1, block_size: int = 16,
            gpu_memory_utilization: float = 0.9, dtype: str = "bf16",
            activation_reserve: int | None = None, kv_dtype: str | None = None,
            max_num_batched_tokens: int = 8192, max_num_seqs: int = 256,
            weight_dtype: str | None = None) -> KvPool:
    """Size the GPU KV pool; raises :class:`ConfigError` with the numbers when nothing is left.

    ``activation_reserve`` (bytes per GPU) defaults to :func:`estimate_activation_bytes` for
    ``max_num_batched_tokens`` and ``max_num_seqs``. ``kv_dtype`` and ``weight_dtype`` (which may
    also be ``int4``) default to ``dtype``.
    """
    model, gpu = _resolve(model), resolve_gpu(gpu)
    _check_settings(tp, block_size, gpu_memory_utilization)
    usable = int(gpu.memory_bytes * gpu_memory_utilization)
    stored = weight_dtype or model.weight_dtype or dtype
    weights = -(-model.weight_bytes(stored) // tp)
    reserve = activation_reserve
    if reserve is None:
        reserve = estimate_activation_bytes(model, tp, dtype, max_num_batched_tokens, max_num_seqs)
    layout = kv_layout(model, tp, block_size, kv_dtype or dtype)
    per_block = layout.bytes_per_block
    kv = usable - weights - reserve
    if kv < per_block and block_size > 16 and \
            kv >= kv_layout(model, tp, 16, kv_dtype or dtype).bytes_per_block:
        raise ConfigError(f"one block of {block_size:,} tokens needs {per_block:,} bytes per "
                          f"GPU, more than the {_gib(kv)} left for KV on {gpu.name} with "
                          f"tp={tp} (16-token blocks fit); lower --block-size",
                          field="block_size")
    if kv < per_block:
        step_too_big = usable - weights >= per_block     # (the weights alone leave room)
        raise ConfigError(_no_room(model, gpu, tp, gpu_memory_utilization, usable, weights,
                                   reserve, per_block, step_too_big, stored),
                          field="max_num_batched_tokens" if step_too_big else "model")
    blocks = kv // per_block
    text = (f"{gpu_memory_utilization:g} x {_gib(gpu.memory_bytes)} ({gpu.name}) = {_gib(usable)}"
            f" - weights {_gib(weights)} ({model.name}/tp{tp})"
            f" - activations {_gib(reserve)} = {_gib(kv)} for KV; / {per_block:,} bytes per block"
            f" ({block_size} tokens{_groups_text(layout)}) = {blocks:,} blocks"
            f" ({blocks * block_size:,} tokens) per GPU")
    return KvPool(blocks, block_size, per_block, usable, weights, reserve, kv, text, layout)


def _groups_text(layout: KvLayout) -> str:
    if not layout.is_hybrid:
        return ""
    kinds = ", ".join(f"{g.kind} {g.num_layers}" for g in layout.groups)
    return (f"; {len(layout.groups)} layer groups ({kinds}) of {layout.group_size} layers"
            " share the pool")


#: vLLM rounds a host block's bytes up to a memory page (``SharedOffloadRegion``).
HOST_PAGE_BYTES = 4096


def kv_offloading_blocks(model: ModelSpec | str, kv_offloading_size: float, tp: int = 1,
                         block_size: int = 16, kv_dtype: str = "bf16") -> int:
    """Host KV blocks that ``--kv-offloading-size`` GiB hold, as vLLM 0.32 counts them
    (``CPUOffloadingSpec``): the size is the host memory of the whole replica
    (``cpu_bytes_to_use`` = GiB x 2**30, shared by all ``tp`` ranks); a block is one GPU
    block on every rank, rounded up to a 4 KiB page, except for an MLA model with ``tp`` > 1,
    whose ranks hold the same latent: one copy (``replicated_layout``, TP on one node)."""
    if kv_offloading_size < 0:
        raise ConfigError(f"kv offloading size must be >= 0 GiB, got {kv_offloading_size}",
                          field="kv_offloading_size")
    spec = _resolve(model)
    copies = 1 if spec.is_mla else tp
    per_block = block_size * spec.kv_bytes_per_token_per_gpu(tp, kv_dtype) * copies
    per_block = -(-per_block // HOST_PAGE_BYTES) * HOST_PAGE_BYTES
    return int(kv_offloading_size * GIB) // per_block


def _resolve(model: ModelSpec | str) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else resolve_model(model)


def _check_settings(tp: int, block_size: int, utilization: float) -> None:
    if tp < 1:
        raise ConfigError(f"tensor parallel size must be >= 1, got {tp}", field="tp")
    if block_size < 1:
        raise ConfigError(f"block size must be >= 1, got {block_size}", field="block_size")
    if not 0 < utilization <= 1:
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {utilization}",
                          field="gpu_memory_utilization")


def _no_room(model, gpu, tp, util, usable, weights, reserve, per_block,
             step_too_big: bool = False, stored: str = "bf16") -> str:
    fits_whole = weights + reserve + per_block <= gpu.memory_bytes    # (at utilization 1)
    advice = ("lower --max-num-batched-tokens or --max-num-seqs (a step's activations)"
              if step_too_big else
              "raise --tp, use a larger GPU or raise --gpu-memory-utilization" if fits_whole
              else "raise --tp or use a larger GPU (they need more than the whole GPU)")
    narrower = [d for d in ("int4", "int8", "fp8")
                if weight_dtype_bytes(d) < weight_dtype_bytes(stored)]
    if narrower and not step_too_big:
        advice += (f", or store the weights quantized (--weight-dtype "
                   f"{', '.join(narrower[:-1]) + ' or ' if len(narrower) > 1 else ''}"
                   f"{narrower[-1]})")
    return (f"{model.name} does not fit on {gpu.name} with tp={tp}: "
            f"{util:g} x {_gib(gpu.memory_bytes)} = {_gib(usable)} usable per GPU, "
            f"weights need {_gib(weights)} and activations {_gib(reserve)}, leaving "
            f"{_gib(usable - weights - reserve)} for KV (one block needs {per_block:,} bytes); "
            f"{advice}")


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"
