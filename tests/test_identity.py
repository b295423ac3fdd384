"""Block identity (issue 16): generated tokens named by content as vLLM hashes them, one scheme
for every block, multi-turn continuations without token ids."""

import json

import numpy as np
import pytest

from kvsim.cache import KVCacheManager
from kvsim.cache.scheduler import Scheduler, SchedulerConfig
from kvsim.cache.request_state import RequestState
from kvsim.errors import TraceError
from kvsim.workloads.identity import (_DOMAIN_PREFIX, NamedSequences, block_ids,
                                      expand_prefix_hashes, hash_token_blocks, mix)
from kvsim.workloads import Request, TraceOptions, read_trace
from kvsim.workloads.generators.build import GenConfig, generate
from kvsim.workloads.writer import write_native

BS = 4


def req(rid, prompt, output, **kw):
    ids = kw.pop("ids", None)
    if ids is not None:
        kw["prompt_token_ids"] = np.asarray(ids, dtype=np.int64)
        prompt = len(ids)
    return Request(rid, 0.0, prompt, output, **kw)


@pytest.mark.parametrize("block_size", [1, 3, 4, 8, 12, 20])
def test_a_chunk_hash_names_each_engine_block_ending_in_its_chunk_by_the_offset(block_size):
    """Chunks of 8 tokens named 7, 9, -5: engine block i ends at token e = (i + 1) * bs and is
    named mix(hash of the chunk holding token e - 1, (e - 1) % 8); only full blocks of the 22
    tokens get an id."""
    hashes = np.array([7, 9, -5])
    ids = expand_prefix_hashes(hashes, 8, 22, block_size)
    last = [(i + 1) * block_size - 1 for i in range(22 // block_size)]
    salted = [np.int64(hashes[t // 8]).astype(np.uint64) ^ _DOMAIN_PREFIX for t in last]
    assert ids.tolist() == [int(mix(h, t % 8)) for h, t in zip(salted, last)]
    assert expand_prefix_hashes(hashes, 8, 3, 4).tolist() == []
    with pytest.raises(ValueError, match="cannot cover"):
        expand_prefix_hashes(hashes, 8, 25, 1)


def test_recorded_outputs_are_hashed_like_prompt_tokens():
    prompt, outputs = list(range(10, 19)), list(range(50, 61))
    first = req(0, 0, 11, ids=prompt, output_token_ids=np.asarray(outputs))
    resend = req(1, 0, 5, ids=prompt + outputs + [7, 7, 7])
    whole = block_ids(first, BS, 20)
    assert len(whole) == 5
    assert whole.tolist() == hash_token_blocks(prompt + outputs, BS).tolist()
    assert block_ids(resend, BS)[:5].tolist() == whole.tolist()


def test_greedy_twins_share_generated_blocks_random_ones_do_not():
    a, b = req(0, 0, 12, ids=[5] * 10), req(1, 0, 9, ids=[5] * 10)
    other = req(2, 0, 12, ids=[5] * 9 + [6])
    greedy = [block_ids(r, BS, 20, greedy=True).tolist() for r in (a, b, other)]
    assert greedy[0][:4] == greedy[1][:4]          # identical prompts, identical outputs
    assert greedy[0][:2] == greedy[2][:2] and greedy[0][2] != greedy[2][2]
    rand = [block_ids(r, BS, 20).tolist() for r in (a, b)]
    assert rand[0][:2] == rand[1][:2] and not set(rand[0][2:]) & set(rand[1][2:])


def test_greedy_needs_content_identical_prompts_of_unknown_content_stay_apart():
    a, b = req(0, 9, 12), req(1, 9, 12)
    assert not set(block_ids(a, BS, 20, True).tolist()) & set(block_ids(b, BS, 20, True).tolist())
    h = np.asarray([3, 4, 5])
    c = req(2, 10, 12, prefix_hashes=h, hash_block_size=4)
    d = req(3, 10, 12, prefix_hashes=h, hash_block_size=4)
    assert block_ids(c, BS, 20, True).tolist() == block_ids(d, BS, 20, True).tolist()


@pytest.mark.parametrize("kind", ["length", "hashes"])
def test_a_continuation_holds_the_earlier_requests_blocks(kind):
    extra = {} if kind == "length" else {"prefix_hashes": np.arange(3), "hash_block_size": 4}
    first = req(0, 10, 7, **extra)
    extra2 = {} if kind == "length" else {"prefix_hashes": np.arange(10, 17),
                                          "hash_block_size": 4}
    second = req(1, 25, 6, continues=first, **extra2)
    third = req(2, 35, 6, continues=second)
    mine = block_ids(first, BS, 17).tolist()          # 4 full blocks: prompt + generated
    assert block_ids(second, BS).tolist()[:4] == mine
    assert block_ids(third, BS).tolist()[:7] == block_ids(second, BS, 31).tolist()
    assert block_ids(second, BS).tolist()[4] not in block_ids(third, BS, 40, True).tolist()[7:]


@pytest.mark.parametrize("greedy", [False, True])
def test_a_run_names_a_continuation_from_its_parents_ids_with_the_same_result(greedy,
                                                                             monkeypatch):
    """Turns 1-2-3-4 of one session, each named whole (prompt and output) in turn, as a run
    names them: with the run's memo each turn names only its own blocks, and every id (the
    first blocks, the ones inherited, a shorter lookup's) is the one named without it."""
    import kvsim.workloads.identity as identity
    turns = [req(0, 10, 7)]
    for i, prompt in enumerate((25, 35, 49), start=1):
        turns.append(req(i, prompt, 6 + i, continues=turns[-1]))
    plain = [block_ids(t, BS, t.prompt_tokens + t.output_tokens, greedy).tolist() for t in turns]
    named, seen, real = NamedSequences(), [], identity._own_ids
    monkeypatch.setattr(identity, "_own_ids",
                        lambda r, *a: seen.append(r.request_id) or real(r, *a))
    memo = [block_ids(t, BS, t.prompt_tokens + t.output_tokens, greedy, named).tolist()
            for t in turns]
    assert memo == plain and seen == [0, 1, 2, 3]
    assert block_ids(turns[3], BS, 30, greedy, named).tolist() == plain[3][:7]
    assert named.get(turns[3], BS, not greedy) is None


def test_a_memo_forgets_the_oldest_and_skips_requests_nothing_continues():
    named = NamedSequences(capacity=2)
    a, b, c = req(0, 8, 4), req(1, 8, 4), req(2, 8, 4)
    d = req(3, 8, 4, may_be_continued=False)
    for r in (a, b, c, d):
        block_ids(r, BS, 12, False, named)
    assert named.get(a, BS, False) is None and named.get(d, BS, False) is None
    assert named.get(c, BS, False).tolist() == block_ids(c, BS, 12).tolist()


def run(requests, greedy, num_blocks=64):
    """Admit ``requests`` one after another (each finishes first); hit tokens per request."""
    sched = Scheduler(KVCacheManager(num_blocks, BS), SchedulerConfig(max_model_len=4096))
    hits = []
    for r in requests:
        seq = RequestState(r, BS, greedy)
        sched.add(seq)
        while sched.has_unfinished():
            sched.schedule()
            sched.update_from_output()
        hits.append(seq.num_cached_tokens)
    return hits


def test_a_resent_answer_hits_in_the_scheduler():
    first = req(0, 10, 9)
    second = req(1, 24, 3, continues=first)
    assert run([first, second], greedy=False) == [0, 16]   # 19 tokens: 4 full blocks
    alone = req(1, 24, 3)
    assert run([req(0, 10, 9), alone], greedy=False) == [0, 0]


@pytest.mark.parametrize("greedy, hit", [(True, 20), (False, 8)])
def test_a_resumed_twin_hits_its_siblings_generated_blocks_only_when_greedy(greedy, hit):
    ids = list(range(3, 12))
    assert run([req(0, 0, 12, ids=ids)], greedy) == [0]
    sched = Scheduler(KVCacheManager(64, BS), SchedulerConfig(max_model_len=4096))
    first = RequestState(req(0, 0, 14, ids=ids), BS, greedy)
    sched.add(first)
    while sched.has_unfinished():
        sched.schedule()
        sched.update_from_output()
    twin = RequestState(req(1, 0, 14, ids=ids), BS, greedy)
    twin.num_output_tokens = 13          # as a twin preempted after 13 tokens, resuming
    assert sched.kv.lookup(twin).num_tokens == hit


def write(tmp_path, lines):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_native_lines_carry_outputs_and_continuations(tmp_path):
    path = write(tmp_path, [
        {"prompt_tokens": 10, "output_tokens": 3, "request_id": "a"},
        {"prompt_token_ids": [1, 2, 3], "output_tokens": 2, "output_token_ids": [4, 5]},
        {"prompt_tokens": 20, "output_tokens": 3, "continues": "a", "request_id": 7},
        {"prompt_tokens": 30, "output_tokens": 1, "continues": 7}])
    reqs = read_trace(path)
    assert reqs[1].output_token_ids.tolist() == [4, 5]
    assert reqs[2].continues is reqs[0] and reqs[3].continues is reqs[2]
    assert block_ids(reqs[3], BS)[:5].tolist() == block_ids(reqs[2], BS, 23).tolist()


def test_a_continued_request_outside_the_window_still_names_its_blocks(tmp_path):
    path = write(tmp_path, [
        {"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 8, "request_id": "a"},
        {"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 8, "request_id": "b"},
        {"arrival_s": 5, "prompt_tokens": 20, "output_tokens": 1, "continues": "a"},
        {"arrival_s": 5, "prompt_tokens": 20, "output_tokens": 1, "continues": "b"}])
    from kvsim.workloads import TraceOptions, load_trace
    kept = list(load_trace(path, TraceOptions(start_s=1)))
    assert [r.request_id for r in kept] == [0, 1]
    a, b = (block_ids(r, BS).tolist() for r in kept)
    assert not set(a) & set(b)


@pytest.mark.parametrize("lines, message", [
    ([{"prompt_tokens": 4, "output_tokens": 2, "output_token_ids": [1]}],
     "t.jsonl:1: field 'output_token_ids': 1 ids for 2 output tokens"),
    ([{"prompt_tokens": 4, "output_tokens": 2, "continues": "x"}],
     "t.jsonl:1: field 'continues': no earlier line has request_id 'x'"),
    ([{"prompt_tokens": 4, "output_tokens": 2, "request_id": "x"},
      {"prompt_tokens": 5, "output_tokens": 2, "continues": "x"}],
     "t.jsonl:2: field 'prompt_tokens': 5 is shorter than the continued request 'x'"),
    ([{"prompt_tokens": 4, "output_tokens": 2, "request_id": "x"},
      {"prompt_token_ids": [1] * 9, "output_tokens": 2, "continues": "x"}],
     "t.jsonl:2: field 'continues': give prompt_token_ids or continues, not both"),
    ([{"prompt_tokens": 4, "output_tokens": 2, "request_id": "x"},
      {"prompt_tokens": 4, "output_tokens": 2, "request_id": "x"}],
     "t.jsonl:2: field 'request_id': 'x' is already used at"),
])
def test_bad_links_are_one_clear_line(tmp_path, lines, message):
    path = write(tmp_path, lines)
    with pytest.raises(TraceError) as e:
        read_trace(path)
    assert message in str(e.value)


def test_sorting_cannot_put_a_continuation_before_the_request_it_continues(tmp_path):
    """--sort reorders lines by arrival; a continuation timed before its parent would come
    first and name blocks it cannot have: refused (without --sort the time going backwards
    is)."""
    from kvsim.workloads import TraceOptions
    path = write(tmp_path, [
        {"arrival_s": 1, "prompt_tokens": 4, "output_tokens": 2, "request_id": "a"},
        {"arrival_s": 0.5, "prompt_tokens": 8, "output_tokens": 2, "continues": "a"}])
    with pytest.raises(TraceError, match="field 'continues': arrives at 0.5 s"):
        read_trace(path, TraceOptions(sort=True))


@pytest.mark.parametrize("preset", ["chat", "agent"])
def test_chat_and_agent_turns_continue_the_previous_turn(tmp_path, preset):
    requests = generate(preset, GenConfig(num_requests=40, seed=3))
    linked = [r for r in requests if r.continues is not None]
    assert linked
    for r in linked:
        assert r.session_id == r.continues.session_id
        assert r.prompt_tokens > r.continues.prompt_tokens + r.continues.output_tokens
    path = tmp_path / "w.jsonl"
    write_native(requests, path)
    back = read_trace(path)
    assert [b.continues.request_id if b.continues else None for b in back] == \
        [r.continues.request_id if r.continues else None for r in requests]
    assert [block_ids(b, 16).tolist() for b in back] == \
        [block_ids(r, 16).tolist() for r in requests]


def test_trace_stats_count_a_resent_reply_as_an_ideal_hit(tmp_path):
    from kvsim.workloads.stats import trace_stats
    lines = [{"prompt_tokens": 32, "output_tokens": 32, "request_id": "a"},
             {"prompt_tokens": 80, "output_tokens": 4, "continues": "a"}]
    stats = trace_stats(read_trace(write(tmp_path, lines)), block_size=16)
    assert stats["full_blocks"] == 2 + 5
    # the parent computed the KV of 63 tokens (its last token's never): 3 blocks to hit
    assert stats["ideal_prefix_hit_ratio"] == pytest.approx(3 / 7)
    windowed = [{**lines[0], "arrival_s": 0}, {**lines[1], "arrival_s": 100}]
    late = trace_stats(read_trace(write(tmp_path, windowed), TraceOptions(start_s=50)), 16)
    assert late["ideal_prefix_hit_ratio"] == 0      # (its parent is outside the window)
    unlinked = [dict(x) for x in lines]
    unlinked[1].pop("continues")
    assert trace_stats(read_trace(write(tmp_path, unlinked)), 16)["ideal_prefix_hit_ratio"] == 0
