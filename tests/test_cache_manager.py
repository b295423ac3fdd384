"""Story tests for the KV cache manager: each test is one short scenario with exact expectations
(block ids, free-queue order, reference counts), following vLLM v1's prefix-caching semantics.

Block size is 4 throughout unless a test says otherwise; ``toks(n)`` is the prompt 0, 1, ..., n-1,
so two requests share a prefix exactly when they share leading token ids.
"""

from __future__ import annotations

import pytest

from kvsim.cache import BlockHashSource, CacheHit, KVCacheManager
from kvsim.workloads.identity import hash_token_blocks

BS = 4


def toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def refs(m: KVCacheManager) -> list[int]:
    return [m.ref_count(b) for b in range(m.num_blocks)]


def cached(m: KVCacheManager) -> list[int]:
    return [b for b in range(m.num_blocks) if m.is_cached(b)]


def admit(m: KVCacheManager, rid, prompt) -> list[int] | None:
    """Look the prompt up and allocate the rest of it, as a scheduler admits a request."""
    hit = m.lookup(prompt)
    return m.allocate(rid, prompt, len(prompt) - hit.num_tokens, hit)


# --- prefill ------------------------------------------------------------------------------

def test_fresh_pool_frees_in_ascending_order():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    assert m.free_queue() == [0, 1, 2, 3, 4, 5]
    assert m.num_free_blocks == 6
    assert refs(m) == [0] * 6
    assert cached(m) == []


def test_first_prefill_takes_blocks_from_the_head():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    assert m.lookup(toks(10)) == CacheHit([], 0)
    assert m.allocate("a", toks(10), 10) == [0, 1, 2]
    assert m.block_ids("a") == [0, 1, 2]
    assert m.num_slots("a") == 10
    assert m.free_queue() == [3, 4, 5]
    assert m.num_free_blocks == 3
    assert refs(m) == [1, 1, 1, 0, 0, 0]
    assert cached(m) == [0, 1]          # block 2 holds only tokens 8, 9: not full, not hashed


def test_chunked_prefill_hashes_only_computed_blocks():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    assert m.allocate("a", toks(12), 6) == [0, 1]
    assert cached(m) == [0]             # only 6 of 12 tokens have slots: one full block
    assert m.allocate("a", toks(12), 6) == [2]
    assert cached(m) == [0, 1, 2]


# --- sharing ------------------------------------------------------------------------------

def test_second_request_shares_the_cached_prefix():
    m = KVCacheManager(num_blocks=8, block_size=BS)
    m.allocate("a", toks(10), 10)                       # [0, 1, 2]
    hit = m.lookup(toks(9))
    assert hit.block_ids == [0, 1]
    assert hit.num_tokens == 8
    assert m.allocate("b", toks(9), 1, hit) == [3]
    assert m.block_ids("b") == [0, 1, 3]
    assert refs(m) == [2, 2, 1, 1, 0, 0, 0, 0]
    assert m.free_queue() == [4, 5, 6, 7]


def test_lookup_stops_at_the_first_miss():
    m = KVCacheManager(num_blocks=8, block_size=BS)
    m.allocate("a", toks(12), 12)                       # [0, 1, 2], all cached
    prompt = toks(4) + [99, 98, 97, 96] + toks(4, start=8) + [1]
    assert m.lookup(prompt).block_ids == [0]           # block 1 differs, block 2 then can't match


def test_lookup_has_no_side_effects():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    m.allocate("a", toks(8), 8)
    m.free("a")
    before = (m.free_queue(), refs(m), cached(m))
    assert m.lookup(toks(9)).block_ids == [0, 1]
    assert (m.free_queue(), refs(m), cached(m)) == before


def test_hit_on_free_cached_blocks_pulls_them_out_of_the_queue():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    m.allocate("a", toks(8), 8)                         # [0, 1], both cached
    m.free("a")
    assert m.free_queue() == [2, 3, 4, 5, 1, 0]
    assert admit(m, "b", toks(9)) == [2]
    assert m.block_ids("b") == [0, 1, 2]
    assert m.free_queue() == [3, 4, 5]
    assert refs(m) == [1, 1, 1, 0, 0, 0]


# --- decode -------------------------------------------------------------------------------

def test_decode_grows_one_block_per_boundary():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    seq = toks(6)
    assert m.allocate("a", seq, 6) == [0, 1]
    assert cached(m) == [0]
    seq.append(6)
    assert m.allocate("a", seq, 1) == []                # 7 slots: still inside block 1
    assert cached(m) == [0]
    seq.append(7)
    assert m.allocate("a", seq, 1) == []                # 8 slots: block 1 is now full...
    assert cached(m) == [0, 1]                          # ...so it is hashed
    seq.append(8)
    assert m.allocate("a", seq, 1) == [2]               # 9 slots cross the boundary
    assert m.block_ids("a") == [0, 1, 2]
    assert m.num_slots("a") == 9
    assert m.free_queue() == [3, 4, 5]
    assert cached(m) == [0, 1]
    assert m.lookup(toks(9)).block_ids == [0, 1]


def test_decode_block_is_found_by_a_later_request():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    seq = toks(3)
    m.allocate("a", seq, 3)
    for t in range(3, 9):
        seq.append(t)
        m.allocate("a", seq, 1)
    assert m.block_ids("a") == [0, 1, 2]
    assert m.lookup(toks(10)).block_ids == [0, 1]      # generated tokens are cached too


def test_decode_that_cannot_grow_returns_none():
    m = KVCacheManager(num_blocks=2, block_size=BS)
    seq = toks(8)
    assert m.allocate("a", seq, 8) == [0, 1]
    seq.append(8)
    assert m.allocate("a", seq, 1) is None
    assert m.block_ids("a") == [0, 1]
    assert m.num_slots("a") == 8
    assert m.free_queue() == []


# --- free and eviction order ---------------------------------------------------------------

def test_free_puts_partial_blocks_at_the_head_and_cached_ones_at_the_tail():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    m.allocate("a", toks(10), 10)                       # [0, 1, 2]; 2 is partial
    m.free("a")
    assert m.free_queue() == [2, 3, 4, 5, 1, 0]         # deepest cached block (1) evicted first
    assert refs(m) == [0] * 6
    assert cached(m) == [0, 1]                          # free cached blocks stay findable
    assert m.lookup(toks(9)).block_ids == [0, 1]


def test_unhashed_blocks_of_one_request_go_to_the_head_as_a_batch():
    m = KVCacheManager(num_blocks=6, block_size=BS, enable_prefix_caching=False)
    m.allocate("a", toks(12), 12)                       # [0, 1, 2]
    m.free("a")
    assert m.free_queue() == [2, 1, 0, 3, 4, 5]         # tail first, kept in that order


def test_shared_blocks_return_only_when_the_last_holder_frees():
    m = KVCacheManager(num_blocks=8, block_size=BS)
    m.allocate("a", toks(10), 10)                       # [0, 1, 2]
    admit(m, "b", toks(9))                              # [0, 1, 3]
    m.free("a")
    assert m.free_queue() == [2, 4, 5, 6, 7]
    assert refs(m) == [1, 1, 0, 1, 0, 0, 0, 0]
    m.free("b")
    assert m.free_queue() == [3, 2, 4, 5, 6, 7, 1, 0]
    assert refs(m) == [0] * 8


def test_older_chains_are_evicted_before_newer_ones():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    m.allocate("a", toks(8), 8)                         # [0, 1]
    m.allocate("b", toks(8, start=100), 8)              # [2, 3]
    m.free("a")
    m.free("b")
    assert m.free_queue() == [4, 5, 1, 0, 3, 2]


def test_partial_blocks_are_reused_before_cached_ones():
    m = KVCacheManager(num_blocks=4, block_size=BS)
    m.allocate("a", toks(6), 6)                         # [0, 1]; 1 partial
    m.allocate("b", toks(4, start=100), 4)              # [2]
    m.free("a")
    assert m.free_queue() == [1, 3, 0]
    assert m.allocate("c", toks(2, start=200), 2) == [1]
    assert m.allocate("d", toks(2, start=300), 2) == [3]
    assert cached(m) == [0, 2]                          # cached block 0 survived both


def test_reused_cached_block_loses_its_hash():
    m = KVCacheManager(num_blocks=3, block_size=BS)
    m.allocate("a", toks(8), 8)                         # [0, 1]
    m.free("a")
    assert m.free_queue() == [2, 1, 0]
    assert m.allocate("b", toks(8, start=100), 8) == [2, 1]     # evicts block 1, not 0
    assert cached(m) == [0, 1, 2]                       # 1 re-hashed with b's content
    assert m.lookup(toks(9)).block_ids == [0]           # a's second block is gone
    assert m.lookup(toks(9, start=100)).block_ids == [2, 1]
    m.free("b")
    assert m.allocate("c", toks(3, start=200), 3) == [0]        # oldest: a's first block
    assert not m.is_cached(0)
    assert m.lookup(toks(9)).block_ids == []


def test_evicting_the_deepest_block_keeps_its_ancestor_findable():
    m = KVCacheManager(num_blocks=4, block_size=BS)
    m.allocate("a", toks(8), 8)                         # [0, 1]
    m.free("a")                                         # [2, 3, 1, 0]
    m.allocate("x", toks(2, start=100), 2)              # 2
    m.allocate("y", toks(2, start=200), 2)              # 3
    m.allocate("z", toks(2, start=300), 2)              # 1: a's descendant block evicted
    assert m.free_queue() == [0]
    assert m.is_cached(0) and not m.is_cached(1)
    assert m.lookup(toks(9)).block_ids == [0]


# --- lookup never covers the last token ----------------------------------------------------

def test_lookup_never_covers_the_last_prompt_token():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    m.allocate("a", toks(8), 8)                         # [0, 1]
    assert m.lookup(toks(8)).block_ids == [0]           # block-aligned: last block recomputed
    assert m.lookup(toks(9)).block_ids == [0, 1]
    assert m.lookup(toks(4)).block_ids == []
    assert m.lookup(toks(1)).block_ids == []
    assert m.lookup([]).block_ids == []


def test_block_aligned_cached_prompt_recomputes_its_last_block():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    m.allocate("a", toks(8), 8)                         # [0, 1]
    assert admit(m, "b", toks(8)) == [2]
    assert m.block_ids("b") == [0, 2]
    assert refs(m) == [2, 1, 1, 0, 0, 0]
    assert cached(m) == [0, 1, 2]                       # 2 duplicates 1's content: not merged


# --- atomic failure ------------------------------------------------------------------------

def _state(m: KVCacheManager, rids):
    return (m.free_queue(), refs(m), cached(m), m.num_free_blocks,
            [(m.block_ids(r), m.num_slots(r), m.has_request(r)) for r in rids])


def test_failed_allocation_changes_nothing():
    m = KVCacheManager(num_blocks=4, block_size=BS)
    m.allocate("a", toks(8), 8)                         # [0, 1]
    before = _state(m, ["a", "b"])
    assert m.allocate("b", toks(12, start=100), 12) is None     # needs 3, 2 free
    assert _state(m, ["a", "b"]) == before
    assert not m.has_request("b")


def test_free_hit_blocks_count_toward_the_need():
    m = KVCacheManager(num_blocks=4, block_size=BS)
    m.allocate("a", toks(8), 8)                         # [0, 1]
    m.free("a")                                         # [2, 3, 1, 0]
    m.allocate("c", toks(4, start=100), 4)              # 2
    assert m.free_queue() == [3, 1, 0]
    prompt = toks(13)
    hit = m.lookup(prompt)
    assert hit.block_ids == [0, 1]
    # 2 new blocks fit the 3 free ones, but adopting the 2 free hit blocks makes 4.
    assert m.num_blocks_needed("b", 5, hit) == 4
    before = _state(m, ["b", "c"])
    assert m.allocate("b", prompt, 5, hit) is None
    assert _state(m, ["b", "c"]) == before
    assert m.lookup(prompt) == hit


def test_held_hit_blocks_do_not_count_toward_the_need():
    m = KVCacheManager(num_blocks=4, block_size=BS)
    m.allocate("a", toks(9), 9)                         # [0, 1, 2]
    hit = m.lookup(toks(9))
    assert m.num_blocks_needed("b", 1, hit) == 1
    assert m.allocate("b", toks(9), 1, hit) == [3]
    assert refs(m) == [2, 2, 1, 1]
    assert m.free_queue() == []


def test_allocation_that_exactly_fits_succeeds():
    m = KVCacheManager(num_blocks=3, block_size=BS)
    assert m.allocate("a", toks(12), 12) == [0, 1, 2]
    assert m.allocate("b", toks(1, start=100), 1) is None
    assert m.free_queue() == []


# --- caching disabled ---------------------------------------------------------------------

def test_caching_disabled_hashes_nothing_and_frees_to_the_head():
    m = KVCacheManager(num_blocks=6, block_size=BS, enable_prefix_caching=False)
    assert m.allocate("a", toks(8), 8) == [0, 1]
    assert cached(m) == []
    assert m.lookup(toks(9)) == CacheHit([], 0)
    assert m.allocate("b", toks(8), 8) == [2, 3]       # same content, no sharing
    m.free("a")
    assert m.free_queue() == [1, 0, 4, 5]
    m.free("b")
    assert m.free_queue() == [3, 2, 1, 0, 4, 5]
    assert cached(m) == []
    assert m.lookup(toks(9)).block_ids == []


# --- reset --------------------------------------------------------------------------------

def test_reset_prefix_cache_refused_while_blocks_are_held():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    m.allocate("a", toks(8), 8)
    m.allocate("b", toks(8, start=100), 8)
    m.free("a")
    assert m.reset_prefix_cache() is False
    assert cached(m) == [0, 1, 2, 3]
    assert m.lookup(toks(9)).block_ids == [0, 1]


def test_reset_prefix_cache_forgets_everything_once_all_is_free():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    m.allocate("a", toks(8), 8)
    m.free("a")
    queue = m.free_queue()
    assert m.reset_prefix_cache() is True
    assert cached(m) == []
    assert m.lookup(toks(9)).block_ids == []
    assert m.free_queue() == queue == [2, 3, 4, 5, 1, 0]
    assert m.allocate("b", toks(9), 9) == [2, 3, 4]     # from the head, nothing to evict
    assert cached(m) == [2, 3]


def test_reset_on_a_fresh_pool_succeeds():
    assert KVCacheManager(num_blocks=2, block_size=BS).reset_prefix_cache() is True


# --- max_model_len ------------------------------------------------------------------------

def test_max_model_len_caps_the_slots():
    m = KVCacheManager(num_blocks=3, block_size=BS, max_model_len=10)
    assert m.num_blocks_needed("a", 16) == 3
    assert m.allocate("a", toks(16), 16) == [0, 1, 2]  # 10 slots, not 16: fits 3 blocks
    assert m.num_slots("a") == 10
    assert cached(m) == [0, 1]
    assert m.allocate("a", toks(17), 1) == []          # no slot past max_model_len
    assert m.num_slots("a") == 10
    assert m.free_queue() == []


def test_max_model_len_caps_a_request_with_a_hit():
    m = KVCacheManager(num_blocks=6, block_size=BS, max_model_len=9)
    m.allocate("a", toks(8), 8)                         # [0, 1]
    hit = m.lookup(toks(12))
    assert hit.block_ids == [0, 1]
    assert m.allocate("b", toks(12), 4, hit) == [2]     # 8 + 4 capped at 9: one more block
    assert m.num_slots("b") == 9


# --- precomputed block hashes --------------------------------------------------------------

class HashedPrompt:
    """A prompt known only by its per-block hashes, as traces carry them."""

    def __init__(self, token_ids, block_size=BS):
        self.n = len(token_ids)
        self.hashes = hash_token_blocks(token_ids, block_size).tolist()

    def __len__(self) -> int:
        return self.n

    def block_hashes(self, start: int, end: int):
        return self.hashes[start:end]


def _story(prompt_of):
    """The same scenario, run with prompts made by ``prompt_of(token_ids)``."""
    m = KVCacheManager(num_blocks=5, block_size=BS)
    trace = []

    def snap(label, result):
        trace.append((label, result, m.free_queue(), refs(m), cached(m)))

    snap("a", m.allocate("a", prompt_of(toks(10)), 10))
    p = prompt_of(toks(9))
    hit = m.lookup(p)
    snap("lookup", hit)
    snap("b", m.allocate("b", p, 9 - hit.num_tokens, hit))
    grown = toks(9)
    for t in range(9, 13):
        grown.append(t)
        snap(f"b+{t}", m.allocate("b", prompt_of(grown), 1))
    m.free("a")
    snap("free a", None)
    p = prompt_of(toks(4, start=50))
    snap("c", m.allocate("c", p, 4, m.lookup(p)))
    m.free("b")
    snap("free b", None)
    p = prompt_of(toks(13))
    snap("lookup 13", m.lookup(p))
    return trace


def test_hashed_prompt_is_a_block_hash_source():
    assert isinstance(HashedPrompt(toks(5)), BlockHashSource)
    assert not isinstance(toks(5), BlockHashSource)


def test_block_hash_source_behaves_like_token_ids():
    by_tokens = _story(list)
    by_hashes = _story(HashedPrompt)
    assert by_hashes == by_tokens
    assert by_tokens[-1][1].block_ids == [0, 1, 3]     # b's decode block 3 was cached
    assert by_tokens[2][:3] == ("b", [3], [4])
    assert by_tokens[-2][2] == [4, 3, 1, 0]             # after b frees: partial head, chain tail


def test_block_hash_source_needs_no_token_ids():
    class Opaque:
        def __len__(self):
            return 9

        def block_hashes(self, start, end):
            return [1000 + i for i in range(start, end)]

    m = KVCacheManager(num_blocks=4, block_size=BS)
    assert m.allocate("a", Opaque(), 9) == [0, 1, 2]
    assert cached(m) == [0, 1]
    assert m.lookup(Opaque()).block_ids == [0, 1]


# --- identical blocks are not merged -------------------------------------------------------

def test_identical_blocks_are_not_merged():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    assert m.allocate("a", toks(8), 8) == [0, 1]       # no lookup: both compute it all
    assert m.allocate("b", toks(8), 8) == [2, 3]
    assert cached(m) == [0, 1, 2, 3]
    assert refs(m) == [1, 1, 1, 1, 0, 0]
    assert m.lookup(toks(9)).block_ids == [0, 1]       # the older copy is found first
    m.free("a")
    assert m.free_queue() == [4, 5, 1, 0]
    assert m.lookup(toks(9)).block_ids == [0, 1]       # free copies still win: older
    m.allocate("x", toks(2, start=100), 2)              # 4
    m.allocate("y", toks(2, start=200), 2)              # 5
    m.allocate("z", toks(2, start=300), 2)              # 1: evicts a's second block
    assert m.lookup(toks(9)).block_ids == [0, 3]       # the surviving copy of block 2 content
    m.allocate("w", toks(2, start=400), 2)              # 0
    assert m.lookup(toks(9)).block_ids == [2, 3]


# --- prefix statistics --------------------------------------------------------------------

def test_prefix_stats_count_queried_and_hit_tokens():
    m = KVCacheManager(num_blocks=8, block_size=BS)
    assert m.prefix_stats.hit_rate == 0.0
    hit = m.lookup(toks(10))
    m.record_query(10, hit)
    m.allocate("a", toks(10), 10, hit)
    hit = m.lookup(toks(9))
    m.record_query(9, hit)
    assert (m.prefix_stats.num_queries_tokens, m.prefix_stats.num_hit_tokens) == (19, 8)
    assert m.prefix_stats.hit_rate == pytest.approx(8 / 19)


# --- misuse -------------------------------------------------------------------------------

def test_hit_cannot_be_adopted_by_a_request_holding_blocks():
    m = KVCacheManager(num_blocks=6, block_size=BS)
    m.allocate("a", toks(8), 8)
    m.allocate("b", toks(2, start=100), 2)
    with pytest.raises(ValueError):
        m.allocate("b", toks(9), 1, m.lookup(toks(9)))


def test_free_of_an_unknown_request_is_a_no_op():
    m = KVCacheManager(num_blocks=2, block_size=BS)
    m.free("nobody")
    assert m.free_queue() == [0, 1]


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0)])
def test_bad_sizes_are_rejected(num_blocks, block_size):
    with pytest.raises(ValueError):
        KVCacheManager(num_blocks=num_blocks, block_size=block_size)
