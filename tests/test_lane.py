"""A lane pool's lane: blocks with release clocks, a FIFO with lazy removal and runs as slices."""

from collections import OrderedDict

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvsim.cache import lane as lane_module
from kvsim.cache.lane import Lane

DEEP, CHILD, FIRST = 2, 1, 0        # depths: past a chain's second block, its second, its first


def test_blocks_leave_in_release_order_and_a_head_put_back_goes_first():
    lane = Lane()
    lane.extend([5, 2, 7], [10, 11, 12])
    assert list(lane.items()) == [(5, 10), (2, 11), (7, 12)] and len(lane) == 3
    assert lane.head() == (5, 10) and len(lane) == 3       # a look leaves it queued
    assert lane.popleft() == (5, 10)
    assert 5 not in lane and lane.clock_of == {2: 11, 7: 12}
    lane.appendleft(5, 10)                                 # not taken after all
    assert [lane.popleft() for _ in range(4)] == [(5, 10), (2, 11), (7, 12), None]
    assert len(lane) == 0 and list(lane) == [] and lane._ids == []     # drained: forgotten


def test_a_block_taken_from_the_middle_is_skipped_when_the_head_reaches_it():
    lane = Lane()
    lane.extend([1, 2, 3, 4], [1, 2, 3, 4])
    assert lane.pop(2) == 2 and lane.pop(2, "gone") == "gone"   # a prefix hit took it
    assert 2 not in lane and lane[3] == 3 and len(lane) == 3
    with pytest.raises(KeyError):
        lane[2]
    lane.extend([2], [9])                                  # released again, later
    assert lane.popleft() == (1, 1)
    assert lane.popleft() == (3, 3)                        # the dropped entry passed over
    assert list(lane.items()) == [(4, 4), (2, 9)] and lane._num_stale == 0


def test_a_run_stops_at_the_bound_at_a_shallow_block_and_after_n_blocks():
    depth = bytearray([DEEP]) * 10
    lane = Lane()
    lane.extend([0, 1, 2, 3, 4, 5], [3, 4, 5, 6, 7, 8])
    assert lane.take_run(2, None, False, depth) == [0, 1]           # n
    assert lane.take_run(9, 6, False, depth) == [2]                 # clocks below 6
    assert lane.take_run(9, 6, True, depth) == [3]                  # at most 6
    depth[5] = CHILD
    assert lane.take_run(9, None, False, depth) == [4]              # up to the second block
    assert lane.take_run(9, None, False, depth) == []
    assert list(lane.items()) == [(5, 8)] and len(lane) == 1
    assert lane.clock_of == {5: 8}


def test_a_run_over_dropped_entries_skips_them():
    depth = bytearray([DEEP]) * 10
    depth[6] = FIRST
    lane = Lane()
    lane.extend([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7])
    lane.pop(2)
    lane.pop(4)
    assert lane.take_run(2, None, False, depth) == [1, 3]
    assert lane.take_run(9, 5, True, depth) == [5]
    assert lane.take_run(9, None, False, depth) == []               # 6 is a chain's first
    assert lane.popleft() == (6, 6) and list(lane) == [7] and lane._num_stale == 0


def test_dropped_entries_are_rebuilt_away_and_the_consumed_front_is_cut(monkeypatch):
    monkeypatch.setattr(lane_module, "_MIN_COMPACT", 1)
    lane = Lane()
    lane.extend([0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6])
    for block_id in (1, 3, 5):
        lane.pop(block_id)
    assert lane._ids == [0, 1, 2, 3, 4, 5] and lane._num_stale == 3   # 3 dropped, 3 live
    lane.pop(0)                                                       # now 4 against 2
    assert lane._ids == [2, 4] and lane._num_stale == 0
    assert lane.popleft() == (2, 3) and lane.popleft() == (4, 5)
    lane.extend([7], [9])                                             # the front cut first
    assert lane._ids == [7] and lane._start == 0 and list(lane.items()) == [(7, 9)]


def test_clearing_forgets_every_block():
    lane = Lane()
    lane.extend([3, 1], [1, 2])
    lane.clear()
    assert len(lane) == 0 and lane.clock_of == {} and lane.popleft() is None


class LaneAgainstOrderedDict(RuleBasedStateMachine):
    """Every operation against an ``OrderedDict`` block -> clock (the lanes' former type), with
    the put-backs the pools make: a head just taken (``_put_back``) and a woken block into the
    front part by its clock (``_requeue``)."""

    def __init__(self):
        super().__init__()
        self.threshold = lane_module._MIN_COMPACT
        lane_module._MIN_COMPACT = 3        # rebuilds and cuts often (really: thousands)
        self.lane, self.ref = Lane(), OrderedDict()
        self.depth = bytearray([DEEP]) * 12
        self.clock = 100                    # the next release clock
        self.taken: list[tuple[int, int]] = []     # heads taken and not put back

    def _absent(self):
        out = {b for b, _ in self.taken}
        return [b for b in range(12) if b not in self.ref and b not in out]

    @rule(data=st.data(), k=st.integers(1, 5))
    def release(self, data, k):
        block_ids = data.draw(st.permutations(self._absent()))[:k]
        clocks = list(range(self.clock, self.clock + len(block_ids)))
        self.clock += len(block_ids)
        self.lane.extend(block_ids, clocks)
        self.ref.update(zip(block_ids, clocks))

    @rule()
    def popleft(self):
        expected = self.ref.popitem(last=False) if self.ref else None
        assert self.lane.popleft() == expected
        if expected is not None:
            self.taken.append(expected)

    @rule()
    def look_at_the_head(self):
        assert self.lane.head() == next(iter(self.ref.items()), None)

    @precondition(lambda self: self.taken)
    @rule()
    def put_back_the_head_just_taken(self):
        block_id, clock = self.taken[-1]
        if self.ref and next(iter(self.ref.values())) < clock:
            return                          # (not the head just taken any more)
        self.taken.pop()
        self.lane.appendleft(block_id, clock)
        self.ref[block_id] = clock
        self.ref.move_to_end(block_id, last=False)

    @precondition(lambda self: self.taken)
    @rule(i=st.integers(0, 20))
    def requeue_a_woken_block(self, i):
        block_id, clock = self.taken.pop(i % len(self.taken))
        older = []
        while (head := self.lane.head()) is not None and head[1] < clock:
            older.append(self.lane.popleft())
        self.lane.appendleft(block_id, clock)
        for item in reversed(older):
            self.lane.appendleft(*item)
        self.ref = OrderedDict(sorted([*self.ref.items(), (block_id, clock)],
                                      key=lambda item: item[1]))

    @rule(block_id=st.integers(0, 11))
    def pop(self, block_id):
        assert self.lane.pop(block_id) == self.ref.pop(block_id, None)

    @rule(block_id=st.integers(0, 11), deep=st.booleans())
    def set_depth(self, block_id, deep):
        self.depth[block_id] = DEEP if deep else CHILD

    @rule(n=st.integers(0, 6), bound=st.none() | st.integers(95, 160), inclusive=st.booleans())
    def take_run(self, n, bound, inclusive):
        expected = []
        for block_id, clock in self.ref.items():
            if len(expected) == n or self.depth[block_id] != DEEP or (
                    bound is not None and (clock > bound or (clock == bound and not inclusive))):
                break
            expected.append(block_id)
        for block_id in expected:
            del self.ref[block_id]
        assert self.lane.take_run(n, bound, inclusive, self.depth) == expected

    def teardown(self):
        lane_module._MIN_COMPACT = self.threshold

    @invariant()
    def same_blocks_in_the_same_order_and_stale_entries_counted(self):
        lane = self.lane
        assert list(lane.items()) == list(self.ref.items()) and len(lane) == len(self.ref)
        assert all((b in lane) == (b in self.ref) for b in range(12))
        entries = list(zip(lane._ids[lane._start:], lane._clocks[lane._start:]))
        live = sum(1 for b, c in entries if lane.clock_of.get(b) == c)
        assert live == len(self.ref) and len(entries) - live == lane._num_stale
        # the live entries' clocks increase (a dropped entry may sit out of order: a head put
        # back goes before it; take_run bisects the clocks only while none is dropped)
        clocks = [c for b, c in entries if lane.clock_of.get(b) == c]
        assert clocks == sorted(clocks)


LaneAgainstOrderedDict.TestCase.settings = settings(max_examples=300, stateful_step_count=50,
                                                    deadline=None)
test_lane_against_an_ordered_dict = LaneAgainstOrderedDict.TestCase
