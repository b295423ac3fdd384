"""A model's KV layout on one GPU: its layer groups, page sizes and block cost, as vLLM's
``get_kv_cache_config`` computes them (see :mod:`kvsim.cache.attention_groups`).

* page (one block of one layer, per GPU) = ``block_size * bytes per token per layer``: full,
  sliding and chunked attention ``2 * kv_heads_per_gpu * head_dim * dtype``; MLA
  ``(kv_lora_rank + qk_rope_head_dim) * dtype`` on EVERY tensor-parallel rank (the latent is
  replicated, not split);
* a block of the shared pool costs ``max(layers of a group) * page`` (``group_size`` pages);
  ``num_gpu_blocks = KV memory // that``. A dense model is one group of all layers, so this is
  the familiar ``block_size * kv_bytes_per_token_per_gpu``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.cache.attention_groups import FULL, LayerGroup, blocks_per_request, group_layers
from kvsim.sim.perf.models import ModelSpec


@dataclass(frozen=True)
class KvLayout:
    """The groups of a model on one of ``tp`` GPUs, with ``block_size`` tokens per block."""

    groups: tuple[LayerGroup, ...]
    group_size: int
    page_bytes: int            # one block of one layer, per GPU
    block_size: int
    bytes_per_token: int       # all layers, one full-attention token, per GPU

    @property
    def bytes_per_block(self) -> int:
        return max(g.num_layers for g in self.groups) * self.page_bytes

    @property
    def is_hybrid(self) -> bool:
        """More than one group: vLLM's hybrid KV cache manager (one table per group)."""
        return len(self.groups) > 1 or self.groups[0].kind != FULL

    def blocks_per_request(self, length: int) -> int:
        """Pool blocks a request holds while decoding its ``length``-th token."""
        return blocks_per_request(self.groups, length, self.block_size)

    def max_concurrency(self, num_blocks: int, length: int) -> int:
        """Requests of ``length`` tokens the pool holds at once."""
        return num_blocks // self.blocks_per_request(length)

    def describe(self) -> list[dict]:
        """``summary.json``'s ``kv.groups``: per group its kind, layers, window, and bytes one
        token costs it per GPU (its layers' pages; padding layers count, as vLLM allocates)."""
        per_token_layer = self.page_bytes // self.block_size
        return [{**g.as_dict(), "bytes_per_token": self.group_size * per_token_layer}
                for g in self.groups]


def kv_layout(model: ModelSpec, tp: int = 1, block_size: int = 16,
              kv_dtype: str = "bf16") -> KvLayout:
    """The :class:`KvLayout` of ``model`` on one of ``tp`` GPUs."""
    kinds = model.layer_kinds or (FULL,) * model.num_layers
    size, groups = group_layers(kinds, model.sliding_window, model.attention_chunk_size)
    page = block_size * model.kv_bytes_per_token_per_layer_per_gpu(tp, kv_dtype)
    return KvLayout(groups, size, page, block_size,
                    model.kv_bytes_per_token_per_gpu(tp, kv_dtype))


def longest_request(layout: KvLayout, num_blocks: int, max_num_batched_tokens: int,
                    model_max_len: int) -> int:
    """The longest request (tokens, at most ``model_max_len``) whose worst case, vLLM's
    ``max_admission_blocks_per_request`` summed over groups, fits ``num_blocks``."""
    def need(length: int) -> int:
        return sum(g.max_blocks_per_request(layout.block_size, max_num_batched_tokens, length)
                   for g in layout.groups)
    if need(model_max_len) <= num_blocks:
        return model_max_len
    low, high = 0, model_max_len           # need(low) fits, need(high) does not
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if need(mid) <= num_blocks else (low, mid)
    return low
