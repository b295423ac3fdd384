"""vLLM 0.32's native KV offloading, as stories with exact block ids, hashes and steps (block
size 4).

The CPU managers (:mod:`kvsim.cache.cpu_offload`, :mod:`kvsim.cache.offload_managers`) first,
then the connector's timing (:mod:`kvsim.cache.offloading`): a prompt block is offered once
its step is planned, copied in the next step and loadable after it; a CPU hit loads in a
step the request does not run in, and a request whose hit is not ready waits.
"""

import pytest

from kvsim.cache.cpu_offload import LRUOffloadingManager
from kvsim.cache.offload_managers import ARCOffloadingManager, make_offloading_manager
from kvsim.cache.offloading import OffloadingKVCacheManager
from kvsim.cache.request_state import RequestState
from kvsim.cache.scheduler import Scheduler, SchedulerConfig
from kvsim.cache.step_plan import OFFLOAD, PROMOTE
from kvsim.workloads import Request
from kvsim.workloads.identity import ROOT_HASH, hash_token_blocks

A = list(range(100, 108))          # two full blocks
B = list(range(200, 216))          # four


def hashes(tokens):
    return hash_token_blocks(tokens, 4, ROOT_HASH).tolist()


def copies(m):
    return [(t.kind, t.pairs) for t in m.take_transfers()]


def stored(m, block_hashes, request="r"):
    result = m.prepare_store(block_hashes, request)
    m.complete_store(block_hashes)
    return result


# --- the CPU managers ---------------------------------------------------------------------


def test_a_finished_request_makes_its_blocks_the_most_recent_first_block_most():
    m = LRUOffloadingManager(4)
    stored(m, [1, 2, 3], "a")
    stored(m, [9], "b")
    assert m.blocks == [1, 2, 3, 9]               # stored: in the order offered
    assert m.lookup([1, 2]) == 2 and m.blocks == [1, 2, 3, 9]      # lookups touch nothing
    m.request_finished("a")
    assert m.blocks == [9, 3, 2, 1]
    result = m.prepare_store([4, 5], "c")
    assert result.evicted == [9, 3] and result.stored == [(4, 2), (5, 3)]   # last freed first


def test_a_request_uses_the_ready_blocks_it_offers_and_refreshes_them_when_done():
    m = LRUOffloadingManager(3)
    stored(m, [1, 2], "a")
    m.request_finished("a")                       # order 2, 1
    m.prepare_store([7], "c")                     # c stores 7 (pending)
    assert m.prepare_store([2, 7], "b").stored == []    # 2 held and ready: b uses it; 7 not
    m.complete_store([7])
    m.request_finished("b")
    m.request_finished("c")
    assert m.blocks == [1, 2, 7]


def test_a_lookup_waits_for_a_block_being_stored_and_stops_at_a_miss():
    m = LRUOffloadingManager(4)
    stored(m, [1])
    m.prepare_store([2], "b")
    assert m.lookup([1, 2]) is None               # vLLM's HIT_PENDING: the request waits
    assert m.lookup([1, 5, 2]) == 1
    m.complete_store([2])
    assert m.lookup([1, 2, 5]) == 2


def test_blocks_being_stored_loaded_or_offered_are_never_evicted():
    m = LRUOffloadingManager(2)
    stored(m, [1])
    m.prepare_store([2], "b")                     # 2 not ready
    assert m.prepare_load([1], "c") == [0]        # 1 pinned
    assert m.prepare_store([3], "d") is None and m.num_dropped_blocks == 1
    m.complete_load([1])
    m.complete_store([2])
    assert m.prepare_store([1, 3], "e").evicted == [2]     # 1 is offered: not a victim
    assert m.prepare_store([1, 3, 4], "f") is None         # (3 is being stored)


def test_a_failed_store_gives_its_blocks_back():
    m = LRUOffloadingManager(2)
    m.prepare_store([1, 2], "a")
    m.complete_store([2], success=False)
    assert m.get(2) is None and m.num_cached_blocks == 1
    m.request_finished("a")                       # (2's block, given up, is not touched)
    assert m.blocks == [1]
    assert m.prepare_store([3]).stored == [(3, 1)]


def test_the_reuse_gate_stores_a_block_only_once_it_was_offered_enough():
    m = make_offloading_manager(4, "lru", store_threshold=2)
    assert m.prepare_store([1, 2], "a").stored == []
    assert m.prepare_store([2, 3], "b").stored == [(2, 0)]
    assert m.counts == {1: 1, 2: 2, 3: 1}


def test_the_reuse_gate_keeps_the_hashes_offered_again_when_its_tracker_is_full():
    m = LRUOffloadingManager(4, store_threshold=2, max_tracker_size=2)
    m.prepare_store([1, 2])
    m.prepare_store([2, 3])                       # 2 counted again, 1 (oldest) gives way
    assert m.counts == {2: 2, 3: 1}
    m.prepare_store([2, 3, 4])                    # nothing but 2 and 3 to give way: 4 waits
    assert m.counts == {2: 3, 3: 2}


def test_arc_moves_a_block_reused_by_a_request_to_t2_when_it_finishes():
    m = ARCOffloadingManager(3)
    stored(m, [1, 2, 3], "a")
    m.request_finished("a")                       # inserted only: T1, first block newest
    assert (list(m.t1), list(m.t2)) == ([3, 2, 1], [])
    m.prepare_store([1], "b")                     # held and ready: b reuses it
    m.request_finished("b")
    assert (list(m.t1), list(m.t2)) == ([3, 2], [1])
    assert m.prepare_store([4], "c").evicted == [3] and list(m.b1) == [3]


def test_arc_evicts_from_t2_below_t1s_target_and_a_ghost_store_moves_the_target():
    m = ARCOffloadingManager(2)
    stored(m, [1, 2], "a")
    for request in ("b", "c"):
        m.prepare_store([1, 2], request)          # both reused: T2
        m.request_finished(request)
    m.request_finished("a")
    assert list(m.t2) == [2, 1]
    stored(m, [3], "d")                           # T1 empty (target 0): from T2
    assert list(m.b2) == [2] and list(m.t1) == [3]
    stored(m, [2], "e")                           # 2 was evicted from T2: T1's target falls
    assert m.target_t1_size == 0 and list(m.b1) == [3] and list(m.b2) == []
    stored(m, [3], "f")                           # ... from B1: it grows
    assert m.target_t1_size == 1.0


def test_unknown_policies_are_refused():
    with pytest.raises(ValueError, match="lru"):
        make_offloading_manager(4, "lfu")


# --- the connector's timing ---------------------------------------------------------------


def offloading(gpu=4, cpu=8):
    return OffloadingKVCacheManager(gpu, 4, offload=LRUOffloadingManager(cpu))


def test_a_prompt_block_is_offered_when_its_step_is_planned_and_loadable_after_its_copy():
    m = offloading()
    m.begin_step()                                # step 1
    assert m.allocate("a", A, 8) == [0, 1]
    m.end_schedule(["a"])                         # host blocks taken, not yet written
    assert copies(m) == [] and m.offload.lookup(hashes(A)) is None
    m.begin_step()                                # step 2: copied after step 1's forward
    assert copies(m) == [(OFFLOAD, [(0, 0), (1, 1)])]
    assert m.offload.lookup(hashes(A)) is None
    m.begin_step()                                # step 3: a still runs, its blocks load
    assert m.offload.lookup(hashes(A)) == 2


def test_blocks_decoding_fills_are_not_offered():
    m = offloading()
    m.begin_step()
    m.allocate("a", A[:6], 6)                     # one full prompt block
    m.end_schedule(["a"])
    m.begin_step()
    assert copies(m) == [(OFFLOAD, [(0, 0)])]
    m.allocate("a", A, 2)                         # decoding fills block 1
    m.end_schedule(["a"])
    m.begin_step()
    assert copies(m) == [] and m.offload.num_cached_blocks == 1


def test_a_lookup_continues_on_the_cpu_to_the_last_full_block_and_loads_into_new_blocks():
    m = offloading()
    m.begin_step()
    m.allocate("a", A, 8)
    m.end_schedule(["a"])
    m.begin_step()
    m.free("a")                                   # GPU free queue [1, 0, 2, 3]
    m.end_schedule([])
    m.begin_step()
    assert m.allocate("b", B, 16) == [2, 3, 1, 0]   # evicts a's blocks from the GPU
    m.end_schedule(["b"])
    hit = m.lookup(A)                             # the whole prompt: both blocks
    assert (hit.block_ids, hit.host_block_ids, hit.num_tokens, hit.load_async) == \
        ([], [0, 1], 8, True)
    m.begin_step()
    copies(m)
    m.free("b")                                   # GPU free queue [0, 1, 3, 2]
    assert m.allocate("a2", A, 0, hit) == [0, 1]
    assert copies(m) == [(PROMOTE, [(0, 0), (1, 1)])]
    assert m.offload.get(hashes(A)[0]).ref_cnt == 1      # pinned while it loads
    assert m.lookup(A + [1]).deferred                     # another hit on it waits
    assert m.pool.index.find_prefix(hashes(A)) == []      # registered once loaded
    m.end_schedule([])
    m.begin_step()
    assert m.offload.get(hashes(A)[0]).ref_cnt == 0
    assert m.pool.index.find_prefix(hashes(A)) == [0, 1]


def test_gpu_prefix_hits_are_offered_too_and_stored_only_once():
    m = offloading()
    m.begin_step()
    m.allocate("a", A, 8)
    m.end_schedule(["a"])
    m.begin_step()
    copies(m)
    m.free("a")
    m.end_schedule([])
    m.begin_step()
    hit = m.lookup(A + [1, 2, 3, 4, 5])           # A on the GPU: no CPU part
    assert hit.block_ids == [0, 1] and not hit.load_async
    assert m.allocate("c", A + [1, 2, 3, 4, 5], 5, hit) == [2, 3]
    m.end_schedule(["c"])
    m.begin_step()
    assert copies(m) == [(OFFLOAD, [(2, 2)])]     # the new full block; A's already there


def test_an_offer_the_cpu_has_no_room_for_is_made_again_at_the_requests_next_step():
    m = offloading(gpu=8, cpu=2)
    m.begin_step()
    m.allocate("a", A, 8)
    m.end_schedule(["a"])                         # stored: pending until copied
    m.allocate("b", B[:8], 8)
    m.end_schedule(["b"])                         # (a second offer in the same step)
    assert m.offload.num_dropped_blocks == 2 and m.acts_without_new_blocks(
        [RequestState(Request("b", 0.0, 8, 1), 4)])
    m.begin_step()
    assert copies(m) == [(OFFLOAD, [(0, 0), (1, 1)])]
    m.end_schedule(["b"])                         # a's blocks still being stored
    m.begin_step()
    m.end_schedule(["a"])                         # b not scheduled: not offered
    assert m.offload.num_dropped_blocks == 4
    m.end_schedule(["b"])                         # now a's are ready: evicted for b's
    assert m.offload.num_dropped_blocks == 4 and not m._unoffered
    m.begin_step()
    assert copies(m) == [(OFFLOAD, [(2, 1), (3, 0)])]     # a's host blocks, last freed first


def sequence(rid, tokens, output=1):
    return RequestState(Request(rid, float(rid), len(tokens), output,
                                prompt_token_ids=tokens), 4)


def stepper(kv, **config):
    sched = Scheduler(kv, SchedulerConfig(max_model_len=64, **config))
    steps = []

    def step():
        plan = sched.schedule()
        sched.update_from_output()
        steps.append(([(s.request_id, s.num_new_tokens, s.num_computed_tokens)
                       for s in plan.scheduled], plan.admitted,
                      [(t.kind, t.pairs) for t in plan.transfers]))
    return sched, step, steps


def test_the_scheduler_runs_a_cpu_hit_only_after_its_load():
    sched, step, steps = stepper(offloading(gpu=5, cpu=8))
    sched.add(sequence(1, A + [1]))               # 9 tokens: two full blocks
    step()
    sched.add(sequence(2, B + [2]))               # evicts 1's blocks from the GPU
    step()
    step()
    sched.add(sequence(3, A + [3]))               # A only on the CPU now
    step()
    step()
    assert steps == [
        ([(1, 9, 0)], [1], []),
        ([(2, 17, 0)], [2], [(OFFLOAD, [(0, 0), (1, 1)])]),
        # 2's blocks [2, 3, 4, 1, 0] (1's uncached tail went first); its full ones, copied
        ([], [], [(OFFLOAD, [(2, 2), (3, 3), (4, 4), (1, 5)])]),
        ([], [], [(PROMOTE, [(0, 0), (1, 1)])]),       # 3 waits while A loads
        ([(3, 1, 8)], [3], []),                        # then computes its last token
    ]


def test_a_request_waits_while_its_hit_is_stored_or_loaded_and_the_next_one_goes_first():
    """4 and 5 resend A while 1's store of it runs: they wait (skipped, the 1-token
    request 6 behind them goes first); once ready, 4 loads it, and 5, hitting blocks being
    loaded, waits a step more; then 5 hits A's first block on the GPU (a lookup there stops
    before the last token's block) and loads the last one. A whole-prompt hit recomputes the
    prompt's last token."""
    sched, step, steps = stepper(offloading(gpu=12, cpu=8))
    sched.add(sequence(1, A + [1]))
    step()                                        # 1 offers A
    for rid, tokens in ((4, A), (5, A), (6, [7])):
        sched.add(sequence(rid, tokens))
    step()                                        # A being copied: 4 and 5 wait
    step()                                        # A ready: 4 loads it; 5 waits for that
    step()
    step()
    assert [s[:2] for s in steps] == [
        ([(1, 9, 0)], [1]),
        ([(6, 1, 0)], [6]),
        ([], []),                                 # 4 loads A
        ([(4, 1, 7)], [4]),                       # 4 scheduled; 5 loads A's last block
        ([(5, 1, 7)], [5]),
    ]


def test_a_request_loading_its_hit_takes_no_seat_and_waits_for_one_once_loaded():
    """Two seats, 7 running: 3 is admitted to load A from the CPU and takes no seat (vLLM's
    kv_holding_waiting queue), so 8, behind it, is admitted in the same step; once loaded, 3
    waits for a seat (both are taken) and takes 7's when 7 finishes, after the running 8."""
    sched, step, steps = stepper(offloading(gpu=5, cpu=8), max_num_seqs=2)
    sched.add(sequence(1, A + [1]))
    step()
    sched.add(sequence(2, B + [2]))               # evicts 1's blocks from the GPU
    step()
    step()
    sched.add(sequence(7, [9], output=3))
    step()
    sched.add(sequence(3, A + [3]))               # A only on the CPU now
    sched.add(sequence(8, [5], output=4))
    step()
    assert [r.request_id for r in sched.running] == [7, 8]
    assert [r.request_id for r in sched.holding] == [3]
    step()
    step()
    assert [s[:2] for s in steps[3:]] == [
        ([(7, 1, 0)], [7]),
        ([(7, 1, 1), (8, 1, 0)], [8]),               # 3 loads, 8 runs
        ([(7, 1, 2), (8, 1, 1)], []),                # 3 loaded, no seat; 7 finishes
        ([(8, 1, 2), (3, 1, 8)], [3]),               # 3 in 7's seat, after 8: scheduled
    ]
    assert steps[4][2] == [(PROMOTE, [(0, 1), (1, 4)])]
