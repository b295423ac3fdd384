"""The host tier, as stories with exact block ids and copies (block size 4 throughout)."""

import numpy as np
import pytest

from kvsim.cache.host_tier import HostTier
from kvsim.cache.eviction import make_policy
from kvsim.cache.scheduler import Scheduler, SchedulerConfig
from kvsim.cache.request_state import RequestState
from kvsim.cache.step_plan import OFFLOAD, PROMOTE, SWAP_IN, SWAP_OUT
from kvsim.cache.tiered import TieredKVCacheManager
from kvsim.workloads import Request

A = list(range(100, 108))          # two full blocks
B = list(range(200, 208))
C = list(range(300, 308))


def tiered(gpu=2, host=4, **kw):
    return TieredKVCacheManager(gpu, 4, host=HostTier(host), **kw)


def copies(m):
    return [(t.kind, t.pairs) for t in m.take_transfers()]


# --- demotion and promotion --------------------------------------------------------------


def test_an_evicted_cached_block_is_demoted_tail_first_before_its_block_is_reused():
    m = tiered()
    assert m.allocate("a", A, 8) == [0, 1]
    m.free("a")                                  # free queue [1, 0]: a's tail goes first
    assert m.allocate("b", B, 8) == [1, 0]
    assert copies(m) == [(OFFLOAD, [(1, 0), (0, 1)])]
    assert m.host.lookup(m.lookup(A + [0]).host_block_ids) == []   # (ids, not hashes)
    assert m.num_transferred_blocks[OFFLOAD] == 2


def test_demotions_held_over_a_decode_step_are_the_copies_made_one_at_a_time():
    """Two allocations each evict one of a's cached blocks: held, both are demoted when the
    step's allocations are done, as one store; the host and the copies are as without."""
    def two_evictions(m):
        m.allocate("a", A, 8)
        m.free("a")
        m.allocate("b", B[:4], 4)
        m.allocate("c", C[:4], 4)
    one_by_one, held = tiered(), tiered()
    two_evictions(one_by_one)
    with held.demotions_held():
        two_evictions(held)
        assert len(held.pool.evicted) == 2 and copies(held) == []     # (not yet)
    assert copies(held) == copies(one_by_one) == [(OFFLOAD, [(1, 0), (0, 1)])]
    assert held.lookup(A + [0]).host_block_ids == one_by_one.lookup(A + [0]).host_block_ids \
        == [1, 0]
    assert held.num_transferred_blocks == one_by_one.num_transferred_blocks


def test_a_lookup_continues_into_the_host_and_allocation_promotes_into_new_blocks():
    m = tiered(gpu=3)
    m.allocate("a", A, 8)
    m.free("a")                                  # GPU free queue [2, 1, 0]
    assert m.allocate("b", B + [1, 2, 3, 4], 12) == [2, 1, 0]
    assert copies(m) == [(OFFLOAD, [(1, 0), (0, 1)])]
    m.free("b")                                  # GPU free queue [0, 1, 2]
    hit = m.lookup(A + [9])
    assert (hit.block_ids, hit.host_block_ids, hit.num_tokens) == ([], [1, 0], 8)
    # b's blocks are demoted as they are reused, tail first; a's host blocks are pinned while
    # they are read, so b's root evicts b's tail from the host (a second write of host block
    # 2: a second transfer). Then a's content is copied into the first new blocks.
    assert m.allocate("a2", A + [9], 1, hit) == [0, 1, 2]
    assert copies(m) == [(OFFLOAD, [(0, 2), (1, 3)]), (OFFLOAD, [(2, 2)]),
                         (PROMOTE, [(1, 0), (0, 1)])]
    assert m.lookup(A + [9]).block_ids == [0, 1]    # promoted blocks are cached on the GPU


def test_host_hits_count_in_the_prefix_stats_once_per_admission():
    m = tiered(gpu=3)
    m.allocate("a", A, 8)
    m.free("a")
    m.allocate("b", B, 8)                        # evicts a's tail block only
    m.free("b")
    hit = m.lookup(A + [9])
    assert (hit.block_ids, hit.host_block_ids, hit.num_tokens) == ([0], [0], 8)
    m.record_query(9, hit)
    stats = m.prefix_stats
    assert (stats.num_queries_tokens, stats.num_hit_tokens, stats.num_host_hit_tokens) == \
        (9, 8, 4)


def test_content_already_on_the_host_is_not_copied_again():
    m = tiered(gpu=3)
    m.allocate("a", A, 8)
    m.free("a")
    m.allocate("b", B + [1, 2, 3, 4], 12)        # a -> host
    m.free("b")
    m.allocate("a2", A + [9], 1, m.lookup(A + [9]))   # b -> host, a promoted
    m.free("a2")                                 # GPU free queue [2, 1, 0]
    copies(m)
    assert m.allocate("c", C + [1, 2, 3, 4], 12) == [2, 1, 0]   # evicts a: still on the host
    assert copies(m) == []
    assert m.host.num_stored_blocks == 5


def test_a_failed_allocation_with_a_host_hit_changes_nothing():
    m = tiered(gpu=2, host=4)
    m.allocate("a", A, 8)
    m.free("a")
    m.allocate("b", B, 8)
    hit = m.lookup(A + [9])                      # b holds both GPU blocks
    host_queue = m.host.pool.free_queue()
    assert m.allocate("a2", A + [9], 1, hit) is None
    assert m.host.pool.free_queue() == host_queue
    assert copies(m) == [(OFFLOAD, [(1, 0), (0, 1)])]      # b's demotions only
    assert m.block_ids("a2") == [] and m.num_free_blocks == 0


def test_a_full_host_of_swap_space_drops_demotions():
    m = tiered(gpu=4, host=2)
    m.allocate("x", C, 8)
    m.swap_out("x", 8)                           # both host blocks pinned
    copies(m)
    m.allocate("a", A, 8)
    m.free("a")
    m.allocate("b", B + B, 16)                   # evicts x's and a's cached blocks
    assert copies(m) == []                       # ... with nowhere to put them
    assert m.host.num_dropped_blocks == 4


def test_storing_many_hashes_is_storing_each_in_turn():
    host = HostTier(4)
    assert host.store_many([1, 2, 3]) == [0, 1, 2]    # block 3 stays empty, first to go
    assert host.pool.free_queue() == [3, 0, 1, 2]
    assert host.store_many([1, 2, 1]) == [None] * 3   # held: refreshed, 1 last of all
    assert host.pool.free_queue() == [3, 2, 1, 0]
    assert host.store_many([5, 6, 5]) == [3, 2, None]  # 6 evicts 3; 5 is held by then
    assert host.pool.free_queue() == [1, 0, 2, 3]
    assert host.find(3) is None and host.num_stored_blocks == 5


def test_a_hash_an_earlier_store_of_the_same_call_evicts_is_copied_again():
    host = HostTier(2)
    host.store_many([1, 2])                           # 1 in block 0, 2 in block 1
    assert host.store_many([7, 1]) == [0, 1]          # 7 evicts 1, which then evicts 2
    assert (host.find(7), host.find(1), host.find(2)) == (0, 1, None)


def test_write_through_copies_blocks_the_step_after_they_fill_and_evictions_are_free():
    m = tiered(write="through")
    m.begin_step()
    m.allocate("a", A, 8)
    assert copies(m) == []                       # the forward pass has not filled them yet
    m.begin_step()
    assert copies(m) == [(OFFLOAD, [(0, 0), (1, 1)])]
    m.free("a")
    m.begin_step()
    m.allocate("b", B, 8)                        # evicts a: already on the host
    assert copies(m) == []
    m.free("b")
    m.begin_step()
    assert copies(m) == [(OFFLOAD, [(1, 2), (0, 3)])]


@pytest.mark.parametrize("policy, kept", [("lru", [1]), ("lfu", [0])])
def test_the_host_tier_evicts_with_its_own_policy(policy, kept):
    """X is stored and used again, then Y is stored: a third block evicts X under LRU (least
    recently used) and Y under LFU (never used)."""
    host = HostTier(2, make_policy(policy))
    assert (host.store(11), host.store(11), host.store(22)) == (0, None, 1)
    assert host.store(33) == 1 - kept[0]
    assert [host.find(h) for h in (11, 22)] == ([None, 1] if policy == "lru" else [0, None])


# --- swapping ----------------------------------------------------------------------------


def test_swap_out_copies_the_computed_blocks_and_swap_in_brings_them_back():
    m = tiered(gpu=4, host=4, enable_prefix_caching=False)
    m.allocate("x", A + [1, 2], 10)              # blocks 0, 1, 2 (the last holds 2 tokens)
    assert m.can_swap_out("x", 10)
    m.swap_out("x", 10)
    assert copies(m) == [(SWAP_OUT, [(0, 0), (1, 1), (2, 2)])]
    assert m.is_swapped("x") and m.num_free_blocks == 4 and m.host.num_pinned_blocks == 3
    hit = m.swapped_hit(A + [1, 2, 3], "x")
    assert (hit.block_ids, hit.host_block_ids, hit.num_tokens, hit.swapped) == \
        ([], [0, 1, 2], 10, True)
    assert m.allocate("x", A + [1, 2, 3], 1, hit) == [2, 1, 0]
    assert copies(m) == [(SWAP_IN, [(0, 2), (1, 1), (2, 0)])]
    assert m.num_slots("x") == 11 and not m.is_swapped("x")
    assert m.host.num_pinned_blocks == 0


def test_swap_in_adopts_the_prefix_still_cached_on_the_gpu():
    m = tiered(gpu=4, host=4)
    m.allocate("x", A + [1, 2], 10)
    m.swap_out("x", 10)                          # blocks 0, 1 stay cached on the GPU
    copies(m)
    hit = m.swapped_hit(A + [1, 2, 3], "x")
    assert (hit.block_ids, hit.host_block_ids) == ([0, 1], [2])
    assert m.allocate("x", A + [1, 2, 3], 1, hit) == [2]
    assert copies(m) == [(SWAP_IN, [(2, 2)])]
    assert m.block_ids("x") == [0, 1, 2]


def _seq(rid, prompt, output):
    ids = np.arange(1000 * rid, 1000 * rid + prompt)
    return RequestState(Request(rid, float(rid), prompt, output, prompt_token_ids=ids), 4)


def _run(sched, steps):
    log = []
    for _ in range(steps):
        plan = sched.schedule()
        sched.update_from_output()
        log.append(({s.request_id: s.num_new_tokens for s in plan.scheduled},
                    plan.preempted, [(t.kind, len(t.pairs)) for t in plan.transfers]))
    return log


def two_requests(gpu: int, host: int, prompt: int):
    """A swapping scheduler over ``gpu`` blocks and ``host`` host blocks, given two requests of
    ``prompt`` tokens and 6 output tokens each."""
    kv = TieredKVCacheManager(gpu, 4, enable_prefix_caching=False, max_model_len=64,
                              host=HostTier(host))
    sched = Scheduler(kv, SchedulerConfig(max_model_len=64, preemption_mode="swap"))
    first, second = _seq(0, prompt, 6), _seq(1, prompt, 6)
    sched.add(first)
    sched.add(second)
    return sched, first, second


def test_swap_preemption_resumes_without_recomputing():
    """Three GPU blocks; two requests decode until the pool runs out; the victim is swapped."""
    sched, first, second = two_requests(gpu=3, host=8, prompt=4)
    kv = sched.kv
    log = _run(sched, 3)
    assert log == [({0: 4, 1: 4}, [], []), ({0: 1}, [1], [(SWAP_OUT, 1)]), ({0: 1}, [], [])]
    assert second.num_computed_tokens == 4 and kv.is_swapped(1)   # kept while swapped out
    log += _run(sched, 7)
    assert log[3:7] == [({0: 1}, [], [])] * 3 + [({1: 1}, [], [(SWAP_IN, 1)])]
    assert first.num_output_tokens == 6
    assert log[7:] == [({1: 1}, [], [])] * 3    # no recompute: decoding goes on
    assert (second.num_computed_tokens, second.num_output_tokens) == (8, 5)
    assert kv.prefix_stats.num_queries_tokens == 0      # caching off: vLLM records nothing


def test_swap_falls_back_to_recompute_when_the_host_has_no_room():
    """The victim holds 2 blocks of computed tokens; the host has 1."""
    sched, first, second = two_requests(gpu=5, host=1, prompt=8)
    assert _run(sched, 2) == [({0: 8, 1: 8}, [], []), ({0: 1}, [1], [])]
    assert second.num_computed_tokens == 0 and not sched.kv.is_swapped(1)


def test_swap_mode_without_a_host_tier_is_refused_by_the_config():
    from kvsim.errors import ConfigError
    from kvsim.sim.config import RunConfig
    with pytest.raises(ConfigError, match="host tier"):
        RunConfig(preemption_mode="swap").validate()
    with pytest.raises(ConfigError, match="not both"):
        RunConfig(num_cpu_blocks=8, kv_offloading_size=1.0).validate()
    with pytest.raises(ConfigError, match="paged"):
        RunConfig(num_cpu_blocks=8, layout="contiguous").validate()
