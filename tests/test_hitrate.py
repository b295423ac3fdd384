"""`kvsim hitrate`: cache-only replay, LRU's one-pass curve, Belady as the upper bound."""

import json
import random
import subprocess
import sys

import numpy as np
import pytest

from kvsim.cache.hitrate import (ReplayRequest, hitrate_curves, lru_hits, parse_capacities,
                                 parse_policies, policy_hits, render_hitrate_table,
                                 replay_oracle)
from kvsim.cache.policies import POLICY_NAMES
from kvsim.errors import ConfigError
from kvsim.workloads.request import Request

BS = 4


def req(hashes, prompt_tokens, priority=0):
    """A replay request with block size 4: lookup covers (prompt - 1) // 4 blocks."""
    return ReplayRequest(np.array(hashes, dtype=np.int64), (prompt_tokens - 1) // BS,
                         prompt_tokens, priority)


def hits(reqs, name, capacity):
    oracle = replay_oracle(reqs) if name == "belady" else None
    return policy_hits(reqs, name, capacity, oracle)


# Two documents A-B and C-D; the third request re-reads A-B, the fourth C (8 tokens: its one
# block is within the lookup range, (8-1)//4 = 1).
TRACE = [req([1, 2], 9), req([3, 4], 9), req([1, 2], 9), req([3], 8)]


def test_hand_checked_lru_and_belady_hit_blocks_at_capacities_2_3_4():
    # capacity 2: every request flushes the cache, no hit.
    # capacity 3: request 1 evicts B (released before A: tail first); request 2 hits A, and
    #   evicts D (released before C) for B; request 3 hits C.        -> 2 blocks
    # capacity 4: nothing is ever evicted: A, B and C hit.           -> 3 blocks
    for name in ("lru", "belady", "lfu", "priority", "hybrid"):
        assert [hits(TRACE, name, c) for c in (2, 3, 4)] == [0, 2, 3], name
    assert list(lru_hits(TRACE, [2, 3, 4])) == [0, 2, 3]


def test_belady_beats_lru_when_the_oldest_block_comes_back_first():
    trace = [req([1], 5), req([2], 5), req([3], 5), req([1], 5)]
    assert [hits(trace, "lru", c) for c in (1, 2, 3)] == [0, 0, 1]
    assert [hits(trace, "belady", c) for c in (1, 2, 3)] == [0, 1, 1]   # keeps 1, drops 2


def test_lfu_keeps_the_block_hit_before():
    trace = [req([1], 5), req([1], 5), req([2], 5), req([3], 5), req([1], 5)]
    assert hits(trace, "lru", 2) == 1 and hits(trace, "lfu", 2) == 2


def test_priority_keeps_the_important_requests_block():
    trace = [req([1], 5, 0), req([2], 5, 1), req([3], 5, 1), req([1], 5, 0)]
    assert hits(trace, "lru", 2) == 0 and hits(trace, "priority", 2) == 1


def test_hybrid_keeps_a_continued_chain_and_not_a_deep_one_off_tail():
    trace = [req([1, 2], 9), req([1, 2, 3], 13), req([7, 8], 9), req([9, 10, 11], 13),
             req([1, 2, 3, 4], 17)]          # 5 one-off blocks: LRU keeps one block of 1, 2, 3
    assert hits(trace, "lru", 6) == 2 + 1 and hits(trace, "hybrid", 6) == 2 + 2
    trace = [req([1, 2, 3], 13), req([4], 5), req([5], 5), req([4], 5)]
    assert hits(trace, "lru", 4) == 1 and hits(trace, "hybrid", 4) == 1


def test_the_last_token_is_never_a_hit_and_big_requests_keep_their_first_blocks():
    aligned = [req([1, 2], 8), req([1, 2], 8)]          # lookup covers 1 block of 2
    assert hits(aligned, "lru", 4) == 1
    big = [req([1, 2, 3, 4], 17), req([1, 2, 3, 4], 17)]
    assert [hits(big, "lru", c) for c in (2, 3)] == [2, 3]
    assert list(lru_hits(big, [2, 3])) == [2, 3]


def random_trace(seed, n=150):
    """Requests cutting chained 'documents' (hot ones more often), plus unique blocks."""
    rng = random.Random(seed)
    docs = [[rng.getrandbits(60) for _ in range(rng.randint(1, 20))] for _ in range(12)]
    out = []
    for _ in range(n):
        doc = docs[min(int(rng.expovariate(0.4)), len(docs) - 1)]
        blocks = doc[:rng.randint(0, len(doc))] + [rng.getrandbits(60)
                                                   for _ in range(rng.randint(0, 6))]
        blocks = blocks or [rng.getrandbits(60)]
        tokens = len(blocks) * BS + rng.choice([0, 1, 2, 3])
        out.append(req(blocks, tokens, rng.randint(0, 2)))
    return out


CAPACITIES = [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144]


@pytest.mark.parametrize("seed", range(4))
def test_lru_one_pass_equals_the_direct_simulation(seed):
    trace = random_trace(seed)
    one_pass = lru_hits(trace, CAPACITIES)
    assert list(one_pass) == [hits(trace, "lru", c) for c in CAPACITIES]
    assert list(one_pass) == sorted(one_pass)          # LRU has no Belady anomaly


@pytest.mark.parametrize("seed", range(4))
def test_belady_is_at_least_every_other_policy_at_every_capacity(seed):
    trace = random_trace(seed + 10)
    for capacity in CAPACITIES:
        best = hits(trace, "belady", capacity)
        for name in ("lru", "lfu", "priority", "hybrid", "arc", "s3fifo"):
            assert best >= hits(trace, name, capacity), (name, capacity)


def test_curves_table_and_json_shape():
    requests = [Request(i, 0.0, 9, 1, prefix_hashes=np.array(h), hash_block_size=4)
                for i, h in enumerate([[1, 2], [3, 4], [1, 2]])]
    told = []
    result = hitrate_curves(requests, [2, 4], ["lru", "belady"], block_size=4,
                            progress=lambda done, total: told.append((done, total)))
    assert told == [(1, 4), (2, 4), (3, 4), (4, 4)]       # (each replay as it ends)
    assert result["prompt_tokens"] == 27 and result["num_requests"] == 3
    by = {(r["policy"], r["capacity_blocks"]): r["hit_rate"] for r in result["rows"]}
    assert by == {("lru", 2): 0.0, ("lru", 4): 8 / 27, ("belady", 2): 0.0,
                  ("belady", 4): 8 / 27}
    table = render_hitrate_table(result)
    assert "29.63%" in table and table.splitlines()[1].split()[-2:] == ["lru", "belady"]
    narrow = render_hitrate_table(result, width=40).splitlines()
    assert [line.split()[-1] for line in narrow if line.split()[0] == "blocks"] == [
        "lru", "belady"]                                    # (a block of columns each)
    assert all(len(line) <= 40 for line in narrow[1:])


def test_capacities_and_policies_are_parsed_and_checked():
    assert parse_capacities("5000,1000,1_000", None, 16) == [1000, 5000]
    assert parse_capacities(None, "16000,32", 16) == [2, 1000]
    for bad in (("0", None), ("x", None), (None, "8"), ("1", "16"), (None, None)):
        with pytest.raises(ConfigError):
            parse_capacities(*bad, 16)
    assert parse_policies("lru, belady,lru") == ["lru", "belady"]
    with pytest.raises(ConfigError, match="fifo"):
        parse_policies("lru,fifo")
    with pytest.raises(ConfigError, match=r"field 'capacity': empty item in '10,,20'"):
        parse_capacities("10,,20", None, 16)
    with pytest.raises(ConfigError, match=r"field 'eviction': empty item in 'lru,,lfu'"):
        parse_policies("lru,,lfu")
    with pytest.raises(ConfigError, match="from one block to 50,000,000"):
        parse_capacities("100000000000", None, 16)      # (its arrays ran out of memory)
    assert set(POLICY_NAMES) >= {"lru", "lfu", "priority", "hybrid", "arc", "s3fifo", "belady"}


def test_command_prints_json_and_writes_the_report(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kvsim.cli", "hitrate", "sample:mooncake", "--limit", "40",
         "--capacity", "2000,40000", "--eviction", "lru,lfu,belady", "--json",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert len(result["rows"]) == 6 and result["trace"] == "sample:mooncake"
    rate = {(r["policy"], r["capacity_blocks"]): r["hit_rate"] for r in result["rows"]}
    assert rate["belady", 2000] >= rate["lru", 2000] > 0
    assert {p.name for p in tmp_path.iterdir()} == {"hitrate.json", "hitrate.html"}


def test_command_quiet_prints_nothing_but_writes_the_files(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kvsim.cli", "hitrate", "sample:mooncake", "--limit", "20",
         "--capacity", "2000", "--eviction", "lru", "--quiet", "--no-html",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout) == (0, "")
    assert {p.name for p in tmp_path.iterdir()} == {"hitrate.json"}


def test_command_names_the_files_it_wrote_after_the_table(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kvsim", "hitrate", "sample:mooncake", "--limit", "20",
         "--capacity", "2000", "--eviction", "lru", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"wrote {tmp_path}/hitrate.json, hitrate.html"


def test_html_without_out_is_refused_not_ignored(tmp_path):
    """``--html`` asks for hitrate.html, which only --out gives a place (it was ignored)."""
    done = subprocess.run([sys.executable, "-m", "kvsim", "hitrate", "sample:mooncake",
                           "--limit", "5", "--capacity", "100", "--html"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (
        2, "kvsim: error: --html: writes hitrate.html into --out: give --out DIR\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["nan", "-1", "inf"])
def test_a_lookahead_that_is_no_time_is_one_line(value):
    done = subprocess.run([sys.executable, "-m", "kvsim", "hitrate", "sample:mooncake",
                           f"--lookahead-s={value}"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("kvsim: error: --lookahead-s: must be "
                                  "a finite number of seconds >= 0, got ")


def test_hitrate_says_which_rows_of_the_trace_it_left_out(tmp_path):
    """A BurstGPT file's failed row holds no request: the table and hitrate.json count it, as
    a run's summary does."""
    trace = tmp_path / "burst.csv"
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "5,ChatGPT,472,18,490,Conversation log\n"
                     "45,ChatGPT,1087,0,1087,Conversation log\n")
    done = subprocess.run([sys.executable, "-m", "kvsim.cli", "hitrate", str(trace),
                           "--capacity", "10", "--eviction", "lru", "--out", str(tmp_path / "h")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == ("left out 1 trace row without a request to run: "
                                           "failed (BurstGPT Response tokens 0): 1")
    written = json.loads((tmp_path / "h" / "hitrate.json").read_text())
    assert (written["num_requests"], written["trace_rows_left_out"]) == (1, {"failed": 1})
