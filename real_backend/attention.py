"""Paged attention: prefill over a cached prefix and batched decode, read through block tables.

A request's KV lives in fixed-size blocks of the per-layer caches ``[num_blocks, block_size,
kv_heads, head_dim]``; token ``pos`` of a request lives in slot
``block_table[pos // block_size] * block_size + pos % block_size`` of the flattened cache.
Each step first writes its new tokens' K/V into their slots, then attends:

- a *prefill span* (a request with more than one new token: a whole prompt, a chunk of one, or a
  resumed request's recompute) attends over its whole context, read from its blocks, with a
  causal mask aligned to the bottom right (new token ``i`` sees positions ``<= start + i``);
  spans are computed one request at a time;
- *decode* requests (exactly one new token) are batched: their blocks are gathered into
  ``[batch, max_context, ...]`` tensors padded to the longest context and masked. To keep the
  gathered (padded) KV close to the KV actually read, requests are first sorted by context and
  split into groups whose padded blocks exceed their real blocks by at most
  :data:`DECODE_PADDING_SLACK` (one group when contexts are similar). A group may also be
  capped at a number of gathered tokens (``max_group_tokens``; the CPU runner caps it so the
  gathered K/V stay cache-sized, see :data:`kvsim.real_backend.model_runner.CPU_DECODE_GROUP_BYTES`).

:func:`dense_reference_attention` is the plain-tensor ground truth the tests compare against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

#: A decode group's padded blocks may exceed its real blocks by this factor.
DECODE_PADDING_SLACK = 1.25


@dataclass
class PrefillSpan:
    """One request with several new tokens: rows ``token_start ..`` of the packed stream."""

    token_start: int
    num_tokens: int
    num_computed: int          # tokens of this request already in the cache (its start position)
    block_ids: torch.Tensor    # [blocks covering the context], long, on the device

    @property
    def context_len(self) -> int:
        return self.num_computed + self.num_tokens


@dataclass
class DecodeBatch:
    """The requests with exactly one new token, attended to together."""

    token_indices: torch.Tensor   # [B] rows of the packed stream
    block_tables: torch.Tensor    # [B, max_blocks] long, padded with block 0 (masked out)
    context_lens: torch.Tensor    # [B] long
    mask: torch.Tensor            # [B, 1, 1, max_blocks * block_size] bool, True = attend


@dataclass
class AttentionMetadata:
    """Everything attention needs about one step's packed stream; built once, used by every
    layer."""

    block_size: int
    positions: torch.Tensor       # [T] long, position of each stream token in its request
    slot_mapping: torch.Tensor    # [T] long, flat cache slot each new token is written to
    prefills: list[PrefillSpan]
    decodes: list[DecodeBatch]    # decode groups (see DECODE_PADDING_SLACK); empty if none
    max_position: int             # largest entry of ``positions`` (known on the host)

    @property
    def decode(self) -> DecodeBatch | None:
        """The first (longest-context) decode group, or None."""
        return self.decodes[0] if self.decodes else None

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])


def _request_slots(block_table: Sequence[int], start: int, num: int,
                   block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``start .. start+num-1`` and their flat cache slots, for one request."""
    if num < 1:
        raise ValueError(f"every request needs >= 1 new token, got {num}")
    needed = _blocks_needed(start + num, block_size)
    if len(block_table) < needed:
        raise ValueError(f"block table has {len(block_table)} blocks; positions up to "
                         f"{start + num - 1} need {needed} (block_size={block_size})")
    pos = np.arange(start, start + num, dtype=np.int64)
    table = np.asarray(block_table[:needed], dtype=np.int64)
    return pos, table[pos // block_size] * block_size + pos % block_size


def _blocks_needed(context_len: int, block_size: int) -> int:
    return (context_len - 1) // block_size + 1


def _prefill_span(row: int, num: int, start: int, table: Sequence[int], block_size: int,
                  device: torch.device) -> PrefillSpan:
    ids = list(table[:_blocks_needed(start + num, block_size)])
    return PrefillSpan(row, num, start, torch.tensor(ids, dtype=torch.long, device=device))


def _decode_batch(rows: list[int], context_lens: list[int], tables: list[Sequence[int]],
                  block_size: int, device: torch.device) -> DecodeBatch:
    """Pad the decode requests' block tables to the longest context and build the mask."""
    blocks = [_blocks_needed(c, block_size) for c in context_lens]
    padded = np.zeros((len(rows), max(blocks)), dtype=np.int64)
    for i, (table, n) in enumerate(zip(tables, blocks)):
        padded[i, :n] = table[:n]
    lens = torch.tensor(context_lens, dtype=torch.long, device=device)
    span = torch.arange(padded.shape[1] * block_size, device=device)
    return DecodeBatch(
        token_indices=torch.tensor(rows, dtype=torch.long, device=device),
        block_tables=torch.from_numpy(padded).to(device),
        context_lens=lens,
        mask=(span[None, :] < lens[:, None])[:, None, None, :],
    )


def decode_groups(context_lens: Sequence[int], block_size: int,
                  slack: float = DECODE_PADDING_SLACK,
                  max_group_tokens: int | None = None) -> list[list[int]]:
    """Indices of decode requests, longest context first, split into groups where
    ``len(group) * max blocks <= slack * sum of blocks`` and, when ``max_group_tokens`` is
    given, ``len(group) * max blocks * block_size <= max_group_tokens`` (a request longer
    than that is a group of its own)."""
    blocks = [_blocks_needed(c, block_size) for c in context_lens]
    order = sorted(range(len(blocks)), key=lambda i: -blocks[i])
    cap = float("inf") if max_group_tokens is None else max_group_tokens / block_size
    groups: list[list[int]] = []
    total = 0
    for i in order:
        padded = (len(groups[-1]) + 1) * blocks[groups[-1][0]] if groups else 0
        if groups and padded <= slack * (total + blocks[i]) and padded <= cap:
            groups[-1].append(i)
            total += blocks[i]
        else:
            groups.append([i])
            total = blocks[i]
    return groups


def _decode_batches(rows: list[int], context_lens: list[int], tables: list[Sequence[int]],
                    block_size: int, device: torch.device,
                    max_group_tokens: int | None) -> list[DecodeBatch]:
    return [_decode_batch([rows[i] for i in g], [context_lens[i] for i in g],
                          [tables[i] for i in g], block_size, device)
            for g in decode_groups(context_lens, block_size,
                                   max_group_tokens=max_group_tokens)]


def build_attention_metadata(num_new_tokens: Sequence[int], num_computed_tokens: Sequence[int],
                             block_tables: Sequence[Sequence[int]], block_size: int,
                             device: str | torch.device = "cpu",
                             max_group_tokens: int | None = None) -> AttentionMetadata:
    """Metadata for requests packed in the given order (each with >= 1 new token); decode
    groups gather at most ``max_group_tokens`` tokens each (see :func:`decode_groups`)."""
    device = torch.device(device)
    reqs = list(zip(num_new_tokens, num_computed_tokens, block_tables))
    if not reqs:
        raise ValueError("empty batch")
    positions, slots = zip(*(_request_slots(t, c, n, block_size) for n, c, t in reqs))
    rows = np.concatenate([[0], np.cumsum(num_new_tokens)[:-1]]).tolist()
    prefills = [_prefill_span(row, n, c, t, block_size, device)
                for row, (n, c, t) in zip(rows, reqs) if n > 1]
    dec = [i for i, (n, _, _) in enumerate(reqs) if n == 1]
    decodes = _decode_batches([rows[i] for i in dec], [reqs[i][1] + 1 for i in dec],
                              [reqs[i][2] for i in dec], block_size, device, max_group_tokens)
    return AttentionMetadata(
        block_size=block_size,
        positions=torch.from_numpy(np.concatenate(positions)).to(device),
        slot_mapping=torch.from_numpy(np.concatenate(slots)).to(device),
        prefills=prefills, decodes=decodes,
        max_position=max(c + n - 1 for n, c, _ in reqs))


def write_kv(key_cache: torch.Tensor, value_cache: torch.Tensor, key: torch.Tensor,
             value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store new tokens' K/V ``[T, kv_heads, head_dim]`` into their flat cache slots."""
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slot_mapping, key)
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, slot_mapping, value)


def gather_context(cache: torch.Tensor, block_ids: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of a request, ``[length, kv_heads, head_dim]``."""
    blocks = cache.index_select(0, block_ids)
    return blocks.view(-1, *cache.shape[2:])[:length]


def prefill_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      key_cache: torch.Tensor, value_cache: torch.Tensor,
                      span: PrefillSpan, scale: float) -> torch.Tensor:
    """Attention of one request's new tokens ``[n, heads, head_dim]`` over its whole context.

    With no cached prefix the new K/V are the context; otherwise it is read from the blocks
    (which already hold the new tokens, written by :func:`write_kv`).
    """
    if span.num_computed:
        key = gather_context(key_cache, span.block_ids, span.context_len)
        value = gather_context(value_cache, span.block_ids, span.context_len)
    group = query.shape[1] // key.shape[1]
    if group > 1:
        key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    # 4-D [1, heads, tokens, head_dim]: the fused CPU/GPU kernels reject 3-D inputs.
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))
    if not span.num_computed:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    else:
        mask = _prefix_causal_mask(span, q.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out[0].transpose(0, 1)


def _prefix_causal_mask(span: PrefillSpan, device: torch.device) -> torch.Tensor:
    """``[n, context]`` bool: new token ``i`` (position ``start + i``) sees positions
    ``<= start + i``."""
    query_pos = torch.arange(span.num_tokens, device=device) + span.num_computed
    key_pos = torch.arange(span.context_len, device=device)
    return key_pos[None, :] <= query_pos[:, None]


def decode_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     batch: DecodeBatch, scale: float) -> torch.Tensor:
    """One new token per request, ``[B, heads, head_dim]``, over contexts padded and masked.

    Query heads are grouped under their KV head (``[B, kv_heads, group, head_dim]``), so GQA
    needs no copy of K/V.
    """
    num_seqs, num_heads, head_dim = query.shape
    kv_heads = key_cache.shape[2]
    key = _gather_padded(key_cache, batch.block_tables)
    value = _gather_padded(value_cache, batch.block_tables)
    q = query.view(num_seqs, kv_heads, num_heads // kv_heads, head_dim)
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=batch.mask, scale=scale)
    return out.reshape(num_seqs, num_heads, head_dim)


def _gather_padded(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """``[B, kv_heads, max_blocks * block_size, head_dim]`` from padded block tables."""
    num_seqs = block_tables.shape[0]
    blocks = cache.index_select(0, block_tables.reshape(-1))
    return blocks.view(num_seqs, -1, *cache.shape[2:]).transpose(1, 2)


def paged_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    key_cache: torch.Tensor, value_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Write the stream's new K/V into the caches, then attend; returns ``[T, heads, head_dim]``.

    ``query`` is ``[T, heads, head_dim]``, ``key``/``value`` ``[T, kv_heads, head_dim]``, with
    positional encoding already applied.
    """
    write_kv(key_cache, value_cache, key, value, meta.slot_mapping)
    out = torch.empty_like(query)
    for span in meta.prefills:
        rows = slice(span.token_start, span.token_start + span.num_tokens)
        out[rows] = prefill_attention(query[rows], key[rows], value[rows],
                                      key_cache, value_cache, span, scale)
    for batch in meta.decodes:
        idx = batch.token_indices
        decoded = decode_attention(query.index_select(0, idx), key_cache, value_cache,
                                   batch, scale)
        out.index_copy_(0, idx, decoded)
    return out


def dense_reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              num_computed: int, scale: float | None = None) -> torch.Tensor:
    """Ground truth in float64: ``query [n, heads, d]`` are the last ``n`` of the ``key/value
    [context, kv_heads, d]`` positions (``context = num_computed + n``), causally masked."""
    q, k, v = query.double(), key.double(), value.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    query_pos = torch.arange(q.shape[0], device=q.device) + num_computed
    hidden = torch.arange(k.shape[0], device=q.device)[None, :] > query_pos[:, None]
    scores = scores.masked_fill(hidden, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
