"""Scheduler stories with exact expectations (block size 4 throughout)."""

import numpy as np

from kvsim.cache import KVCacheManager
from kvsim.cache.scheduler import Scheduler, SchedulerConfig
from kvsim.cache.request_state import RequestState
from kvsim.workloads import Request


def make(num_blocks=16, **config):
    kv = KVCacheManager(num_blocks, 4, max_model_len=config.get("max_model_len", 64))
    return Scheduler(kv, SchedulerConfig(**{"max_model_len": 64, **config}))


def add(sched, rid, prompt, output, priority=0, tokens=None):
    ids = np.array(tokens if tokens is not None else range(100 * rid, 100 * rid + prompt))
    seq = RequestState(Request(rid, float(rid), len(ids), output, prompt_token_ids=ids,
                           priority=priority), 4)
    sched.add(seq)
    return seq


def step(sched):
    plan = sched.schedule()
    out = sched.update_from_output()
    return ({s.request_id: s.num_new_tokens for s in plan.scheduled}, plan.preempted,
            [s.request_id for s in out.finished])


def test_a_long_prompt_is_chunked_by_the_token_budget_and_emits_after_its_last_chunk():
    sched = make(max_num_batched_tokens=8)
    seq = add(sched, 0, prompt=20, output=2)
    assert [step(sched) for _ in range(4)] == [
        ({0: 8}, [], []), ({0: 8}, [], []), ({0: 4}, [], []), ({0: 1}, [], [0])]
    assert seq.num_output_tokens == 2


def test_running_requests_come_first_then_waiting_ones_fill_the_budget():
    sched = make(max_num_batched_tokens=10)
    add(sched, 0, prompt=6, output=3)
    add(sched, 1, prompt=6, output=3)
    assert step(sched) == ({0: 6, 1: 4}, [], [])
    assert step(sched) == ({0: 1, 1: 2}, [], [])


def test_the_whole_sequence_must_fit_before_admission():
    """4 blocks: request 0 holds 3; request 1's 8-token prompt needs 2 > 1 free."""
    sched = make(num_blocks=4)
    add(sched, 0, prompt=10, output=4)
    add(sched, 1, prompt=8, output=1)
    assert step(sched) == ({0: 10}, [], [])
    assert sched.num_waiting == 1
    assert step(sched) == ({0: 1}, [], [])


def test_fcfs_preempts_the_last_running_request_and_admits_nobody_that_step():
    """Three blocks; two requests decode until the pool runs out."""
    sched = make(num_blocks=3)
    first = add(sched, 0, prompt=4, output=6)
    second = add(sched, 1, prompt=3, output=6)
    assert step(sched) == ({0: 4, 1: 3}, [], [])       # blocks 0 | 1
    assert step(sched) == ({0: 1, 1: 1}, [], [])       # 0 opens block 2
    # request 1 needs a block for its 5th token: none free -> it is the last, preempted
    assert step(sched) == ({0: 1}, [1], [])
    assert (second.num_computed_tokens, second.num_output_tokens) == (0, 2)
    assert second.num_preemptions == 1 and first.num_preemptions == 0


def test_a_preempted_request_finds_its_own_full_blocks_when_it_resumes():
    """Block 1 of the victim was full (prompt 3 + 1 output), so it stays cached after the
    preemption and the resume looks it up (its 5 tokens allow one block of hit)."""
    sched = make(num_blocks=4)
    add(sched, 0, prompt=8, output=6)
    victim = add(sched, 1, prompt=3, output=6)
    assert step(sched) == ({0: 8, 1: 3}, [], [])       # blocks 0,1 | 2
    assert step(sched) == ({0: 1, 1: 1}, [], [])       # 0 opens block 3; 1 fills block 2
    assert sched.kv.is_cached(2)
    assert step(sched) == ({0: 1}, [1], [])            # 1 needs a 2nd block: none free
    assert sched.kv.free_queue() == [2]
    assert sched.kv.lookup(victim).block_ids == [2]


def test_priority_preemption_takes_the_worst_request_even_if_already_scheduled():
    """The low-priority request runs first in the running queue and is scheduled, then the
    high-priority one needs a block: the low one is preempted and its tokens go back."""
    sched = make(num_blocks=3, policy="priority")
    low = add(sched, 0, prompt=4, output=8, priority=5)
    assert step(sched) == ({0: 4}, [], [])
    high = add(sched, 1, prompt=4, output=8, priority=0)
    assert step(sched) == ({0: 1, 1: 4}, [], [])       # low opens block 1, high takes 2
    assert step(sched) == ({1: 1}, [0], [])            # high needs a block: low goes
    assert (low.num_preemptions, high.num_preemptions) == (1, 0)
    assert sched.kv.block_ids(1) == [2, 1]
