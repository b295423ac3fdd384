"""The compiled parts (cache/_intmap.c, cache/_bulk.c) behave as the Python they stand in for:
the map of block hashes as a ``dict``, the list loops as bulk.py's; and a simulation gives the
same files with them as without (``KVSIM_PURE_PYTHON=1``)."""

import heapq
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvsim.cache import bulk, chain_walk, intmap, s3fifo

IntMap = pytest.importorskip("kvsim.cache._intmap").IntMap

SAMPLE = Path(__file__).resolve().parents[1] / "workloads/samples/mooncake_conversation_300.jsonl"
BIG = 1 << 80                       # an int past 64 bits: never a key


def test_the_cache_uses_the_compiled_map_unless_told_not_to():
    expected = not os.environ.get("KVSIM_PURE_PYTHON")
    assert intmap.COMPILED is expected
    assert isinstance(intmap.hash_map(), IntMap if expected else dict)


def test_add_new_puts_every_pair_or_none():
    m = IntMap()
    assert m.add_new([10, 11], [0, 1]) is True
    assert m.add_new([12, 10], [2, 3]) is False          # 10 is here: 12 is not put either
    assert m.add_new([13, 13], [4, 5]) is False          # 13 twice
    assert dict(m) == {10: 0, 11: 1}


@pytest.mark.parametrize("make", [IntMap, dict], ids=["compiled", "dict"])
def test_count_up_and_down_keep_a_multiset(make, monkeypatch):
    monkeypatch.setattr(intmap, "COMPILED", make is IntMap)
    m = make()
    intmap.count_up(m, [5, 0, 5, 1])
    intmap.count_up(m, [1, -7])
    assert m == {5: 2, 0: 1, 1: 2, -7: 1}
    intmap.count_down(m, [5, 0, 1])
    assert m == {5: 1, 1: 1, -7: 1}             # 0 went at zero
    with pytest.raises(KeyError):
        intmap.count_down(m, [-7, 0])           # -7 counted down, then 0 is missing
    assert m == {5: 1, 1: 1}


def _run_end(held, keys, start, stop):
    """run_end as the host tier's Python scans it."""
    seen = set()
    for i in range(start, min(stop, len(keys))):
        if keys[i] in held or keys[i] in seen:
            return i
        seen.add(keys[i])
    return min(stop, len(keys))


def test_run_end_stops_at_a_held_key_or_a_repeat():
    m = IntMap()
    m[5] = 0
    assert m.run_end([1, 2, 3, 5, 6], 0, 5) == 3          # 5 is held
    assert m.run_end([1, 2, 1, 5], 0, 4) == 2             # 1 again
    assert m.run_end([1, 2, 1, 5], 1, 4) == 3             # from 2: 1 once, then 5
    assert m.run_end([0, 1, 0], 0, 9) == 2 and m.run_end([], 0, 0) == 0


@settings(max_examples=200, deadline=None)
@given(held=st.sets(st.integers(-3, 30), max_size=8), keys=st.lists(st.integers(-3, 30)),
       start=st.integers(0, 12), stop=st.integers(0, 40))
def test_run_end_is_the_host_tiers_scan(held, keys, start, stop):
    m = IntMap()
    m.update((k, 0) for k in held)
    start = min(start, len(keys), stop)
    assert m.run_end(keys, start, stop) == _run_end(held, keys, start, stop)


def test_delete_many_stops_at_the_first_missing_key_as_a_loop_of_del():
    m = IntMap()
    m.set_many([1, 2, 3], ["a", "b", "c"])
    with pytest.raises(KeyError):
        m.delete_many([1, 9, 2])
    assert dict(m) == {2: "b", 3: "c"}


def test_prefix_and_get_many():
    m = IntMap()
    m.update(zip([5, 6, 7], [50, 60, 70]))
    assert m.prefix([5, 6, 8, 7]) == [50, 60]
    assert m.prefix(iter([8, 5])) == []
    assert m.get_many([7, 8, "x", BIG], -1) == [70, -1, -1, -1]


def test_values_of_any_kind_come_back_equal_and_are_released():
    m, holder = IntMap(), {3: None, 4: None}
    values = [0, -1, 2**63 - 1, -2**63, BIG, 1.5, holder, None]
    m.set_many(range(len(values)), values)
    assert [m[k] for k in range(len(values))] == values
    assert m[6] is holder
    before = sys.getrefcount(holder)
    del m[6]
    assert sys.getrefcount(holder) == before - 1
    assert m.ints_at([0, 1, 2, 3, 4]) and not m.ints_at([0, 5]) and not m.ints_at([0, 99])


def test_keys_are_ints_of_64_bits():
    m = IntMap()
    for key, error in (("a", TypeError), (BIG, OverflowError), (1.0, TypeError)):
        with pytest.raises(error):
            m[key] = 1
        assert key not in m and m.get(key, "-") == "-" and m.pop(key, "-") == "-"
        with pytest.raises(KeyError):
            m[key]
    assert m.isdisjoint(["a", BIG, 7]) and m.keys().isdisjoint([7])
    m[-2**63] = m[2**63 - 1] = 0
    assert sorted(m) == [-2**63, 2**63 - 1] and len(m) == 2 and bool(m)
    assert repr(IntMap()) == "IntMap({})"
    assert m == {2**63 - 1: 0, -2**63: 0} and m != {0: 0} and m != IntMap() and m != [0]


keys = st.one_of(st.integers(-3, 40), st.integers(-2**63, 2**63 - 1))
values = st.one_of(st.integers(-2**70, 2**70), st.none(), st.text(max_size=2))


class MapMachine(RuleBasedStateMachine):
    """Random operations on an IntMap and a dict side by side (tombstones, growth and
    rebuilds included: the few small keys come back again and again)."""

    def __init__(self):
        super().__init__()
        self.m, self.d = IntMap(), {}

    @rule(k=keys, v=values)
    def put(self, k, v):
        self.m[k] = v
        self.d[k] = v

    @rule(k=keys)
    def delete(self, k):
        if k in self.d:
            del self.m[k], self.d[k]
        else:
            with pytest.raises(KeyError):
                del self.m[k]

    @rule(k=keys)
    def pop(self, k):
        assert self.m.pop(k, "gone") == self.d.pop(k, "gone")

    @rule(ks=st.lists(keys, max_size=6), v=values)
    def add_new(self, ks, v):
        fresh = len(set(ks)) == len(ks) and self.d.keys().isdisjoint(ks)
        assert self.m.add_new(ks, [v] * len(ks)) is fresh
        if fresh:
            self.d.update(dict.fromkeys(ks, v))

    @rule(ks=st.lists(keys, max_size=6))
    def delete_many(self, ks):
        present = [k for k in dict.fromkeys(ks) if k in self.d]
        if present == list(ks):
            self.m.delete_many(ks)
            for k in ks:
                del self.d[k]

    @rule(ks=st.lists(keys, max_size=6))
    def lookups(self, ks):
        lead = []
        for k in ks:
            if k not in self.d:
                break
            lead.append(self.d[k])
        assert self.m.prefix(ks) == lead
        assert self.m.get_many(ks, None) == [self.d.get(k) for k in ks]
        assert [self.m.get(k, "-") for k in ks] == [self.d.get(k, "-") for k in ks]
        assert self.m.ints_at(ks) == all(type(self.d.get(k)) is int for k in ks)
        assert self.m.isdisjoint(ks) == self.d.keys().isdisjoint(ks)

    @invariant()
    def same(self):
        assert len(self.m) == len(self.d)
        assert dict(self.m) == self.d and self.m == self.d and not self.m != self.d


TestMapMachine = MapMachine.TestCase
TestMapMachine.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)


def _run(out: Path, pure: bool, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "KVSIM_PURE_PYTHON"}
    if pure:
        env["KVSIM_PURE_PYTHON"] = "1"
    subprocess.run([sys.executable, "-m", "kvsim", "run", str(SAMPLE), "--quiet", "--no-html",
                    "--out", str(out), *args], check=True, env=env, capture_output=True)
    summary = json.loads((out / "summary.json").read_text())
    summary.pop("wall_time_s")
    return summary


@pytest.mark.parametrize("args", [
    (), ("--eviction", "lfu"), ("--eviction", "arc"), ("--eviction", "s3fifo"),
    ("--eviction", "lookahead"), ("--kv-offloading-size", "2"),
], ids=["lru", "lfu", "arc", "s3fifo", "lookahead", "cpu-tier"])
def test_a_run_gives_the_same_files_with_plain_dicts(tmp_path, args):
    small = ("--num-gpu-blocks", "2500")   # (evictions, preemptions, CPU-tier stores and loads)
    compiled = _run(tmp_path / "compiled", False, *small, *args)
    pure = _run(tmp_path / "pure", True, *small, *args)
    assert compiled == pure
    assert ((tmp_path / "compiled/requests.csv").read_bytes()
            == (tmp_path / "pure/requests.csv").read_bytes())


# --- the C loops of kvsim.cache.bulk ---------------------------------------------------------

_bulk = pytest.importorskip("kvsim.cache._bulk")


def test_set_all_and_set_each_assign_as_the_loops_do():
    values = list(range(6))
    assert _bulk.set_all(values, [0, -1, np.int64(2)], "x") is None
    assert values == ["x", 1, "x", 3, 4, "x"]
    assert _bulk.set_each(values, iter([1, 3, 4]), ("a", "b")) is None     # the shorter
    assert values == ["x", "a", "x", "b", 4, "x"]
    with pytest.raises(IndexError):
        _bulk.set_all(values, [1, 6], None)
    assert values[1] is None                           # those before it assigned, as a loop
    with pytest.raises(TypeError):
        _bulk.set_each(values, ["0"], [1])
    assert _bulk.set_all((1, 2), [0], 0) is NotImplemented      # not a list: bulk.py's loop


def test_set_all_sets_bytes_as_the_loop_does():
    marks = bytearray(5)
    assert _bulk.set_all(marks, [0, -1, np.int64(2)], True) is None
    assert marks == bytearray([1, 0, 1, 0, 1])
    with pytest.raises(IndexError, match="bytearray index out of range"):
        _bulk.set_all(marks, [1, 5], 7)
    assert marks[1] == 7                               # those before it assigned, as a loop
    assert _bulk.set_all(marks, [0], 256) is NotImplemented     # the loop raises its own error
    with pytest.raises(ValueError):
        bulk.set_all(marks, [0], 256)
    bulk.set_all(marks, [], "x")                       # (nothing to assign: no error either way)


def test_drop_refs_frees_the_blocks_held_once_split_by_hash():
    refs, hashes = [1, 2, 1, 1, 0], [11, None, None, 13, None]
    assert _bulk.drop_refs(refs, hashes, [3, 1, 2, 0]) == ([3, 0], [2])
    assert refs == [0, 1, 0, 0, 0]
    untouched = [1, 1]
    assert _bulk.drop_refs(untouched, [None, None], [0, 5]) is NotImplemented
    assert _bulk.drop_refs(untouched, [None, None], [0, "1"]) is NotImplemented
    assert untouched == [1, 1]                         # checked before any change


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 4), min_size=1, max_size=30), data=st.data())
def test_drop_refs_matches_the_python_loop(counts, data):
    ids = data.draw(st.lists(st.integers(0, len(counts) - 1), max_size=40))
    hashes = data.draw(st.lists(st.sampled_from([None, 7]), min_size=len(counts),
                                max_size=len(counts)))
    compiled_refs, python_refs = list(counts), list(counts)
    compiled = bulk.drop_refs(compiled_refs, hashes, ids)
    saved, bulk._c = bulk._c, None                     # bulk.py's own loop
    try:
        python = bulk.drop_refs(python_refs, hashes, ids)
    finally:
        bulk._c = saved
    assert (tuple(compiled), compiled_refs) == (tuple(python), python_refs)


# --- the scored pool's eviction walk (kvsim.cache.chain_walk) ---------------------------------

WALKS = [pytest.param(chain_walk.walk_chain, id="python"),
         pytest.param(_bulk.walk_chain, id="compiled")]


def chain_of_three(top=None, shared_parent=False):
    """Free cached blocks 0 <- 1 <- 2 (hashes 10, 11, 12; keys 5, 6, 7), a chain released
    tail first: block 2 is the victim the heap gave. With ``shared_parent`` block 1's content
    is held by another block too (the index has copies of 11)."""
    calls = []
    index = intmap.hash_map()
    index.update({10: 0, 11: {1, 3} if shared_parent else 1, 12: 2})
    context = (
        [10, 11, 12, None], index, [], [False, shared_parent, False, shared_parent],
        [0, 0, 0, 1], [0, 2, 0, 0], None, 0, [None, 10, 11, None], [None, 0, 1, None],
        [1, 1, 0, 0], [None] * 4, [5, 6, 7, None], [], object(),
        lambda *a: calls.append(("drop_copy", *a)), lambda h: calls.append(("child_gone", h)),
        heapq.heappush)
    return context, calls


@pytest.mark.parametrize("walk", WALKS)
def test_the_walk_takes_each_parent_its_victim_leaves_childless_and_first(walk):
    context, calls = chain_of_three()
    victims = []
    assert walk(context, 2, 3, None, victims) == 0
    hashes, index, evicted, _, refs, hits, *_ = context
    assert victims == [2, 1, 0] and evicted == [(2, 12), (1, 11), (0, 10)]
    assert len(index) == 0 and hashes == [None] * 4
    assert refs == [1, 1, 1, 1] and hits == [0] * 4 and context[10] == [0, 0, 0, 0]
    assert calls == [] and context[13] == []


@pytest.mark.parametrize("walk", WALKS)
def test_the_walk_queues_a_parent_keyed_after_the_heaps_smallest(walk):
    context, _ = chain_of_three()
    victims = []
    assert walk(context, 2, 3, 6, victims) == 2      # block 1's key 6 is not below 6
    assert victims == [2] and context[11] == [None, 6, None, None] and context[13] == [6]
    assert walk(context, 1, 1, None, victims) == 0   # one wanted: block 0 is queued
    assert victims == [2, 1] and context[11][0] == 5 and context[13] == [5, 6]


@pytest.mark.parametrize("walk", WALKS)
def test_the_walk_leaves_a_parent_with_copies_to_the_pool(walk):
    context, calls = chain_of_three(shared_parent=True)
    victims = []
    assert walk(context, 2, 3, None, victims) == 2
    assert victims == [2] and calls == [("child_gone", 11)]
    assert context[10] == [1, 1, 0, 0]                # (the pool's callback counts it)


# --- S3-FIFO's queue scans (kvsim.cache.s3fifo) ----------------------------------------------

def test_the_queue_scans_find_free_blocks_never_hit():
    refs, freq = [0, 1, 0, 0], bytearray([0, 0, 2, 0])
    queue = [1, 2, 0, 3, 0, 1]                # held, hit, free, free, free, held
    assert _bulk.first_passing(refs, freq, queue, 0) == 2
    assert _bulk.first_passing(refs, None, queue, 0) == 1       # (free only: 2 is free)
    assert _bulk.first_passing(refs, freq, queue, 5) == 6       # none: the length
    assert _bulk.num_passing(refs, freq, queue, 2, 10) == 3
    assert _bulk.num_passing(refs, freq, queue, 2, 2) == 2
    assert _bulk.num_passing(refs, freq, queue, 1, 10) == 0
    assert _bulk.first_passing(tuple(refs), freq, queue, 0) is NotImplemented
    with pytest.raises(IndexError):
        _bulk.first_passing(refs, freq, [1, 9], 0)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_queue_scans_match_their_python(data):
    n = data.draw(st.integers(1, 10))
    refs = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    freq = bytearray(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    queue = data.draw(st.lists(st.integers(0, n - 1), max_size=80))
    start = data.draw(st.integers(0, len(queue)))
    most = data.draw(st.integers(0, 90))

    def scans():
        found = [s3fifo.first_evictable(refs, freq, queue, start),
                 s3fifo.evictable(refs, freq, queue, start, most)]
        if 0 in [refs[b] for b in queue[start:]]:
            found.append(s3fifo.next_free(refs, queue, start))
        return found

    compiled = scans()
    saved = s3fifo._first_passing, s3fifo._num_passing
    s3fifo._first_passing = s3fifo._num_passing = None        # the Python scans
    try:
        assert scans() == compiled
    finally:
        s3fifo._first_passing, s3fifo._num_passing = saved
