"""vLLM's native KV offloading, as stories with exact block ids, hashes and steps (block size 4).

The CPU managers (:mod:`kvsim.cache.cpu_offload`) first, then the connector's timing
(:mod:`kvsim.cache.offloading`): a block is stored once the step that fills it has run, it is
loadable once its request is done, and a CPU hit loads in a step the request does not run in.
"""

import pytest

from kvsim.cache.cpu_offload import LRUOffloadingManager
from kvsim.cache.offload_managers import (ARCOffloadingManager, FilterReusedOffloadingManager,
                                          make_offloading_manager)
from kvsim.cache.offloading import OffloadingKVCacheManager
from kvsim.cache.scheduler import Scheduler, SchedulerConfig
from kvsim.cache.request_state import RequestState
from kvsim.cache.step_plan import OFFLOAD, PROMOTE
from kvsim.workloads import Request
from kvsim.workloads.identity import ROOT_HASH, hash_token_blocks

A = list(range(100, 108))          # two full blocks
B = list(range(200, 216))          # four


def hashes(tokens):
    return hash_token_blocks(tokens, 4, ROOT_HASH).tolist()


def copies(m):
    return [(t.kind, t.pairs) for t in m.take_transfers()]


def stored(m, block_hashes):
    result = m.prepare_store(block_hashes)
    m.complete_store(block_hashes)
    return result


# --- the CPU managers ---------------------------------------------------------------------


def test_lru_evicts_the_least_recently_touched_ready_block():
    m = LRUOffloadingManager(3)
    stored(m, [1, 2, 3])
    m.touch([1])                                  # order now 2, 3, 1
    result = m.prepare_store([4])
    assert result.evicted == [2] and result.stored == [(4, 1)]   # 4 reuses 2's host block
    assert m.lookup([3, 1]) == 2 and m.lookup([4]) == 0          # 4 is not ready yet


def test_blocks_being_stored_or_loaded_are_never_evicted():
    m = LRUOffloadingManager(2)
    stored(m, [1])
    m.prepare_store([2])                          # 2 not ready
    assert m.prepare_load([1]) == [0]             # 1 pinned
    assert m.prepare_store([3]) is None and m.num_dropped_blocks == 1
    m.complete_load([1])
    assert m.prepare_store([3]).evicted == [1]


def test_a_failed_store_gives_its_blocks_back():
    m = LRUOffloadingManager(2)
    m.prepare_store([1, 2])
    m.complete_store([2], success=False)
    assert m.get(2) is None and m.num_cached_blocks == 1
    assert m.prepare_store([3]).stored == [(3, 1)]


def test_touching_a_chain_again_finds_blocks_given_up_and_stored_again_since():
    m, plain = LRUOffloadingManager(4), LRUOffloadingManager(4)
    chain = [1, 2, 3]
    looked_up = []

    def hashes_at(positions):
        looked_up.append(list(positions))
        return [chain[p] for p in positions]

    for manager in (m, plain):
        stored(manager, [1, 2, 3])
        stored(manager, [9])
    m.touch_chain("a", 3, hashes_at)
    plain.touch(chain)
    assert m.blocks == plain.blocks == [9, 3, 2, 1] and looked_up == [[0, 1, 2]]
    for manager in (m, plain):
        assert stored(manager, [5, 6]).evicted == [9, 3]
        assert stored(manager, [3]).evicted == [2]     # 3 again, in 2's old host block
    m.touch_chain("a", 3, hashes_at)
    plain.touch(chain)
    assert m.blocks == plain.blocks == [5, 6, 3, 1]
    assert looked_up[1] == [1, 2]                      # 1's block was kept: not looked up
    m.touch_chain("a", 2, hashes_at)                   # 2 is still not held
    assert m.blocks == [5, 6, 3, 1] and looked_up[2] == [1]    # (applied to be read)


def test_arc_promotes_a_touched_block_and_evicts_from_t1_first():
    m = ARCOffloadingManager(3)
    stored(m, [1, 2, 3])
    m.touch([1])                                  # 1 seen again: T2
    assert list(m.t1) == [2, 3] and list(m.t2) == [1]
    result = m.prepare_store([4])
    assert result.evicted == [2] and list(m.b1) == [2]
    m.touch([2])                                  # a ghost hit in B1: T1 should grow
    assert m.target_t1_size == 1


def test_arc_evicts_from_t2_when_t1_is_under_its_target():
    m = ARCOffloadingManager(2)
    stored(m, [1, 2])
    m.touch([1, 2])                               # both in T2, 1 the most recent
    m.target_t1_size = 1
    assert m.prepare_store([3]).evicted == [2] and list(m.b2) == [2]


def test_the_reuse_gate_stores_a_block_only_after_it_was_looked_up_enough():
    m = make_offloading_manager(4, "lru", store_threshold=2)
    assert isinstance(m, FilterReusedOffloadingManager)
    m.count([1, 2])
    assert m.prepare_store([1, 2]).stored == []
    m.count([2])
    assert m.prepare_store([1, 2]).stored == [(2, 0)]


def test_a_manager_with_its_own_recency_hooks_stores_one_block_as_any_batch():
    class Evicts(LRUOffloadingManager):
        def _victims(self, n):
            return super()._victims(n)

    assert LRUOffloadingManager._stores_one_by_scalars
    assert not ARCOffloadingManager._stores_one_by_scalars
    assert not Evicts._stores_one_by_scalars


def test_unknown_policies_are_refused():
    with pytest.raises(ValueError, match="lru"):
        make_offloading_manager(4, "lfu")


# --- the connector's timing ---------------------------------------------------------------


def offloading(gpu=4, cpu=8):
    return OffloadingKVCacheManager(gpu, 4, offload=LRUOffloadingManager(cpu))


def test_a_filled_block_is_copied_after_its_step_and_loadable_after_its_request():
    m = offloading()
    m.begin_step()                                # step 1
    assert m.allocate("a", A, 8) == [0, 1]
    assert copies(m) == []                        # host blocks taken, not yet written
    assert m.offload.lookup(hashes(A)) == 0
    m.begin_step()                                # step 2: the copies follow step 1's forward
    assert copies(m) == [(OFFLOAD, [(0, 0), (1, 1)])]
    m.free("a")                                   # a is done after step 2
    assert m.offload.lookup(hashes(A)) == 0
    m.begin_step()                                # step 3
    assert m.offload.lookup(hashes(A)) == 2


def test_a_lookup_continues_on_the_cpu_and_the_load_goes_into_new_blocks():
    m = offloading()
    m.begin_step()
    m.allocate("a", A, 8)
    m.begin_step()
    m.free("a")                                   # GPU free queue [2, 3, 1, 0]
    m.begin_step()
    assert m.allocate("b", B, 16) == [2, 3, 1, 0]   # evicts a's blocks from the GPU
    copies(m)
    m.begin_step()
    assert copies(m) == [(OFFLOAD, [(2, 2), (3, 3), (1, 4), (0, 5)])]
    m.free("b")                                   # GPU free queue [0, 1, 3, 2]
    hit = m.lookup(A + [0])
    assert (hit.block_ids, hit.host_block_ids, hit.num_tokens, hit.load_async) == \
        ([], [0, 1], 8, True)
    assert m.allocate("a2", A + [0], 0, hit) == [0, 1]
    assert copies(m) == [(PROMOTE, [(0, 0), (1, 1)])]
    assert m.offload.get(hashes(A)[0]).ref_cnt == 1      # pinned while it loads
    m.begin_step()
    assert m.offload.get(hashes(A)[0]).ref_cnt == 0


def test_gpu_prefix_hits_are_stored_too_and_only_once():
    m = offloading()
    m.begin_step()
    m.allocate("a", A, 8)
    m.begin_step()
    copies(m)
    m.free("a")
    m.begin_step()
    hit = m.lookup(A + [1, 2, 3, 4, 5])           # A on the GPU: no CPU part
    assert hit.block_ids == [0, 1] and not hit.load_async
    assert m.allocate("c", A + [1, 2, 3, 4, 5], 5, hit) == [2, 3]
    m.begin_step()
    assert copies(m) == [(OFFLOAD, [(2, 2)])]     # the new full block; A's already there


def test_a_request_preempted_while_planned_gives_up_the_stores_of_its_step():
    m = offloading()
    m.begin_step()
    m.allocate("a", A, 8)                         # planned, then preempted before running
    m.free("a")
    assert copies(m) == [] and m.offload.num_cached_blocks == 0
    m.begin_step()
    assert copies(m) == []


def sequence(rid, tokens, output=1):
    return RequestState(Request(rid, float(rid), len(tokens), output,
                            prompt_token_ids=tokens), 4)


def test_the_scheduler_runs_a_cpu_hit_only_after_its_load():
    kv = offloading(gpu=5, cpu=8)
    sched = Scheduler(kv, SchedulerConfig(max_model_len=64))
    steps = []

    def step():
        plan = sched.schedule()
        sched.update_from_output()
        steps.append(([(s.request_id, s.num_new_tokens, s.num_computed_tokens)
                       for s in plan.scheduled], plan.admitted,
                      [(t.kind, t.pairs) for t in plan.transfers]))

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
        ([], [3], [(PROMOTE, [(0, 0), (1, 1)])]),      # 3 waits while A loads
        ([(3, 1, 8)], [], []),                         # then computes its last token
    ]
