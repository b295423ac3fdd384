"""Skipping ahead over decode-only steps must change nothing but speed."""

import sys

import numpy as np
import pytest
import simpy

from kvsim.cache import run_commit
from kvsim.cache.decode_run import DecodeSteps
from kvsim.cache.cpu_offload import LRUOffloadingManager
from kvsim.cache.kv_cache_manager import KVCacheManager
from kvsim.cache.offloading import OffloadingKVCacheManager
from kvsim.cache.scheduler import Scheduler, SchedulerConfig
from kvsim.cache.request_state import RequestState
from kvsim.cache.tiered import HostTier, TieredKVCacheManager
from kvsim.sim.serving import results
from kvsim.sim.config import RunConfig
from kvsim.sim.perf.cost_model import CostModel
from kvsim.sim.serving.recorder import STEP_COLUMNS, RequestLog, StepLog, StepRecord
from kvsim.sim.serving.replica import Replica
from kvsim.sim.serving.runner import simulate
from kvsim.workloads import Request


def workload(n=400, seed=1, shared=True, length_only=False):
    """Requests with shared 64-token prefixes, varied lengths and bursty arrivals
    (``length_only``: the same lengths and arrivals without token ids)."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 1000, 64) for _ in range(4)]
    t, out = 0.0, []
    for i in range(n):
        t += float(rng.exponential(0.08))
        own = rng.integers(0, 1000, int(rng.integers(1, 600)))
        ids = np.concatenate([prefixes[i % 4], own]) if shared else own
        out.append(Request(i, t, len(ids), int(rng.integers(1, 300)),
                           prompt_token_ids=None if length_only else ids,
                           priority=int(rng.integers(0, 3))))
    return out


def in_replica_order(steps):
    """Steps by replica, each replica's in time order: replicas' steps interleave in the log in
    the order they were committed, and a decode run commits its steps ahead of the others'."""
    return steps.sort_values(["replica", "t_start"], kind="stable").reset_index(drop=True)


def outputs(config, executor=None):
    r = simulate(workload(), config, executor=executor, keep_steps=True)
    steps = in_replica_order(results.steps_frame(r))
    return r, results.requests_frame(r), steps, [kv.pool.free_queue() for kv in
                                                 (rep.kv for rep in r.replicas)]


CASES = {
    "cost-model": dict(num_gpu_blocks=900, max_num_seqs=48),
    "tight-pool-priority": dict(num_gpu_blocks=260, max_num_seqs=64,
                                scheduling_policy="priority", block_size=8),
    "two-replicas-affinity": dict(num_gpu_blocks=500, replicas=2, router="prefix-affinity"),
    "three-replicas-cache-aware": dict(num_gpu_blocks=400, replicas=3, router="cache-aware"),
    "no-prefix-caching": dict(num_gpu_blocks=700, enable_prefix_caching=False, block_size=32),
    "hybrid-eviction": dict(num_gpu_blocks=300, max_num_seqs=64, eviction="hybrid"),
    "host-tier-swap": dict(num_gpu_blocks=260, max_num_seqs=64, num_cpu_blocks=400,
                           preemption_mode="swap", offload_write="back", block_size=8),
    "host-tier-lfu": dict(num_gpu_blocks=300, max_num_seqs=64, num_cpu_blocks=200,
                          eviction="lfu", offload_write="back"),
    # vLLM's native offloading: runs only while no block waits to be offered again
    "host-tier-native": dict(num_gpu_blocks=300, max_num_seqs=64, num_cpu_blocks=200),
    # (without the full-sequence reserve a load needs only its hit's blocks; four seats: loads
    # wait for one in the holding queue)
    "host-tier-native-no-reserve": dict(num_gpu_blocks=300, max_num_seqs=64, num_cpu_blocks=200,
                                        scheduler_reserve_full_isl=False),
    "host-tier-native-four-seats": dict(num_gpu_blocks=300, max_num_seqs=4, num_cpu_blocks=200,
                                        max_num_batched_tokens=256),
    "host-tier-write-through": dict(num_gpu_blocks=400, max_num_seqs=48, num_cpu_blocks=300,
                                    offload_write="through"),
    # (a host pool keyed by priority: each block written through for the request that filled it)
    "host-tier-write-through-hybrid": dict(num_gpu_blocks=400, max_num_seqs=48,
                                           num_cpu_blocks=300, offload_write="through",
                                           eviction="hybrid"),
    "host-tier-write-through-priority": dict(num_gpu_blocks=400, max_num_seqs=48,
                                             num_cpu_blocks=300, offload_write="through",
                                             eviction="priority"),
    # prompts prefilled in chunks of what the decodes leave of 96 tokens (prefill runs)
    "chunked-prefill": dict(num_gpu_blocks=900, max_num_seqs=48, max_num_batched_tokens=96),
    "chunked-prefill-tight-priority": dict(num_gpu_blocks=200, max_num_seqs=64, block_size=8,
                                           max_num_batched_tokens=80,
                                           scheduling_policy="priority"),
    "chunked-prefill-lfu": dict(num_gpu_blocks=300, max_num_seqs=64, eviction="lfu",
                                max_num_batched_tokens=96),
    # (the threshold caps the chunk, leaving budget for admissions, while under 16 decode)
    "chunked-prefill-threshold": dict(num_gpu_blocks=600, max_num_seqs=48,
                                      max_num_batched_tokens=96,
                                      long_prefill_token_threshold=80),
    "chunked-prefill-two-replicas": dict(num_gpu_blocks=400, replicas=2, max_num_seqs=64,
                                         max_num_batched_tokens=64, enable_prefix_caching=False),
    # (with a host tier too: the chunks' copies taken step by step)
    "chunked-prefill-host-tier": dict(num_gpu_blocks=300, max_num_seqs=64, num_cpu_blocks=200,
                                      max_num_batched_tokens=96),
    "chunked-prefill-host-tier-swap": dict(num_gpu_blocks=260, max_num_seqs=64,
                                           num_cpu_blocks=400, preemption_mode="swap",
                                           offload_write="back", block_size=8,
                                           max_num_batched_tokens=80),
    "chunked-prefill-write-through": dict(num_gpu_blocks=400, max_num_seqs=48,
                                          num_cpu_blocks=300, offload_write="through",
                                          max_num_batched_tokens=96),
    # ARC's runs take their blocks in one call, its victims picked with the fills counted
    "arc-tight-pool": dict(num_gpu_blocks=260, max_num_seqs=64, eviction="arc", block_size=8),
    "arc-chunked-prefill": dict(num_gpu_blocks=300, max_num_seqs=64, eviction="arc",
                                max_num_batched_tokens=96),
    "arc-block-size-one": dict(num_gpu_blocks=2400, max_num_seqs=32, eviction="arc",
                               block_size=1),
    # S3-FIFO's the same while S stays under its share; the fills join S in the order they came
    "s3fifo-tight-pool": dict(num_gpu_blocks=260, max_num_seqs=64, eviction="s3fifo",
                              block_size=8),
    "s3fifo-roomy-pool": dict(num_gpu_blocks=3000, max_num_seqs=64, eviction="s3fifo",
                              block_size=8),
    "s3fifo-chunked-prefill": dict(num_gpu_blocks=300, max_num_seqs=64, eviction="s3fifo",
                                   max_num_batched_tokens=96),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_skip_ahead_gives_identical_results(case):
    base = {"model": "llama-2-7b", "max_num_batched_tokens": 1024, **CASES[case]}
    fast = outputs(RunConfig(skip_ahead=True, **base))
    slow = outputs(RunConfig(skip_ahead=False, **base))
    assert fast[0].duration_s == slow[0].duration_s
    assert fast[1].equals(slow[1])
    assert fast[2].equals(slow[2])
    assert fast[3] == slow[3]


#: Length-only requests arriving during decode runs: with one replica and an LRU pool, the
#: run admits each itself where the scheduler can take its whole prompt at once; otherwise
#: (the prompt chunked or cut by the threshold, no seat, the blocks short, two arrivals in one
#: step, another policy or replica) the run ends before that step, as any run does.
ADMITTING_CASES = {
    "roomy-pool": (dict(num_gpu_blocks=2000, max_num_seqs=64), True),
    "tight-pool": (dict(num_gpu_blocks=260, max_num_seqs=64, block_size=8), True),
    "small-budget": (dict(num_gpu_blocks=900, max_num_batched_tokens=256), True),
    "few-seats": (dict(num_gpu_blocks=900, max_num_seqs=4), True),
    "threshold": (dict(num_gpu_blocks=900, long_prefill_token_threshold=200), True),
    "no-prefix-caching": (dict(num_gpu_blocks=700, enable_prefix_caching=False,
                               block_size=32), True),
    "priority": (dict(num_gpu_blocks=400, scheduling_policy="priority"), True),
    "short-model-len": (dict(num_gpu_blocks=900, max_model_len=400), True),
    "truncating": (dict(num_gpu_blocks=900, max_model_len=400, long_prompt="truncate"), True),
    "whole-sequence-not-reserved": (dict(num_gpu_blocks=300, max_num_seqs=64,
                                         scheduler_reserve_full_isl=False), True),
    "two-replicas": (dict(num_gpu_blocks=500, replicas=2), False),
    "lfu": (dict(num_gpu_blocks=300, max_num_seqs=64, eviction="lfu"), False),
    "host-tier": (dict(num_gpu_blocks=300, max_num_seqs=64, num_cpu_blocks=200,
                       offload_write="back"), False),
}


@pytest.mark.parametrize("case", sorted(ADMITTING_CASES))
def test_decode_runs_admitting_arrivals_give_identical_results(case, monkeypatch):
    settings, admits = ADMITTING_CASES[case]
    base = {"model": "llama-2-7b", "max_num_batched_tokens": 1024, **settings}
    admitted = []
    commit = Scheduler.commit_decode_run
    monkeypatch.setattr(Scheduler, "commit_decode_run", lambda s, run, n, *more: (
        admitted.extend(run.admissions) or commit(s, run, n, *more)))
    runs = [simulate(workload(length_only=True), RunConfig(skip_ahead=fast, **base),
                     keep_steps=True) for fast in (True, False)]
    assert bool(admitted) == admits
    assert runs[0].duration_s == runs[1].duration_s
    assert results.requests_frame(runs[0]).equals(results.requests_frame(runs[1]))
    assert in_replica_order(results.steps_frame(runs[0])).equals(
        in_replica_order(results.steps_frame(runs[1])))
    assert [rep.kv.pool.free_queue() for rep in runs[0].replicas] == \
        [rep.kv.pool.free_queue() for rep in runs[1].replicas]


def test_a_turn_waiting_for_its_parents_reply_is_admitted_as_stepping_admits_it():
    """Turn 1 arrives while turn 0 still generates the reply its prompt resends: its hit grows
    with each block turn 0 fills, so it may be admitted at any of them (a run that took the
    waiting request's hit as only shrinking went past that step: 544 hit tokens and no
    preemption against stepping's 256 and one)."""
    first = Request(0, 0.0, 160, 400)
    turn = Request(1, 1.0, 570, 8, continues=first)
    runs = [simulate([first, turn], RunConfig(model="llama-2-7b", num_gpu_blocks=36,
                                              skip_ahead=skip), keep_steps=True)
            for skip in (True, False)]
    fast, slow = (results.requests_frame(r) for r in runs)
    assert fast.equals(slow) and fast["cached_tokens"].tolist() == [0, 256]
    assert in_replica_order(results.steps_frame(runs[0])).equals(
        in_replica_order(results.steps_frame(runs[1])))


def test_skip_ahead_actually_skips_work():
    """With a cost model the decode-only stretches are long; the lazy path must be taken."""
    config = RunConfig(model="llama-2-7b", num_gpu_blocks=2000, skip_ahead=True)
    r = simulate(workload(150), config)
    replica = r.replicas[0]
    assert replica.num_skipped_steps > len(r.steps) // 4


@pytest.mark.parametrize("num_cpu_blocks, runs", [(50, True), (8, False)])
def test_native_offloading_runs_only_while_no_block_waits_to_be_offered_again(
        num_cpu_blocks, runs):
    """A prompt block the CPU could not take is offered again at every step its request
    is scheduled: with a CPU tier too small for that to stop, no step is skipped; with one
    that refuses a few thousand offers, steps are skipped between them."""
    base = dict(model="llama-2-7b", max_num_batched_tokens=1024, num_gpu_blocks=300,
                max_num_seqs=64, num_cpu_blocks=num_cpu_blocks)
    fast = outputs(RunConfig(skip_ahead=True, **base))
    slow = outputs(RunConfig(skip_ahead=False, **base))
    replica = fast[0].replicas[0]
    assert replica.kv.offload.num_dropped_blocks > 2_000
    assert replica.num_skipped_steps > 100 if runs else replica.num_skipped_steps == 0
    assert fast[0].duration_s == slow[0].duration_s
    assert fast[1].equals(slow[1]) and fast[2].equals(slow[2])


# --- arrivals against decode runs: at step boundaries, inside the first and the last step ----

def test_length_only_decode_runs_take_their_blocks_in_one_call_with_identical_results(
        monkeypatch):
    """A run's new blocks come from LRU's pool in one call; length-only requests in a tight
    pool also evict the blocks registered when others finished."""
    trace = lambda: [Request(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens)
                     for r in workload()]
    base = dict(model="llama-2-7b", max_num_batched_tokens=1024, num_gpu_blocks=260,
                max_num_seqs=64, block_size=8)
    calls, open_blocks = [], KVCacheManager.open_blocks
    monkeypatch.setattr(KVCacheManager, "open_blocks", lambda kv, ids, *more: (
        calls.append(len(ids)) or open_blocks(kv, ids, *more)))
    fast = simulate(trace(), RunConfig(skip_ahead=True, **base), keep_steps=True)
    slow = simulate(trace(), RunConfig(skip_ahead=False, **base), keep_steps=True)
    assert len(calls) > 50 and max(calls) > 10
    assert fast.replicas[0].kv.pool.num_evictions > 1000
    assert fast.duration_s == slow.duration_s
    assert results.requests_frame(fast).equals(results.requests_frame(slow))
    assert results.steps_frame(fast).equals(results.steps_frame(slow))
    assert fast.replicas[0].kv.pool.free_queue() == slow.replicas[0].kv.pool.free_queue()


@pytest.mark.parametrize("eviction", ["lfu", "lookahead", "arc"])
def test_scored_runs_register_late_only_where_no_free_block_notices(eviction, monkeypatch):
    """Greedy requests repeating earlier prompts decode blocks that finished requests left
    cached and free: registering those step by step wakes the free copies, so such runs take
    their blocks one allocation at a time; the other runs take them in one call. Both give
    the results of stepping one step at a time."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 1000, int(rng.integers(20, 200))) for _ in range(6)]
    trace = lambda: [Request(i, 0.05 * i, len(prompts[i % 6]), 40 + 20 * (i % 3),
                             prompt_token_ids=prompts[i % 6]) for i in range(120)]
    base = dict(model="llama-2-7b", max_num_batched_tokens=1024, num_gpu_blocks=220,
                max_num_seqs=16, block_size=8, eviction=eviction, sampling="greedy")
    paths = {"bulk": 0, "events": 0}
    for name, key in (("_open_in_bulk", "bulk"), ("_allocate_events", "events")):
        fn = getattr(run_commit, name)
        monkeypatch.setattr(run_commit, name, lambda *a, _fn=fn, _key=key: (
            paths.__setitem__(_key, paths[_key] + 1), _fn(*a))[1])
    fast = simulate(trace(), RunConfig(skip_ahead=True, **base), keep_steps=True)
    slow = simulate(trace(), RunConfig(skip_ahead=False, **base), keep_steps=True)
    assert paths["bulk"] > 5 and paths["events"] > 5
    assert fast.duration_s == slow.duration_s
    assert results.requests_frame(fast).equals(results.requests_frame(slow))
    assert results.steps_frame(fast).equals(results.steps_frame(slow))
    assert fast.replicas[0].kv.pool.free_queue() == slow.replicas[0].kv.pool.free_queue()


BOUNDARY_CASES = {
    "plain": dict(num_gpu_blocks=400),
    "host-tier-write-through": dict(num_gpu_blocks=60, num_cpu_blocks=200,
                                    offload_write="through"),
    "two-replicas": dict(num_gpu_blocks=400, replicas=2, router="least-outstanding-tokens"),
}


def lone_request_runs(base):
    """Steps of one long request alone, and the (first step, steps) of each decode run it got
    (a run logs all its steps but the last with one ``extend_rows``)."""
    runs, extend = [], StepLog.extend_rows

    def recording(log, rows):
        runs.append((len(log), len(rows) + 1))
        extend(log, rows)

    StepLog.extend_rows = recording
    try:
        r = simulate([Request(0, 0.0, 40, 300)], RunConfig(skip_ahead=True, **base),
                     keep_steps=True)
    finally:
        StepLog.extend_rows = extend
    return results.steps_frame(r), runs


def identical_with_arrival_at(base, arrival_s, together=True):
    """Requests 1 and 2 arrive at ``arrival_s`` (``together``; else request 2 comes 1 s
    later: request 1 alone at that instant, which a run may admit itself)."""
    later = arrival_s + (0.0 if together else 1.0)
    trace = lambda: [Request(0, 0.0, 40, 300), Request(1, arrival_s, 24, 30),
                     Request(2, later, 8, 20)]
    fast = simulate(trace(), RunConfig(skip_ahead=True, **base), keep_steps=True)
    slow = simulate(trace(), RunConfig(skip_ahead=False, **base), keep_steps=True)
    assert fast.duration_s == slow.duration_s
    assert results.requests_frame(fast).equals(results.requests_frame(slow))
    assert in_replica_order(results.steps_frame(fast)).equals(
        in_replica_order(results.steps_frame(slow)))
    assert [rep.kv.pool.free_queue() for rep in fast.replicas] == \
        [rep.kv.pool.free_queue() for rep in slow.replicas]
    return fast


@pytest.mark.parametrize("case", sorted(BOUNDARY_CASES))
def test_arrivals_around_a_decode_run_change_nothing(case):
    """Two requests arrive together at chosen instants of the lone request's first decode run:
    exactly on its first step's start, inside its first step, exactly on a boundary inside the
    run, inside its last step, exactly on its last step's start and exactly on its end."""
    base = dict(model="llama-2-7b", max_num_batched_tokens=1024, block_size=16,
                **BOUNDARY_CASES[case])
    steps, runs = lone_request_runs(base)
    assert runs and runs[0][1] >= 10
    first, n = runs[0]
    t, d = steps["t_start"].to_numpy(), steps["duration"].to_numpy()
    last = first + n - 1
    instants = [t[first], t[first] + d[first] / 2, t[first + 5], t[last] + d[last] / 3,
                t[last], t[last] + d[last]]
    for arrival_s in instants:
        for together in (True, False):
            fast = identical_with_arrival_at(base, float(arrival_s), together)
            assert sum(rep.num_decode_runs for rep in fast.replicas) >= 1


# --- the replica talks to the scheduler and the executor only --------------------------------

class KvOnlyForTheScheduler:
    """A KV manager that refuses every attribute read from outside ``kvsim.cache``."""

    def __init__(self, kv):
        object.__setattr__(self, "_kv", kv)

    @property
    def __class__(self):        # isinstance checks in the scheduler see the real class
        return type(object.__getattribute__(self, "_kv"))

    def __getattr__(self, name):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if not caller.startswith("kvsim.cache"):
            raise AssertionError(f"{caller} read the KV manager's {name!r}")
        return getattr(object.__getattribute__(self, "_kv"), name)


def replica_on_guarded_kv(kv, requests):
    env, steps, log = simpy.Environment(), StepLog(), RequestLog()
    scheduler = Scheduler(KvOnlyForTheScheduler(kv), SchedulerConfig(
        max_num_seqs=32, max_num_batched_tokens=512, max_model_len=2048))
    replica = Replica(env, 0, scheduler, CostModel("llama-2-7b", "a100-80gb"), steps, log)

    def arrivals():
        for request in requests:
            if request.arrival_s > env.now:
                yield env.timeout(request.arrival_s - env.now)
            log.on_arrival(request, 0)
            replica.submit(RequestState(request, kv.block_size))

    env.process(arrivals())
    env.run()
    return replica, steps, log


@pytest.mark.parametrize("tier", ["gpu-only", "host-tier"])
def test_the_replica_never_touches_the_kv_manager(tier):
    """Twelve requests through a replica whose KV manager answers only ``kvsim.cache``: every
    one completes, steps are logged, and decode runs were taken."""
    requests = [Request(i, 0.05 * i, 30 + 7 * i, 60 + 11 * i) for i in range(12)]
    kv = (TieredKVCacheManager(120, 16, host=HostTier(300), write="through")
          if tier == "host-tier" else KVCacheManager(400, 16))
    replica, steps, log = replica_on_guarded_kv(kv, requests)
    assert replica.num_finished == 12 and list(log.columns["completed"]) == [1] * 12
    assert replica.num_decode_runs > 0 and len(steps) > replica.num_skipped_steps > 0


# --- a decode run is one SimPy event -----------------------------------------------------------

def count_events(config, requests, monkeypatch):
    count, step = [0], simpy.Environment.step

    def counting(env):
        count[0] += 1
        step(env)

    monkeypatch.setattr(simpy.Environment, "step", counting)
    r = simulate(requests, config)
    monkeypatch.setattr(simpy.Environment, "step", step)
    return count[0], r


def test_a_long_decode_run_costs_one_event(monkeypatch):
    """One request decoding 2,000 tokens alone: a prefill step (its first token), then a
    single decode run of the other 1,999 steps, its finish included (one timeout). Stepping
    one at a time takes a timeout per step: 1,998 events more, and nothing else differs."""
    base = dict(model="llama-2-7b", num_gpu_blocks=400, block_size=16)
    fast_events, fast = count_events(RunConfig(skip_ahead=True, **base),
                                     [Request(0, 0.0, 16, 2000)], monkeypatch)
    slow_events, slow = count_events(RunConfig(skip_ahead=False, **base),
                                     [Request(0, 0.0, 16, 2000)], monkeypatch)
    assert len(fast.steps) == len(slow.steps) == 2000
    assert fast.replicas[0].num_decode_runs == 1
    assert fast.replicas[0].num_skipped_steps == 1999
    assert slow_events - fast_events == 1998
    assert fast_events < 10
    assert fast.duration_s == slow.duration_s


class ProtocolOnly:
    """A cost model's steps behind the executor protocol alone (no subclassing): no
    decode_steps of its own, so the loop takes the protocol's."""

    supports_decode_runs = True

    def __init__(self, model):
        self._model = model

    def step_duration(self, plan):
        return self._model.step_duration(plan)

    def transfer_time(self, plan):
        return self._model.transfer_time(plan)

    def decode_durations(self, *args, **kwargs):
        return self._model.decode_durations(*args, **kwargs)


def test_an_executor_following_only_the_protocol_runs_decode_runs_alike():
    config = RunConfig(model="llama-2-7b", num_gpu_blocks=900, max_num_seqs=48)
    model = CostModel("llama-2-7b", "a100-80gb")
    ours, theirs = outputs(config, model), outputs(config, ProtocolOnly(model))
    assert theirs[0].replicas[0].num_decode_runs == ours[0].replicas[0].num_decode_runs > 10
    assert theirs[1].equals(ours[1]) and theirs[2].equals(ours[2])


def test_a_decode_run_ends_at_the_next_arrival_not_at_another_replicas_step(monkeypatch):
    """Two replicas, each with one request decoding 2,000 tokens (round robin), and a third
    request arriving at 30 s. The replicas' steps alternate in time, yet each replica waits
    out its decodes as one run up to the arrival and one after it: the other replica's steps
    neither read nor change it. Stepping one at a time gives the same steps and requests."""
    base = dict(model="llama-2-7b", num_gpu_blocks=800, block_size=16, replicas=2,
                router="round-robin")
    trace = lambda: [Request(0, 0.0, 16, 2000), Request(1, 0.001, 40, 2000),
                     Request(2, 30.0, 16, 10)]
    fast_events, fast = count_events(RunConfig(skip_ahead=True, **base), trace(),
                                     monkeypatch)
    slow_events, slow = count_events(RunConfig(skip_ahead=False, **base), trace(),
                                     monkeypatch)
    assert [rep.num_decode_runs for rep in fast.replicas] == [2, 1]
    assert fast_events < 30 < 4000 < slow_events
    assert fast.duration_s == slow.duration_s
    fast_steps, slow_steps = (simulate(trace(), RunConfig(skip_ahead=s, **base),
                                       keep_steps=True) for s in (True, False))
    assert in_replica_order(results.steps_frame(fast_steps)).equals(
        in_replica_order(results.steps_frame(slow_steps)))
    assert results.requests_frame(fast).equals(results.requests_frame(slow))


def test_a_request_arriving_to_an_empty_queue_is_admitted_before_any_decode_run(monkeypatch):
    """Request 0 decodes 2,000 tokens; requests 1 and 2, whose token ids a lookup could hit,
    arrive at 5 s and 10 s to an empty queue. After each arrival the replica takes a normal
    step (which admits it) without first asking for a decode run: every ask finds nobody
    waiting. The same steps as one at a time."""
    base = dict(model="llama-2-7b", num_gpu_blocks=800, block_size=16)
    trace = lambda: [Request(0, 0.0, 16, 2000),
                     Request(1, 5.0, 40, 300, prompt_token_ids=np.arange(40)),
                     Request(2, 10.0, 24, 300, prompt_token_ids=np.arange(24))]
    waiting_at_asks, plan = [], Scheduler.plan_decode_run

    def ask(scheduler):
        waiting_at_asks.append(scheduler.num_waiting)
        return plan(scheduler)

    monkeypatch.setattr(Scheduler, "plan_decode_run", ask)
    fast = simulate(trace(), RunConfig(skip_ahead=True, **base), keep_steps=True)
    slow = simulate(trace(), RunConfig(skip_ahead=False, **base), keep_steps=True)
    assert len(waiting_at_asks) >= 3 and set(waiting_at_asks) == {0}
    assert fast.replicas[0].num_decode_runs >= 3
    assert results.steps_frame(fast).equals(results.steps_frame(slow))
    assert results.requests_frame(fast).equals(results.requests_frame(slow))


def test_a_decode_run_admits_length_only_arrivals_itself(monkeypatch):
    """The same, with length-only requests 1 and 2 (nothing to look up): one decode run,
    asked for once, takes both arrivals and admits each at the step that starts after it,
    as stepping would; the arrival process only skips them when their times come."""
    base = dict(model="llama-2-7b", num_gpu_blocks=800, block_size=16)
    trace = lambda: [Request(0, 0.0, 16, 2000), Request(1, 5.0, 40, 300),
                     Request(2, 10.0, 24, 300)]
    asks, plan = [], Scheduler.plan_decode_run
    monkeypatch.setattr(Scheduler, "plan_decode_run", lambda s: asks.append(1) or plan(s))
    fast_events, fast = count_events(RunConfig(skip_ahead=True, **base), trace(),
                                     monkeypatch)
    slow = simulate(trace(), RunConfig(skip_ahead=False, **base), keep_steps=True)
    assert len(asks) == 1 and fast.replicas[0].num_decode_runs == 1
    assert fast_events < 12
    fast = simulate(trace(), RunConfig(skip_ahead=True, **base), keep_steps=True)
    assert results.steps_frame(fast).equals(results.steps_frame(slow))
    assert results.requests_frame(fast).equals(results.requests_frame(slow))


def test_an_arrival_on_the_end_of_a_run_that_took_the_one_before_is_routed_first():
    """Request 1 (length-only) arrives inside a decode run of request 0, which admits it;
    request 2 (token ids: the run cannot take it) arrives exactly where a later step starts,
    so the run ends on that instant. Stepping routes request 2 before that step (its arrival
    was scheduled when request 1 was routed, before the step), and so must the fast path,
    although its run's timeout was scheduled first: the step admits request 2 either way."""
    base = dict(model="llama-2-7b", num_gpu_blocks=800, block_size=16)
    two = [Request(0, 0.0, 16, 400), Request(1, 2.0005, 40, 300)]
    stepped = results.steps_frame(simulate(two, RunConfig(skip_ahead=False, **base),
                                           keep_steps=True))
    boundary = float(stepped["t_start"][stepped["t_start"] > 2.0005].iloc[12])
    trace = lambda: [*(Request(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens)
                       for r in two),
                     Request(2, boundary, 24, 30, prompt_token_ids=np.arange(24))]
    fast = identical_with_arrival_trace(base, trace)
    scheduled = results.requests_frame(fast).set_index("request_id")["first_scheduled_s"]
    assert scheduled[2] == boundary


def identical_with_arrival_trace(base, trace):
    fast = simulate(trace(), RunConfig(skip_ahead=True, **base), keep_steps=True)
    slow = simulate(trace(), RunConfig(skip_ahead=False, **base), keep_steps=True)
    assert results.requests_frame(fast).equals(results.requests_frame(slow))
    assert results.steps_frame(fast).equals(results.steps_frame(slow))
    return fast


# --- the step log's record and bulk append -----------------------------------------------------

def test_step_log_takes_records_and_whole_columns():
    log = StepLog(keep_steps=True)
    record = StepRecord(*range(len(STEP_COLUMNS)))
    log.append(record)
    log.extend({name: np.array([1.0, 2.0]) * k for k, name in enumerate(STEP_COLUMNS)})
    assert len(log) == 3
    assert list(log.columns["duration"]) == [1.0, 1.0, 2.0]
    with pytest.raises(ValueError):
        log.extend({name: np.zeros(2 + (name == "duration")) for name in STEP_COLUMNS})


def test_a_decode_run_is_committed_only_before_the_next_step():
    """A run planned, then overtaken by a normal step, can no longer be committed; nor can
    more steps than it has."""
    kv = KVCacheManager(100, 16)
    scheduler = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=512))
    scheduler.add(RequestState(Request(0, 0.0, 20, 50), 16))
    for _ in range(2):
        scheduler.schedule()
        scheduler.update_from_output()
    run = scheduler.plan_decode_run()
    assert run is not None and run.max_steps == 48     # the 48th step finishes it
    with pytest.raises(ValueError):
        scheduler.commit_decode_run(run, 49)
    facts = scheduler.commit_decode_run(run, 10)
    assert list(facts.kv_used_blocks) == [2] * 10     # the third block opens at step 11
    assert scheduler.running[0].num_output_tokens == 12
    assert list(facts.internal_slots) == [32 - 22 - j for j in range(10)]
    scheduler.schedule()
    scheduler.update_from_output()
    with pytest.raises(ValueError):
        scheduler.commit_decode_run(run, 1)


def test_no_decode_run_while_a_prompt_token_is_left():
    """With a budget of two tokens a prompt of three is prefilled a token a step beside a
    decode. Those steps schedule one token per request, as decodes do, and the last prompt
    token's computed = length - 1 looks like a decode; but its step emits request 1's first
    token, so it is a normal step, and the run comes after it."""
    scheduler = Scheduler(KVCacheManager(100, 16), SchedulerConfig(max_num_batched_tokens=2))
    scheduler.add(RequestState(Request(0, 0.0, 2, 200), 16))
    scheduler.schedule()
    scheduler.update_from_output()
    scheduler.add(RequestState(Request(1, 0.0, 3, 50), 16))
    for _ in range(2):
        plan = scheduler.schedule()
        scheduler.update_from_output()
        assert [(s.request_id, s.num_new_tokens) for s in plan.scheduled] == [(0, 1), (1, 1)]
    assert scheduler.plan_decode_run() is None
    scheduler.schedule()
    assert [s.request_id for s in scheduler.update_from_output().first_tokens] == [1]
    assert scheduler.plan_decode_run() is not None


def two_requests_after_admission():
    """Requests 0 (8 output tokens) and 1 (30), admitted together and past their first token:
    both decode, nobody waits."""
    scheduler = Scheduler(KVCacheManager(20, 16), SchedulerConfig(max_num_batched_tokens=512))
    for rid, output in ((0, 8), (1, 30)):
        scheduler.add(RequestState(Request(rid, 0.0, 20, output), 16))
    scheduler.schedule()
    scheduler.update_from_output()
    return scheduler


def test_with_nobody_waiting_a_decode_run_goes_on_through_a_finish():
    """Request 0 has 7 tokens left: it finishes at the end of the run's 7th step, its blocks
    are freed there (its partial last block to the head of the queue, its full one to the
    tail), and the run goes on with request 1 alone (opening its third block at step 13)
    until it finishes too, at step 29. One
    step at a time gives the same frees, blocks and counters."""
    scheduler = two_requests_after_admission()
    run = scheduler.plan_decode_run()
    assert run.max_steps == 29 and list(run.batches()) == [(7, 2, 40), (22, 1, 27)]
    full, partial = scheduler.kv.block_ids(0)
    first = scheduler.commit_decode_run(run, 7)
    queue = scheduler.kv.free_queue()
    assert queue[0] == partial and queue[-1] == full
    facts = DecodeSteps.concatenate([first, scheduler.commit_decode_run(run, 22)])
    assert [(step, [s.request_id for s in seqs]) for step, seqs in facts.finished] == \
        [(6, [0]), (28, [1])]
    assert facts.batch_size.tolist() == [2] * 7 + [1] * 22
    assert facts.num_running.tolist() == [2] * 6 + [1] * 22 + [0]
    assert facts.kv_used_blocks.tolist() == [4] * 6 + [2] * 6 + [3] * 16 + [0]
    assert scheduler.running == [] and not scheduler.has_unfinished()

    stepped = two_requests_after_admission()
    while stepped.has_unfinished():
        stepped.schedule()
        stepped.update_from_output()
    assert scheduler.kv.free_queue() == stepped.kv.free_queue()
    assert scheduler.kv.pool.num_cached_free_blocks == stepped.kv.pool.num_cached_free_blocks


def test_with_a_request_waiting_a_decode_run_ends_with_the_first_finish():
    """A finish frees blocks and a seat, which may admit the waiting request at the next
    step: the run takes the finishing step (its admission check still sees both requests
    running) and stops there."""
    scheduler = two_requests_after_admission()
    scheduler.config = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=2)
    scheduler.add(RequestState(Request(2, 0.0, 20, 5), 16))
    run = scheduler.plan_decode_run()
    assert run.max_steps == 7 and list(run.batches()) == [(7, 2, 40)]
    facts = scheduler.commit_decode_run(run, 7)
    assert [(step, [s.request_id for s in seqs]) for step, seqs in facts.finished] == [(6, [0])]
    assert [s.request_id for s in scheduler.running] == [1] and scheduler.num_waiting == 1
    plan = scheduler.schedule()
    assert plan.admitted == [2]


def test_a_decode_run_admits_a_request_arriving_during_it():
    """Requests 0 and 1 decode (blocks [0, 1] and [2, 3], 16 free); request 2 (24 prompt
    tokens, 5 to generate, nothing to look up) arrives during step 2 of their run. The run
    admits it at step 3 with its whole prompt (two blocks, beside two decodes); it decodes
    from step 4 and finishes at the end of step 7, and the run goes on to step 28 as before.
    Stepping, with request 2 queued before step 3, leaves the same blocks in use after every
    step and the same free queue. Refused: a prompt with token ids (a lookup could hit it),
    one over the budget the decodes leave, one whose blocks the pool lacks, a request
    that would finish at its admitting step, and one admitted before request 2's step (a
    run's admissions come in step order)."""
    scheduler = two_requests_after_admission()
    run = scheduler.plan_decode_run()
    for refused in (Request(3, 0.0, 24, 5, prompt_token_ids=np.arange(24)),
                    Request(5, 0.0, 300, 5), Request(6, 0.0, 24, 1)):
        assert not scheduler.admit_in_run(run, 3, RequestState(refused, 16))
    config = scheduler.config
    scheduler.config = SchedulerConfig(max_num_batched_tokens=25)     # 23 left by the decodes
    assert not scheduler.admit_in_run(run, 3, RequestState(Request(4, 0.0, 24, 5), 16))
    scheduler.config = config
    assert run.max_steps == 29 and run.finish_step.tolist() == [6, 28] and run.joined is None
    assert scheduler.admit_in_run(run, 3, RequestState(Request(2, 0.0, 24, 5), 16))
    assert not scheduler.admit_in_run(run, 2, RequestState(Request(7, 0.0, 24, 5), 16))
    assert run.max_steps == 29 and run.finish_step.tolist() == [6, 28, 7]
    assert list(run.stretches(3)) == [(1, 2, 46, 24), (3, 3, 72, 0), (1, 2, 54, 0),
                                      (21, 1, 28, 0)]
    facts = scheduler.commit_decode_run(run, 29)
    assert facts.batch_size.tolist() == [2] * 3 + [3] * 4 + [2] + [1] * 21
    assert facts.prompt_tokens.tolist() == [0] * 3 + [24] + [0] * 25
    assert facts.kv_used_blocks.tolist() == [4] * 3 + [6] * 3 + [4] + [2] * 5 + [3] * 16 + [0]
    assert [(step, [s.request_id for s in seqs]) for step, seqs in facts.finished] == \
        [(6, [0]), (7, [2]), (28, [1])]

    stepped = two_requests_after_admission()
    for _ in range(3):
        stepped.schedule()
        stepped.update_from_output()
    stepped.add(RequestState(Request(2, 0.0, 24, 5), 16))
    used = []
    while stepped.has_unfinished():
        stepped.schedule()
        used.append(stepped.update_from_output().usage.num_used_blocks)
    assert used == facts.kv_used_blocks[3:].tolist()
    assert scheduler.kv.free_queue() == stepped.kv.free_queue()


def test_a_quiet_decode_run_with_vllms_cpu_tier_goes_on_through_a_finish():
    """With vLLM's CPU offloading, once both prompts' blocks are stored (admitted and offered,
    copied, done: nothing left to copy), a decode run goes on through request 0's finish as
    with no CPU tier. The finish's recency (its host block becomes the most recent) is heard
    when the next step is planned: the same host order, GPU queue and counters as one step
    at a time."""
    def stored():
        kv = OffloadingKVCacheManager(20, 16, offload=LRUOffloadingManager(8))
        scheduler = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=512))
        for rid, output in ((0, 8), (1, 30)):
            ids = np.arange(20) + 100 * rid
            scheduler.add(RequestState(Request(rid, 0.0, 20, output, prompt_token_ids=ids), 16))
        for _ in range(3):
            scheduler.schedule()
            scheduler.update_from_output()
        return scheduler

    scheduler = stored()
    host = scheduler.kv.offload
    assert len(host.blocks) == 2 and scheduler.kv.decodes_quietly
    run = scheduler.plan_decode_run()
    assert not run.has_transfers and run.max_steps == 27
    facts = scheduler.commit_decode_run(run, 27)
    assert [(step, [s.request_id for s in seqs]) for step, seqs in facts.finished] == \
        [(4, [0]), (26, [1])]
    assert facts.host_used_blocks.tolist() == [2] * 27
    scheduler.kv.end_schedule(())           # (the next step planned hears both finishes)

    stepped = stored()
    while stepped.has_unfinished():
        stepped.schedule()
        stepped.update_from_output()
    stepped.kv.end_schedule(())
    assert host.blocks == stepped.kv.offload.blocks
    assert scheduler.kv.free_queue() == stepped.kv.free_queue()
    assert scheduler.kv.num_transferred_blocks == stepped.kv.num_transferred_blocks
