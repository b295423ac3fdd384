"""Block copies of the paged KV store move exactly the right data (exact equality)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from kvsim.cache.step_plan import COMPACT, OFFLOAD, PROMOTE, SWAP_IN, SWAP_OUT  # noqa: E402
from kvsim.real_backend.kv_store import PagedKVStore  # noqa: E402
from shapes import llama  # noqa: E402

LAYERS, KV_HEADS, HEAD_DIM, BLOCK = 3, 2, 8, 4


@pytest.fixture
def gen() -> "torch.Generator":
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


def filled_store(gen, num_blocks=12, num_host_blocks=10) -> PagedKVStore:
    store = PagedKVStore(LAYERS, KV_HEADS, HEAD_DIM, num_blocks=num_blocks, block_size=BLOCK,
                         num_host_blocks=num_host_blocks)
    for tier in (store.device_kv, store.host_kv):
        tier.copy_(torch.randn(tier.shape, generator=gen))
    return store


def random_pairs(gen, num_src: int, num_dst: int, count: int) -> list[tuple[int, int]]:
    src = torch.randperm(num_src, generator=gen)[:count].tolist()
    dst = torch.randperm(num_dst, generator=gen)[:count].tolist()
    return list(zip(src, dst))


def assert_copied(before_src, before_dst, after_dst, pairs) -> None:
    """Destinations hold their sources' old contents in every layer; other blocks unchanged."""
    expected = before_dst.clone()
    for s, d in pairs:
        expected[:, :, d] = before_src[:, :, s]
    assert torch.equal(after_dst, expected)


@pytest.mark.parametrize("kind,src,dst", [
    (SWAP_OUT, "device", "host"), (OFFLOAD, "device", "host"),
    (SWAP_IN, "host", "device"), (PROMOTE, "host", "device"), (COMPACT, "device", "device"),
])
def test_copy_blocks_moves_exact_data(gen, kind, src, dst):
    store = filled_store(gen)
    before_src, before_dst = store.tier(src).clone(), store.tier(dst).clone()
    pairs = random_pairs(gen, store.tier(src).shape[2], store.tier(dst).shape[2], 5)
    moved = store.copy_blocks(kind, pairs)
    assert moved == 5 * store.bytes_per_block
    assert_copied(before_src, before_dst, store.tier(dst), pairs)
    if src != dst:
        assert torch.equal(store.tier(src), before_src)


def test_compaction_reads_every_source_before_writing(gen):
    store = filled_store(gen)
    before = store.device_kv.clone()
    pairs = [(2, 1), (1, 0), (5, 2), (0, 5)]      # chains and a cycle
    store.copy_blocks(COMPACT, pairs)
    assert_copied(before, before, store.device_kv, pairs)


def test_swap_out_then_in_round_trips(gen):
    store = filled_store(gen)
    original = store.device_kv[:, :, [3, 7]].clone()
    store.copy_blocks(SWAP_OUT, [(3, 0), (7, 9)])
    store.device_kv[:, :, [3, 7]] = 0
    store.copy_blocks(SWAP_IN, [(0, 7), (9, 3)])
    assert torch.equal(store.device_kv[:, :, 3], original[:, :, 1])
    assert torch.equal(store.device_kv[:, :, 7], original[:, :, 0])


def test_layer_views_alias_the_store(gen):
    store = filled_store(gen)
    key_cache, value_cache = store.layer_kv(1)
    assert key_cache.shape == (12, BLOCK, KV_HEADS, HEAD_DIM)
    key_cache[4].fill_(7.0)
    value_cache[4].fill_(-7.0)
    store.copy_blocks(SWAP_OUT, [(4, 2)])
    assert bool((store.host_kv[1, 0, 2] == 7.0).all())
    assert bool((store.host_kv[1, 1, 2] == -7.0).all())


def test_bad_transfers_rejected(gen):
    store = filled_store(gen)
    with pytest.raises(ValueError, match="unknown transfer kind"):
        store.copy_blocks("teleport", [(0, 1)])
    with pytest.raises(ValueError, match="twice"):
        store.copy_blocks(COMPACT, [(0, 1), (2, 1)])
    with pytest.raises(IndexError, match="host"):
        store.copy_blocks(SWAP_OUT, [(0, 10)])
    with pytest.raises(IndexError, match="device"):
        store.copy_blocks(SWAP_IN, [(0, 12)])
    assert store.copy_blocks(SWAP_OUT, []) == 0


def test_store_without_host_tier_and_sizes():
    cfg = llama(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                      intermediate_size=128, vocab_size=50)
    store = PagedKVStore.for_model(cfg, num_blocks=5, block_size=8, dtype="bf16")
    assert store.num_host_blocks == 0 and store.num_blocks == 5
    assert store.bytes_per_block == 8 * cfg.kv_bytes_per_token("bf16")
    assert store.layer_kv(0)[0].dtype == torch.bfloat16
    with pytest.raises(IndexError):
        store.copy_blocks(OFFLOAD, [(0, 0)])


def test_swap_and_compaction_preserve_model_outputs(gen):
    """A request swapped out, its blocks clobbered, swapped back into other blocks and then
    compacted continues exactly as if it had never moved."""
    from kvsim.real_backend.model_runner import ModelRunner, RequestChunk
    cfg = llama(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                      intermediate_size=128, vocab_size=50)
    tokens = torch.randint(0, 50, (15,), generator=gen).tolist()
    steady = ModelRunner.create(cfg, num_blocks=16, block_size=4, num_host_blocks=8)
    steady.forward([RequestChunk(tokens[:14], 0, [0, 1, 2, 3])])
    expected = steady.forward([RequestChunk(tokens[14:], 14, [0, 1, 2, 3])])

    moved = ModelRunner.create(cfg, num_blocks=16, block_size=4, num_host_blocks=8)
    moved.forward([RequestChunk(tokens[:14], 0, [0, 1, 2, 3])])
    store = moved.kv_store
    store.copy_blocks(SWAP_OUT, [(0, 5), (1, 6), (2, 7), (3, 0)])
    store.device_kv.normal_(generator=gen)                      # another request's data
    store.copy_blocks(SWAP_IN, [(5, 9), (6, 12), (7, 10), (0, 15)])
    store.copy_blocks(COMPACT, [(9, 1), (12, 2), (10, 3), (15, 4)])
    got = moved.forward([RequestChunk(tokens[14:], 14, [1, 2, 3, 4])])
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
