"""KV cache groups of a model whose layers attend differently, as vLLM v1 forms them.

vLLM gives each attention layer a spec (``FullAttentionSpec``, ``SlidingWindowSpec``,
``ChunkedLocalAttentionSpec``, ``MLAAttentionSpec``: MLA is full attention with one latent
"head") and, for a hybrid model, groups the layers so that every group has the same number of
layers (``_get_kv_cache_groups_uniform_page_size`` in ``vllm/v1/core/kv_cache_utils.py``):

* layers of one kind form a bucket; ``group_size`` is the smallest bucket's layer count, or the
  largest one's when that is below 1.5 times the smallest (less padding);
* each bucket of ``n`` layers splits into ``ceil(n / group_size)`` groups, group ``i`` taking
  layers ``i, i + groups, ...`` (so the last groups of a bucket may hold fewer layers: padding);
* all groups share ONE block pool; a block id holds, for the group that owns it, one page of
  each of that group's layers, so a block costs ``group_size`` pages of memory and
  ``num_blocks = memory // (group_size * page)``.

A request holds blocks in every group. A full-attention group keeps every block; a
sliding-window group frees the blocks wholly before ``num_computed - window + 1``; a chunked
local group frees the blocks before the start of the current chunk (``get_num_skipped_tokens``
of ``single_type_kv_cache_manager.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

FULL, SLIDING, CHUNKED = "full", "sliding", "chunked"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class LayerGroup:
    """One KV cache group: ``num_layers`` layers of one ``kind``; ``window`` is the sliding
    window (``sliding``) or the attention chunk (``chunked``) in tokens."""

    kind: str
    num_layers: int
    window: int = 0

    def skipped_tokens(self, num_computed: int) -> int:
        """Leading tokens no later token attends to (their whole blocks can be freed)."""
        if self.kind == SLIDING:
            return max(0, num_computed - self.window + 1)
        if self.kind == CHUNKED:
            return num_computed // self.window * self.window
        return 0

    def blocks_held(self, num_computed: int, num_tokens: int, block_size: int) -> int:
        """Blocks a request holds with slots for ``num_tokens`` tokens after its first
        ``num_computed`` were computed (skipped blocks freed)."""
        return cdiv(num_tokens, block_size) - self.skipped_tokens(num_computed) // block_size

    def blocks_at(self, length: int, block_size: int) -> int:
        """Blocks held while decoding the ``length``-th token (``length - 1`` computed)."""
        return self.blocks_held(max(length - 1, 0), length, block_size)

    def max_blocks_per_request(self, block_size: int, max_num_batched_tokens: int,
                               max_model_len: int) -> int:
        """vLLM's ``max_admission_blocks_per_request`` (``max_memory_usage_bytes / page``)."""
        if self.kind == SLIDING:
            tokens = min(self.window - 1 + max_num_batched_tokens, max_model_len)
            return cdiv(tokens, block_size) + 1
        if self.kind == CHUNKED:
            return cdiv(min(self.window + max_num_batched_tokens, max_model_len), block_size)
        return cdiv(max_model_len, block_size)

    def as_dict(self) -> dict:
        out = {"kind": self.kind, "num_layers": self.num_layers}
        if self.kind != FULL:
            out["sliding_window" if self.kind == SLIDING else "attention_chunk_size"] = self.window
        return out


def group_layers(layer_kinds, sliding_window: int = 0,
                 attention_chunk_size: int = 0) -> tuple[int, tuple[LayerGroup, ...]]:
    """``(group_size, groups)`` for layers of the given kinds (in layer order), as vLLM."""
    buckets: dict[str, int] = {}
    for kind in layer_kinds:
        buckets[kind] = buckets.get(kind, 0) + 1
    if not buckets:
        raise ValueError("a model needs at least one attention layer")
    smallest, largest = min(buckets.values()), max(buckets.values())
    size = largest if largest < smallest * 1.5 else smallest
    window = {FULL: 0, SLIDING: sliding_window, CHUNKED: attention_chunk_size}
    groups = []
    for kind, n in buckets.items():
        parts = cdiv(n, size)
        groups += [LayerGroup(kind, len(range(i, n, parts)), window[kind]) for i in range(parts)]
    return size, tuple(groups)


def blocks_per_request(groups, length: int, block_size: int) -> int:
    """Blocks of the shared pool one request of ``length`` tokens holds over all groups."""
    return sum(g.blocks_at(length, block_size) for g in groups)
