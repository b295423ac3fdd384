"""ModelRunner: one forward pass over a step's scheduled requests, vLLM style.

All requests' new tokens are packed, in batch order, into one token stream; the linear layers see
``[total_tokens, hidden]`` and only attention splits it per request. Logits are computed only at
each request's last new token.

On the CPU, decode attention gathers at most :data:`CPU_DECODE_GROUP_BYTES` of K/V per group
and layer. Gathering a whole batch at once made a request's KV cost depend on the batch: the
gathered copy outgrew the caches, and a 16-request decode at 1,100 tokens each took 5x as
long as with the cap (256 ms against 50 ms on the 2-vCPU EPYC dev VM, a 4-layer hidden-512
Llama; 27 against 19 ms for tiny-llama). With the cap the cost per KV token is flat in the
batch size, which is what a paged-attention kernel does and what the cost model assumes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from kvsim.real_backend.attention import AttentionMetadata, build_attention_metadata
from kvsim.real_backend.kv_store import PagedKVStore
from kvsim.real_backend.backend_model import LlamaConfig
from kvsim.real_backend.llama import LlamaForCausalLM, build_model

#: Gathered K+V bytes per decode group and layer on the CPU (about half an L2 cache).
CPU_DECODE_GROUP_BYTES = 1 << 20


@dataclass
class RequestChunk:
    """One request's share of a forward pass: ``token_ids`` at positions
    ``num_computed_tokens ..``, with KV stored through ``block_table``."""

    token_ids: Sequence[int]
    num_computed_tokens: int
    block_table: Sequence[int]

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class StepInputs:
    """Device tensors for one forward pass."""

    input_ids: torch.Tensor        # [T] long
    meta: AttentionMetadata
    logits_indices: torch.Tensor   # [B] stream row of each request's last new token


class ModelRunner:
    """Runs a :class:`LlamaForCausalLM` over batches whose KV lives in a :class:`PagedKVStore`."""

    def __init__(self, model: LlamaForCausalLM, kv_store: PagedKVStore) -> None:
        cfg = model.cfg
        key_cache = kv_store.layer_kv(0)[0]
        if (len(kv_store.kv_caches), *key_cache.shape[2:]) != (
                cfg.num_layers, cfg.num_kv_heads, cfg.head_dim):
            raise ValueError("KV store shape does not match the model config")
        self.model = model
        self.kv_store = kv_store
        self.max_group_tokens = decode_group_tokens(kv_store, cfg.num_layers)

    @classmethod
    def create(cls, cfg: LlamaConfig, *, num_blocks: int, block_size: int,
               num_host_blocks: int = 0, seed: int = 0, dtype: str | torch.dtype = "fp32",
               device: str | torch.device = "cpu") -> "ModelRunner":
        """A random-weight model and a matching KV store in one call."""
        model = build_model(cfg, seed=seed, dtype=dtype, device=device)
        store = PagedKVStore.for_model(cfg, num_blocks=num_blocks, block_size=block_size,
                                       num_host_blocks=num_host_blocks, dtype=dtype,
                                       device=device)
        return cls(model, store)

    @property
    def device(self) -> torch.device:
        return self.kv_store.device

    def prepare(self, batch: Sequence[RequestChunk]) -> StepInputs:
        """Pack the batch's tokens and build the attention metadata."""
        if not batch:
            raise ValueError("empty batch")
        counts = [c.num_new_tokens for c in batch]
        meta = build_attention_metadata(
            counts, [c.num_computed_tokens for c in batch], [c.block_table for c in batch],
            self.kv_store.block_size, self.device, self.max_group_tokens)
        ids = np.concatenate([np.asarray(c.token_ids, dtype=np.int64) for c in batch])
        last = np.cumsum(counts) - 1
        return StepInputs(torch.from_numpy(ids).to(self.device), meta,
                          torch.from_numpy(last).to(self.device))

    @torch.inference_mode()
    def forward(self, batch: Sequence[RequestChunk]) -> torch.Tensor:
        """Next-token logits ``[len(batch), vocab]`` (fp32) at each request's last new token.

        Writes every new token's K/V into the store as a side effect.
        """
        step = self.prepare(batch)
        return self.model(step.input_ids, step.meta.positions, self.kv_store.kv_caches,
                          step.meta, step.logits_indices)

    def greedy(self, batch: Sequence[RequestChunk]) -> list[int]:
        """The argmax next token of each request."""
        return self.forward(batch).argmax(-1).tolist()


def decode_group_tokens(kv_store: PagedKVStore, num_layers: int) -> int | None:
    """Tokens one decode group may gather: :data:`CPU_DECODE_GROUP_BYTES` worth on the CPU
    (at least one block), no cap on CUDA (one gather per group keeps kernel launches few)."""
    if kv_store.device.type != "cpu":
        return None
    per_token = kv_store.bytes_per_block // (num_layers * kv_store.block_size)
    return max(CPU_DECODE_GROUP_BYTES // per_token, kv_store.block_size)
