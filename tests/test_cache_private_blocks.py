"""Length-only requests (block ids private to them) skip prefix-cache work that cannot pay off,
and nothing observable changes."""

from kvsim.cache.kv_cache_manager import KVCacheManager
from kvsim.cache.request_state import RequestState, RequestStatus
from kvsim.workloads import Request, read_trace
from kvsim.workloads import sample_path


def seq(request_id, prompt, output, continues=None):
    return RequestState(Request(request_id, 0.0, prompt, output, continues=continues), 4)


def run_on(kv):
    """Two private requests decode side by side; the first is preempted and resumes; a third
    request continuing the second looks it up while the second still runs."""
    a, b = seq(1, 10, 20), seq(2, 9, 20)
    events = []
    for s in (a, b):
        events.append(kv.lookup(s).num_tokens)
        kv.allocate(s.request_id, s, len(s))
        s.num_computed_tokens = len(s)
    for _ in range(7):               # both decode: blocks fill as they grow
        for s in (a, b):
            s.num_output_tokens += 1
            kv.allocate(s.request_id, s, 1, num_computed_tokens=s.num_computed_tokens)
            s.num_computed_tokens += 1
    kv.free(a.request_id)            # preempted by recompute
    a.num_preemptions, a.num_computed_tokens = 1, 0
    events.append(kv.lookup(a).block_ids)          # its own blocks, still cached
    follow = seq(3, len(b) + 3, 5, continues=b.request)
    events.append(kv.lookup(follow).block_ids)     # b's full blocks, b still running
    kv.free(b.request_id)
    events += [kv.free_queue(), kv.pool.num_cached_free_blocks]
    return events


def test_private_blocks_registered_late_change_nothing():
    late = run_on(KVCacheManager(30, 4, defer_private_blocks=True))
    assert late == run_on(KVCacheManager(30, 4))
    assert late[2] == [0, 1, 2, 6] and late[3] == [3, 4, 5, 7]   # the hits the story needs
    assert late[5] == 8


def test_a_fresh_private_request_misses_without_computing_its_ids():
    kv = KVCacheManager(30, 4, defer_private_blocks=True)
    a = seq(1, 40, 5)
    assert kv.lookup(a).num_tokens == 0
    assert a._hashes is None


def test_a_running_private_request_registers_its_blocks_only_when_it_frees_them():
    kv = KVCacheManager(30, 4, defer_private_blocks=True)
    a = seq(1, 12, 5)
    blocks = kv.allocate(1, a, 12)
    assert kv.is_registration_deferred(1) and not any(kv.is_cached(b) for b in blocks)
    kv.free(1)
    assert all(kv.is_cached(b) for b in blocks) and kv.pool.num_cached_free_blocks == 3


def test_a_length_only_run_with_preemptions_is_unchanged(monkeypatch):
    """A tight pool: requests are preempted and resume on their own cached blocks. Registering
    private blocks late gives the same steps, requests and prefix stats as registering them as
    they fill."""
    import numpy as np

    from kvsim.sim.serving import results

    from kvsim.sim.serving import runner
    from kvsim.sim.config import RunConfig

    rng = np.random.default_rng(3)
    trace = [(0.01 * i, int(rng.integers(20, 300)), int(rng.integers(20, 200)))
             for i in range(120)]
    config = RunConfig(model="llama-2-7b", num_gpu_blocks=90, max_num_seqs=32,
                       max_num_batched_tokens=512, block_size=16)

    def frames(may_be_continued=True):
        r = runner.simulate([Request(i, *t, may_be_continued=may_be_continued)
                             for i, t in enumerate(trace)], config, keep_steps=True)
        stats = [rep.kv.prefix_stats for rep in r.replicas]
        return results.steps_frame(r), results.requests_frame(r), stats

    late, unreachable = frames(), frames(may_be_continued=False)
    monkeypatch.setattr(runner, "KVCacheManager", lambda *args, **kw: KVCacheManager(*args))
    eager = frames()
    for got in (late, unreachable):
        assert got[0].equals(eager[0]) and got[1].equals(eager[1]) and got[2] == eager[2]
    assert late[0]["preemptions"].sum() > 0 and late[2][0].num_hit_tokens == 0


# --- finished requests that nothing can continue ------------------------------------------------

def finish_then_evict(may_be_continued):
    """Request 1 (12 prompt tokens: three full blocks of 4) finishes; then request 2 needs every
    block of the pool of 6, evicting the three."""
    kv = KVCacheManager(6, 4, defer_private_blocks=True)
    a = RequestState(Request(1, 0.0, 12, 5, may_be_continued=may_be_continued), 4)
    kv.allocate(1, a, 13)
    a.status = RequestStatus.FINISHED            # as the scheduler sets it before freeing
    kv.free(1)
    after_finish = (kv.free_queue(), kv.pool.num_cached_free_blocks, len(kv.pool.index),
                    a._hashes is None)
    kv.allocate(2, seq(2, 24, 1), 24)
    return after_finish, kv.pool.num_evictions, len(kv.pool.index)


def test_a_finished_request_nothing_continues_caches_its_blocks_without_ids():
    """Its three full blocks queue (after the partial fourth, reused first) and count as cached,
    exactly as registered ones; no id was computed and the index never held them; evicting
    them counts three evictions, as it does for registered blocks."""
    unreachable, registered = finish_then_evict(False), finish_then_evict(True)
    assert unreachable[0] == ([3, 4, 5, 2, 1, 0], 3, 0, True)
    assert registered[0] == ([3, 4, 5, 2, 1, 0], 3, 3, False)
    assert unreachable[1:3] == registered[1:3] == (3, 0)


def test_a_preempted_request_nothing_continues_still_finds_its_own_blocks():
    """Preemption is not the end: its blocks get their ids, and it resumes on them."""
    kv = KVCacheManager(30, 4, defer_private_blocks=True)
    a = RequestState(Request(1, 0.0, 12, 5, may_be_continued=False), 4)
    blocks = kv.allocate(1, a, 12)
    kv.free(1)
    a.num_preemptions = 1
    assert kv.lookup(a).block_ids == blocks[:2]
    assert [kv.pool.block_hashes[b] for b in blocks[:3]] == a.block_hashes(0, 3)


def test_only_a_named_jsonl_line_may_be_continued(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2}\n'
                     '{"arrival_s": 1, "prompt_tokens": 5, "output_tokens": 2, '
                     '"request_id": "a"}\n'
                     '{"arrival_s": 2, "prompt_tokens": 9, "output_tokens": 2, '
                     '"continues": "a"}\n')
    assert [r.may_be_continued for r in read_trace(trace)] == [False, True, False]
    assert all(not r.may_be_continued for r in read_trace(sample_path("azure-conv")))
    assert Request(0, 0.0, 5, 2).may_be_continued
    assert Request(0, 0.0, 5, 2, may_be_continued=False) == Request(0, 0.0, 5, 2)


def test_a_decode_run_grows_slots_in_opened_blocks_as_step_by_step_allocation_would():
    """A decode run opens its blocks first, then brings each request's slots forward in one
    ``grow_slots``: a private request only counts them; one with token ids registers the
    blocks it filled. Block tables, slots, cached blocks and the free queue come out as
    allocating one token at a time."""
    def story(request, grow_in_one_call):
        kv = KVCacheManager(30, 4, defer_private_blocks=True)
        s = RequestState(request, 4, greedy=True)
        kv.allocate(s.request_id, s, 6)
        s.num_computed_tokens, s.num_output_tokens = 6, 1
        for _ in range(7):           # seven decode steps: blocks 2 and 3 open
            if grow_in_one_call and s.num_computed_tokens % 4 == 0:
                kv.open_blocks([s])
            elif not grow_in_one_call:
                kv.allocate(s.request_id, s, 1, num_computed_tokens=s.num_computed_tokens)
            s.num_computed_tokens += 1
            s.num_output_tokens += 1
        if grow_in_one_call:
            kv.grow_slots([s])
        blocks = kv.block_ids(s.request_id)
        seen = (blocks, kv.num_slots(s.request_id), [kv.is_cached(b) for b in blocks])
        kv.free(s.request_id)
        return seen, kv.free_queue(), kv.pool.num_cached_free_blocks

    private = Request(1, 0.0, 6, 10)
    shared = Request(2, 0.0, 6, 10, prompt_token_ids=list(range(6)))
    for request in (private, shared):
        assert story(request, grow_in_one_call=True) == story(request, grow_in_one_call=False)
    assert story(private, True)[0] == ([0, 1, 2, 3], 13, [False] * 4)   # registered when freed
    assert story(shared, True)[0] == ([0, 1, 2, 3], 13, [True, True, True, False])
