"""Blocks that only their own request can hit (chunk hashes no other request carries) skip the
prefix index, and nothing observable changes."""

import json
from functools import partial

import numpy as np
import pytest

from kvsim.cache.eviction import make_policy
from kvsim.cache.kv_cache_manager import KVCacheManager
from kvsim.cache.request_state import RequestState, RequestStatus
from kvsim.workloads import Request, TraceOptions, load_trace
from kvsim.workloads import sample_path
from kvsim.workloads.sharing import SharedPrefixes, read_scanned, scan_trace_sharing


def chunked(request_id, hashes, prompt, output=5, **fields):
    """A request named by chunk hashes of 8 tokens, nothing continuing it."""
    fields.setdefault("may_be_continued", False)
    return Request(request_id, 0.0, prompt, output, prefix_hashes=np.array(hashes),
                   hash_block_size=8, **fields)


def trio():
    """A and B share their first two chunks (hashes 1 and 2); C shares nothing. (Built per
    test: no request outlives it.)"""
    a, b, c = chunked(1, [1, 2, 3], 24), chunked(2, [1, 2, 4], 22), chunked(3, [5], 8)
    return a, b, c, SharedPrefixes.scan([a, b, c])


def test_blocks_from_the_first_chunk_only_its_request_carries_on_are_private():
    """Chunk hashes 1 and 2 are carried by A and B: with blocks of 4 tokens their four blocks
    may be shared; the rest of each prompt, and the generated blocks, are private."""
    a, b, c, sharing = trio()
    assert [sharing.num_shared_blocks(r, 4) for r in (a, b, c)] == [4, 4, 0]
    assert sharing.num_shared_blocks(a, 3) == 5      # block 5 (tokens 15..17) ends in chunk 2
    assert sharing.num_shared_blocks(a, 4, greedy=True) == 4


def test_a_prompt_whose_last_chunk_is_shared_keeps_only_its_outputs_private():
    a, _, _, sharing = trio()
    whole = chunked(4, [1, 2], 16)
    assert sharing.num_shared_blocks(whole, 4) == 4
    assert sharing.num_shared_blocks(whole, 4, greedy=True) is None   # outputs may coincide
    odd = chunked(5, [9, 1], 16)                     # a shared hash after a private one
    assert SharedPrefixes.scan([a, odd]).num_shared_blocks(odd, 4) == 4


@pytest.mark.parametrize("fields", [
    dict(may_be_continued=True), dict(continues="a"), dict(prefix_hashes=None),
    dict(prompt_token_ids=np.arange(8)),
])
def test_a_request_another_may_continue_or_named_otherwise_may_share_everything(fields):
    a, _, _, sharing = trio()
    fields = {**fields, "continues": a} if "continues" in fields else fields
    other = chunked(6, [3], 8)
    for name, value in fields.items():
        setattr(other, name, value)
    assert sharing.num_shared_blocks(other, 4) is None


def test_a_trace_without_chunk_hashes_is_not_scanned():
    a, b, _, _ = trio()
    assert scan_trace_sharing(lambda: iter([Request(0, 0.0, 8, 2)])) is None
    assert scan_trace_sharing(lambda: iter([])) is None
    assert scan_trace_sharing(lambda: iter([a, b])).num_shared_blocks(a, 4) == 4
    session = chunked(0, [1], 8, may_be_continued=True)       # a generated chat trace's line
    assert scan_trace_sharing(lambda: iter([session, a, b])) is None


def test_a_short_trace_is_read_once_a_long_one_again_as_the_run_goes():
    """A trace of at most ``keep`` requests runs on the requests its scan read; a longer one
    (or one the scan gave up on) is read again, streamed; one nothing can skip, not scanned."""
    a, b, c, _ = trio()
    reads = []

    def read(requests=(a, b, c)):
        reads.append(len(reads))
        return (r for r in requests)

    requests, sharing = read_scanned(read, keep=3)
    assert requests == [a, b, c] and len(reads) == 2       # (the first request, the scan)
    assert sharing.num_shared_blocks(a, 4) == 4
    requests, sharing = read_scanned(read, keep=2)
    assert not isinstance(requests, list) and list(requests) == [a, b, c] and len(reads) == 5
    assert sharing.num_shared_blocks(a, 4) == 4
    session = chunked(0, [1], 8, may_be_continued=True)
    requests, sharing = read_scanned(lambda: iter([session, a]))
    assert list(requests) == [session, a] and sharing is None


def test_a_trace_with_more_distinct_chunk_hashes_than_the_limit_is_not_counted():
    a, b, _, _ = trio()
    assert SharedPrefixes.scan([a, b], max_hashes=4) is not None     # hashes 1, 2, 3, 4
    assert SharedPrefixes.scan([a, b], max_hashes=3) is None


def story(num_shared_blocks, finish):
    """Request A (24 prompt tokens: six full blocks of 4) runs and is freed: finished, or
    preempted and looked up again."""
    kv = KVCacheManager(12, 4, defer_private_blocks=True)
    a = RequestState(chunked(1, [1, 2, 3], 24), 4)
    a.num_shared_blocks = num_shared_blocks
    kv.allocate(1, a, 24)
    indexed_while_running = len(kv.pool.index)
    if finish:
        a.status = RequestStatus.FINISHED            # as the scheduler sets it before freeing
    kv.free(1)
    a.num_preemptions = int(not finish)
    return (indexed_while_running, len(kv.pool.index), kv.free_queue(),
            kv.pool.num_cached_free_blocks, kv.lookup(a).block_ids)


def test_a_finished_requests_private_blocks_queue_as_cached_content_outside_the_index():
    assert story(4, finish=True) == (4, 4, [6, 7, 8, 9, 10, 11, 5, 4, 3, 2, 1, 0], 6,
                                     [0, 1, 2, 3])
    assert story(None, finish=True) == (6, 6, [6, 7, 8, 9, 10, 11, 5, 4, 3, 2, 1, 0], 6,
                                        [0, 1, 2, 3, 4])


def test_a_preempted_request_registers_its_private_blocks_and_resumes_on_them():
    assert story(4, finish=False)[1:] == story(None, finish=False)[1:]
    assert story(4, finish=False)[:2] == (4, 6)        # indexed only once it was preempted
    assert story(4, finish=False)[4] == [0, 1, 2, 3, 4]


def two_requests(defer: bool, finish: bool = True, policy: str = "hybrid"):
    """A (six full blocks of 4 tokens, its first four shared) runs; B hits those four, which
    puts A's fourth block in a reused chain (hybrid's lanes read that); A is freed (finished,
    or preempted), then B finishes; then the whole pool is taken."""
    kv = KVCacheManager(16, 4, policy=make_policy(policy), defer_private_blocks=defer)
    a = RequestState(chunked(1, [1, 2, 3], 24), 4)
    b = RequestState(chunked(2, [1, 2, 4], 22), 4)
    a.num_shared_blocks = b.num_shared_blocks = 4
    kv.allocate(1, a, 24)
    hit = kv.lookup(b)
    kv.allocate(2, b, 22 - hit.num_tokens, hit)
    indexed_while_running = len(kv.pool.index)
    if finish:
        a.status = RequestStatus.FINISHED
    kv.free(1)
    b.status = RequestStatus.FINISHED
    kv.free(2)
    order = kv.pool.cached_free_order()     # (first: it writes out a scored pool's private runs)
    chains = kv.pool.reused if policy == "hybrid" else kv.pool.num_children   # what it reads
    return (hit.block_ids, indexed_while_running, len(kv.pool.index), list(chains), order,
            kv.pool.get_new_blocks(16))


def test_hybrid_lanes_keep_private_blocks_out_of_the_index_with_the_same_victims():
    """A's blocks 4 and 5 and B's block 6 are private: never indexed, yet in the lanes they
    would have joined. A's are in the plain lane although block 3 was reused by the time A
    finished: their mark is taken when the first of them filled, as registering it did."""
    skipped, eager = two_requests(True), two_requests(False)
    assert skipped[:3] == ([0, 1, 2, 3], 4, 4) and eager[1:3] == (7, 7)
    assert skipped[3] == eager[3] == [0, 1, 1, 1, 0, 0, 1] + [0] * 9
    assert skipped[4] == eager[4] == [5, 4, 0, 6, 3, 2, 1]
    assert skipped[5] == eager[5] == [7, 8, 9, 10, 11, 12, 13, 14, 15, 5, 4, 6, 3, 2, 1, 0]


def test_a_preempted_request_registers_its_private_blocks_in_the_hybrid_lanes_too():
    skipped, eager = two_requests(True, finish=False), two_requests(False, finish=False)
    assert skipped[1:3] == (4, 6) and skipped[3:] == eager[3:]


def test_lfu_counts_the_cached_children_of_private_blocks_outside_the_index():
    """The chain rule sees the same chains: block 3 keeps two cached children (A's block 4 and
    B's block 6) and A's blocks 4 and 5 one each, indexed or not."""
    skipped, eager = two_requests(True, policy="lfu"), two_requests(False, policy="lfu")
    assert skipped[1:3] == (4, 4) and eager[1:3] == (7, 7)
    assert skipped[3] == eager[3] == [1, 1, 1, 2, 1] + [0] * 11
    assert skipped[4] == eager[4] == [5, 4, 6, 3, 2, 1, 0]
    assert skipped[5] == eager[5] == [7, 8, 9, 10, 11, 12, 13, 14, 15, 5, 4, 6, 3, 2, 1, 0]


@pytest.mark.parametrize("settings", [
    dict(num_gpu_blocks=700, max_model_len=10000, long_prompt="truncate"),
    dict(num_gpu_blocks=700, max_model_len=10000, long_prompt="truncate", sampling="greedy"),
    dict(num_gpu_blocks=2000, max_num_seqs=8),
    dict(num_gpu_blocks=700, max_model_len=10000, long_prompt="truncate", eviction="hybrid"),
    dict(num_gpu_blocks=700, max_model_len=10000, long_prompt="truncate", eviction="priority"),
    dict(num_gpu_blocks=700, max_model_len=10000, long_prompt="truncate", eviction="lfu"),
    dict(num_gpu_blocks=700, max_model_len=10000, long_prompt="truncate", eviction="lookahead"),
    dict(num_gpu_blocks=700, max_model_len=10000, long_prompt="truncate", kv_offloading_size=1),
    dict(num_gpu_blocks=1000, max_num_seqs=8, kv_offloading_size=16, eviction="lfu"),  # CPU hits
    dict(num_gpu_blocks=700, max_model_len=10000, long_prompt="truncate", eviction="arc"),
    dict(num_gpu_blocks=700, max_model_len=10000, long_prompt="truncate", eviction="s3fifo"),
    dict(num_gpu_blocks=2000, max_num_seqs=8, eviction="arc"),
    dict(num_gpu_blocks=2000, max_num_seqs=8, eviction="s3fifo"),
    dict(num_gpu_blocks=1000, max_num_seqs=8, kv_offloading_size=16, eviction="arc"),
])
def test_a_mooncake_run_with_preemptions_is_unchanged(settings):
    """The bundled Mooncake sample on tight pools (preemptions, truncated prompts): the same
    steps, requests and prefix stats with and without skipping the private blocks."""
    from kvsim.sim.config import RunConfig
    from kvsim.sim.serving import results
    from kvsim.sim.serving.runner import simulate

    config = RunConfig(model="llama-2-7b", block_size=16, **settings)
    read = partial(load_trace, sample_path("mooncake"))

    def frames(sharing):
        r = simulate(read(), config, keep_steps=True, sharing=sharing)
        stats = [rep.kv.prefix_stats for rep in r.replicas]
        return results.steps_frame(r), results.requests_frame(r), stats

    skipped, eager = frames(scan_trace_sharing(read)), frames(None)
    assert skipped[0].equals(eager[0]) and skipped[1].equals(eager[1])
    assert skipped[2] == eager[2]
    assert eager[0]["preemptions"].sum() > 0 or settings.get("max_num_seqs")
    assert eager[2][0].num_hit_tokens > 0


def test_a_request_computes_its_private_blocks_ids_only_when_they_are_asked_for():
    """A fresh lookup stops at its shared blocks; the ids of the rest come when a preemption
    registers them, equal to those computed in one go."""
    kv = KVCacheManager(12, 4, defer_private_blocks=True)
    a = RequestState(chunked(1, [1, 2, 3], 24, output=6), 4)
    a.num_shared_blocks = 4
    assert kv.lookup(a).num_tokens == 0 and len(a._hashes) == 4
    whole = RequestState(chunked(1, [1, 2, 3], 24, output=6), 4)
    assert a.block_hashes(2, 5) == whole.block_hashes(2, 5) and len(a._hashes) == 7   # all
    assert whole.block_hashes(0, 7) == a.block_hashes(0, 7)


@pytest.mark.parametrize("settings", [
    dict(eviction="belady"), dict(kv_offloading_size=1, offload_write="back"),
    dict(kv_offloading_size=1, offload_write="back", eviction="arc"),
])
def test_a_manager_that_registers_every_block_is_given_no_shared_counts(settings):
    """Only the plain manager and vLLM's CPU offloading, with LRU, LFU, FIFO lanes (hybrid,
    priority, lookahead), ARC or S3-FIFO, skip private blocks; the others never ask."""
    from kvsim.sim.config import RunConfig
    from kvsim.sim.serving.runner import simulate

    class Refuses(SharedPrefixes):
        def num_shared_blocks(self, request, block_size, greedy=False):
            raise AssertionError("asked")

    config = RunConfig(model="llama-2-7b", **settings)
    result = simulate(load_trace(sample_path("mooncake"), TraceOptions(limit=20)), config,
                      sharing=Refuses(set()))
    assert len(result.requests) == 20


@pytest.mark.parametrize("sample, settings", [
    ("azure-conv", dict(kv_offloading_size=1)),     # length-only: every block private
    ("mooncake", dict(kv_offloading_size=1, num_gpu_blocks=700, max_model_len=10000,
                      long_prompt="truncate", model="llama-2-7b")),      # preemptions
])
def test_the_cpu_tier_runs_the_same_with_private_blocks_out_of_the_index(monkeypatch, sample,
                                                                          settings):
    """vLLM's CPU offloading offers every full block to the CPU, registered or not: the same
    steps (copies and their times included) and requests as registering every block."""
    from kvsim.cache.offloading import OffloadingKVCacheManager
    from kvsim.sim.config import RunConfig
    from kvsim.sim.serving import results, runner

    config = RunConfig(**settings)
    read = partial(load_trace, sample_path(sample))

    def frames():
        r = runner.simulate(read(), config, keep_steps=True, sharing=scan_trace_sharing(read))
        assert r.replicas[0].kv.offload.num_blocks > 0
        kv = r.replicas[0].kv
        return results.steps_frame(r), results.requests_frame(r), kv.skips_private_blocks

    skipped = frames()
    monkeypatch.setattr(runner, "OffloadingKVCacheManager", lambda *a, **k: (
        OffloadingKVCacheManager(*a, **{**k, "defer_private_blocks": False})))
    eager = frames()
    assert skipped[2] and not eager[2]
    assert skipped[0].equals(eager[0]) and skipped[1].equals(eager[1])
    assert skipped[0]["offload_blocks"].sum() > 0


CHILD_FIRST = [     # B continues A (A's blocks are B's first) and, at a better priority, runs first
    {"arrival_s": 0.0, "prompt_tokens": 200, "output_tokens": 100, "priority": 0},
    {"arrival_s": 0.01, "prompt_tokens": 320, "output_tokens": 16, "request_id": "a",
     "priority": 1},
    {"arrival_s": 0.02, "prompt_tokens": 400, "output_tokens": 16, "request_id": "b",
     "continues": "a", "priority": 0},
    {"arrival_s": 0.03, "prompt_tokens": 320, "output_tokens": 16, "priority": 0},
    {"arrival_s": 5.0, "prompt_tokens": 480, "output_tokens": 16},
    {"arrival_s": 6.0, "prompt_tokens": 450, "output_tokens": 16, "continues": "b"},
]


def test_a_continuation_loads_its_parents_prompt_blocks_that_finishing_made_recent(
        tmp_path, monkeypatch):
    """A length-only request that another continues is not private on the CPU: B, continuing
    A, stores A's blocks as its own prompt's first ones; when the requests finish, their
    blocks become the most recent on the CPU, so the 480-token prompt that fills it evicts
    others first, and C, continuing B, loads one of them back (after 9 on the GPU). Without
    the refresh at finish, C finds none on the CPU."""
    from kvsim.cache.cpu_offload import LRUOffloadingManager
    from kvsim.sim.config import RunConfig
    from kvsim.sim.serving import results, runner

    trace = tmp_path / "child_first.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in CHILD_FIRST))
    config = RunConfig(num_cpu_blocks=60, num_gpu_blocks=40, max_num_seqs=1,
                       scheduling_policy="priority")

    def cached():
        r = runner.simulate(load_trace(trace), config)
        return (results.requests_frame(r).cached_tokens.tolist(),
                r.replicas[0].kv.prefix_stats.num_host_hit_tokens)

    assert cached() == ([0, 0, 0, 0, 0, 160], 16)
    monkeypatch.setattr(LRUOffloadingManager, "_touch_finished", lambda self, access: None)
    assert cached() == ([0, 0, 0, 0, 0, 144], 0)
