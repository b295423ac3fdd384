"""Paged attention (prefill over a cached prefix, batched decode) against a dense reference."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kvsim.real_backend.attention import (  # noqa: E402
    build_attention_metadata, dense_reference_attention, paged_attention,
)

HEAD_DIM = 16
TOL = 1e-4


def rel_err(out: "torch.Tensor", ref: "torch.Tensor") -> float:
    """Largest absolute error relative to the largest reference magnitude."""
    return float((out.double() - ref).abs().max() / ref.abs().max())


def slot(table: list[int], pos: int, block_size: int) -> int:
    return table[pos // block_size] * block_size + pos % block_size


class Case:
    """Requests ``(num_computed, num_new)`` with shuffled block tables over one cache whose
    unused slots hold large garbage (so any masking leak shows)."""

    def __init__(self, gen, specs, block_size, heads, kv_heads, max_group_tokens=None):
        self.specs, self.block_size, self.heads = specs, block_size, heads
        self.max_group_tokens = max_group_tokens
        need = [math.ceil((c + n) / block_size) for c, n in specs]
        perm = torch.randperm(sum(need) + 3, generator=gen).tolist()
        self.tables = [perm[sum(need[:i]):sum(need[:i + 1])] for i in range(len(specs))]
        shape = (len(perm), block_size, kv_heads, HEAD_DIM)
        self.key_cache = 100 * torch.randn(shape, generator=gen)
        self.value_cache = 100 * torch.randn(shape, generator=gen)
        self.keys = [torch.randn(c + n, kv_heads, HEAD_DIM, generator=gen) for c, n in specs]
        self.values = [torch.randn(c + n, kv_heads, HEAD_DIM, generator=gen) for c, n in specs]
        self.queries = [2 * torch.randn(n, heads, HEAD_DIM, generator=gen) for _, n in specs]
        self._store_prefixes()

    def _store_prefixes(self) -> None:
        flat_k = self.key_cache.view(-1, *self.key_cache.shape[2:])
        flat_v = self.value_cache.view(-1, *self.value_cache.shape[2:])
        for (computed, _), table, k, v in zip(self.specs, self.tables, self.keys, self.values):
            for pos in range(computed):
                flat_k[slot(table, pos, self.block_size)] = k[pos]
                flat_v[slot(table, pos, self.block_size)] = v[pos]

    def run(self) -> list["torch.Tensor"]:
        """Paged attention over the packed stream, split back per request."""
        new_k = torch.cat([k[c:] for (c, _), k in zip(self.specs, self.keys)])
        new_v = torch.cat([v[c:] for (c, _), v in zip(self.specs, self.values)])
        meta = build_attention_metadata([n for _, n in self.specs], [c for c, _ in self.specs],
                                        self.tables, self.block_size,
                                        max_group_tokens=self.max_group_tokens)
        out = paged_attention(torch.cat(self.queries), new_k, new_v, self.key_cache,
                              self.value_cache, meta, HEAD_DIM ** -0.5)
        return list(out.split([n for _, n in self.specs]))

    def check(self) -> None:
        for i, out in enumerate(self.run()):
            ref = dense_reference_attention(self.queries[i], self.keys[i], self.values[i],
                                            self.specs[i][0])
            assert rel_err(out, ref) < TOL, (i, self.specs[i], rel_err(out, ref))


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
@pytest.mark.parametrize("computed,new", [(0, 9), (5, 7), (16, 3), (17, 20)])
def test_prefill_over_cached_prefix(gen, block_size, computed, new):
    Case(gen, [(computed, new)], block_size, heads=4, kv_heads=4).check()


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (8, 1), (6, 3)])
def test_gqa_prefill_and_decode(gen, heads, kv_heads):
    Case(gen, [(0, 11), (6, 5), (13, 1), (2, 1)], 4, heads, kv_heads).check()


@pytest.mark.parametrize("block_size", [1, 2, 5, 16])
def test_batched_decode_unequal_lengths(gen, block_size):
    specs = [(c, 1) for c in (0, 4, 16, 33, 63, 7)]
    Case(gen, specs, block_size, heads=4, kv_heads=2).check()


@pytest.mark.parametrize("max_group_tokens", [1, 8, 40])
def test_batched_decode_in_capped_groups(gen, max_group_tokens):
    specs = [(c, 1) for c in (0, 4, 16, 33, 63, 7, 5, 6)]
    case = Case(gen, specs, 4, heads=4, kv_heads=2, max_group_tokens=max_group_tokens)
    case.check()


def test_mixed_batch_random_order(gen):
    lengths = torch.randint(0, 40, (8,), generator=gen).tolist()
    news = torch.randint(1, 4, (8,), generator=gen).tolist()
    Case(gen, list(zip(lengths, news)), 8, heads=4, kv_heads=2).check()


def test_new_tokens_are_written_to_their_slots(gen):
    case = Case(gen, [(5, 6), (9, 1)], 4, heads=2, kv_heads=2)
    case.run()
    flat_k = case.key_cache.view(-1, 2, HEAD_DIM)
    flat_v = case.value_cache.view(-1, 2, HEAD_DIM)
    for (computed, new), table, k, v in zip(case.specs, case.tables, case.keys, case.values):
        for pos in range(computed, computed + new):
            assert torch.equal(flat_k[slot(table, pos, 4)], k[pos])
            assert torch.equal(flat_v[slot(table, pos, 4)], v[pos])


def test_metadata_slots_positions_and_split():
    meta = build_attention_metadata([3, 1, 2], [5, 6, 0], [[7, 2], [4, 9], [1]], 4)
    assert meta.positions.tolist() == [5, 6, 7, 6, 0, 1]
    assert meta.slot_mapping.tolist() == [2 * 4 + 1, 2 * 4 + 2, 2 * 4 + 3, 9 * 4 + 2, 4, 5]
    assert [(s.token_start, s.num_tokens) for s in meta.prefills] == [(0, 3), (4, 2)]
    assert meta.decode.token_indices.tolist() == [3]
    assert meta.decode.context_lens.tolist() == [7]


def test_short_block_table_rejected():
    with pytest.raises(ValueError, match="block table"):
        build_attention_metadata([4], [5], [[0, 1]], 4)
    with pytest.raises(ValueError, match="new token"):
        build_attention_metadata([0], [5], [[0, 1]], 4)


def test_decode_groups_bound_padding_and_cover_every_request(gen):
    from kvsim.real_backend.attention import DECODE_PADDING_SLACK, decode_groups
    contexts = torch.randint(1, 3000, (40,), generator=gen).tolist()
    groups = decode_groups(contexts, 16)
    assert sorted(i for g in groups for i in g) == list(range(40))
    for g in groups:
        blocks = [-(-contexts[i] // 16) for i in g]
        assert len(g) * max(blocks) <= DECODE_PADDING_SLACK * sum(blocks) or len(g) == 1
    assert decode_groups([100] * 8, 16) == [list(range(8))]   # similar contexts: one group
    meta = build_attention_metadata([1, 1, 1], [2000, 3, 5], [list(range(126)), [126], [127]], 16)
    assert [b.token_indices.tolist() for b in meta.decodes] == [[0], [1, 2]]


def test_decode_groups_capped_by_gathered_tokens():
    """Contexts 70, 100, 80, 90 (5, 7, 5, 6 blocks of 16), longest first: with no cap one
    group; a cap of 224 tokens (14 blocks) holds two requests padded to 7 blocks, then two
    padded to 5; a cap below two blocks' worth leaves every request alone."""
    from kvsim.real_backend.attention import decode_groups
    assert decode_groups([70, 100, 80, 90], 16) == [[1, 3, 0, 2]]
    assert decode_groups([70, 100, 80, 90], 16, max_group_tokens=224) == [[1, 3], [0, 2]]
    assert decode_groups([70, 100, 80, 90], 16, max_group_tokens=96) == [[1], [3], [0], [2]]
    assert decode_groups([3000], 16, max_group_tokens=64) == [[0]]   # too long: alone


def test_cpu_runner_caps_decode_groups_at_cache_size():
    from shapes import llama
    from kvsim.real_backend.model_runner import CPU_DECODE_GROUP_BYTES, ModelRunner
    cfg = llama(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                      intermediate_size=128, vocab_size=100)
    runner = ModelRunner.create(cfg, num_blocks=4, block_size=8)
    per_token = 2 * 2 * 16 * 4          # K and V, 2 KV heads of 16 fp32 values
    assert runner.max_group_tokens == CPU_DECODE_GROUP_BYTES // per_token


def test_cuda_decode_groups_are_not_capped():
    from types import SimpleNamespace

    from kvsim.real_backend.model_runner import decode_group_tokens
    store = SimpleNamespace(device=torch.device("cuda"), bytes_per_block=1 << 20, block_size=16)
    assert decode_group_tokens(store, 2) is None
