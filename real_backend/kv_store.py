"""The paged KV store: device blocks for attention, a host tier for swap and offload.

All layers' keys and values live in one tensor per tier, shaped
``[num_layers, 2, num_blocks, block_size, kv_heads, head_dim]`` (index 0 = key, 1 = value), so a
block copy moves that block in every layer with one ``index_select`` and one ``index_copy_``
whatever the number of layers. :meth:`PagedKVStore.layer_kv` hands attention the per-layer views
``[num_blocks, block_size, kv_heads, head_dim]``.

Block copies follow the transfer kinds of :mod:`kvsim.cache.step_plan`: swap out and offload go
device -> host, swap in and promote host -> device, compaction device -> device. Every source of one
call is read before any destination is written (snapshot semantics), so overlapping compaction
moves such as ``[(2, 1), (1, 0)]`` are safe in any order.
"""

from __future__ import annotations

from typing import Sequence

import torch

from kvsim.cache.step_plan import COMPACT, OFFLOAD, PROMOTE, SWAP_IN, SWAP_OUT

from kvsim.real_backend.backend_model import LlamaConfig
from kvsim.real_backend.llama import resolve_dtype

DEVICE, HOST = "device", "host"
# kind -> (source tier, destination tier)
TRANSFER_DIRECTIONS = {
    SWAP_OUT: (DEVICE, HOST), OFFLOAD: (DEVICE, HOST),
    SWAP_IN: (HOST, DEVICE), PROMOTE: (HOST, DEVICE),
    COMPACT: (DEVICE, DEVICE),
}


class PagedKVStore:
    """Per-layer K/V blocks on the device plus an optional host tier of blocks."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, *,
                 num_blocks: int, block_size: int, num_host_blocks: int = 0,
                 dtype: str | torch.dtype = "fp32", device: str | torch.device = "cpu") -> None:
        if num_blocks < 1 or block_size < 1 or num_host_blocks < 0:
            raise ValueError(f"bad sizes: num_blocks={num_blocks}, block_size={block_size}, "
                             f"num_host_blocks={num_host_blocks}")
        self.block_size = block_size
        self.dtype = resolve_dtype(dtype)
        self.device = torch.device(device)
        self._block_shape = (block_size, num_kv_heads, head_dim)
        self.device_kv = self._allocate(num_layers, num_blocks, self.device)
        self.host_kv = self._allocate(num_layers, num_host_blocks, torch.device("cpu"),
                                      pin=self.device.type == "cuda")
        self._layer_views = [(self.device_kv[i, 0], self.device_kv[i, 1])
                             for i in range(num_layers)]

    @classmethod
    def for_model(cls, cfg: LlamaConfig, **kwargs) -> "PagedKVStore":
        """A store shaped for ``cfg`` (keyword arguments as for the constructor)."""
        return cls(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, **kwargs)

    def _allocate(self, num_layers: int, num_blocks: int, device: torch.device,
                  pin: bool = False) -> torch.Tensor:
        """Zero-filled (masked padding must never read NaN garbage)."""
        shape = (num_layers, 2, num_blocks, *self._block_shape)
        pin = pin and torch.cuda.is_available()
        return torch.zeros(shape, dtype=self.dtype, device=device, pin_memory=pin)

    @property
    def num_blocks(self) -> int:
        return self.device_kv.shape[2]

    @property
    def num_host_blocks(self) -> int:
        return self.host_kv.shape[2]

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block occupies across all layers, keys and values."""
        return self.device_kv[:, :, 0].numel() * self.device_kv.element_size()

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(key_cache, value_cache)`` of one layer, each ``[num_blocks, block_size, kv_heads,
        head_dim]`` (views: writes land in the store)."""
        return self._layer_views[layer]

    @property
    def kv_caches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's ``(key_cache, value_cache)``, in layer order."""
        return self._layer_views

    def tier(self, name: str) -> torch.Tensor:
        """The whole ``device`` or ``host`` tensor."""
        return {DEVICE: self.device_kv, HOST: self.host_kv}[name]

    def copy_blocks(self, kind: str, pairs: Sequence[tuple[int, int]]) -> int:
        """Copy whole blocks ``(source id, destination id)`` in the direction ``kind`` implies
        (a :mod:`kvsim.cache.step_plan` transfer kind). Returns the bytes moved."""
        if kind not in TRANSFER_DIRECTIONS:
            raise ValueError(f"unknown transfer kind {kind!r}; "
                             f"expected one of {sorted(TRANSFER_DIRECTIONS)}")
        if not pairs:
            return 0
        src_name, dst_name = TRANSFER_DIRECTIONS[kind]
        src, dst = self.tier(src_name), self.tier(dst_name)
        src_ids, dst_ids = zip(*pairs)
        _check_ids(src_ids, src.shape[2], src_name, "source")
        _check_ids(dst_ids, dst.shape[2], dst_name, "destination")
        if len(set(dst_ids)) != len(dst_ids):
            raise ValueError(f"{kind}: a destination block appears twice in {list(pairs)}")
        _move_blocks(src, dst, src_ids, dst_ids)
        return len(pairs) * self.bytes_per_block


def _check_ids(ids: Sequence[int], limit: int, tier: str, role: str) -> None:
    """Every id must name a block of the tier."""
    bad = [i for i in ids if not 0 <= i < limit]
    if bad:
        raise IndexError(f"{role} block ids {bad[:5]} outside the {tier} tier of {limit} blocks")


def _move_blocks(src: torch.Tensor, dst: torch.Tensor, src_ids: Sequence[int],
                 dst_ids: Sequence[int]) -> None:
    """Gather the source blocks (all layers), ship them across, scatter into the destination."""
    src_idx = torch.tensor(src_ids, dtype=torch.long, device=src.device)
    dst_idx = torch.tensor(dst_ids, dtype=torch.long, device=dst.device)
    staged = src.index_select(2, src_idx)
    dst.index_copy_(2, dst_idx, staged.to(dst.device))
