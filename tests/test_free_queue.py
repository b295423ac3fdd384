"""The LRU pool's free queue keeps a linked list's order with segments and lazy removal."""

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvsim.cache.free_queue import FreeQueue


def ids(*block_ids):
    return np.array(block_ids, dtype=np.int64)


def test_blocks_leave_from_the_head_and_return_at_either_end():
    queue = FreeQueue(6)
    assert queue.popleft(4).tolist() == [0, 1, 2, 3]
    queue.extend(ids(3, 1))            # cached: at the tail, kept longest
    queue.extendleft(ids(2, 0))        # no content: reused first
    assert queue.ids().tolist() == [2, 0, 4, 5, 3, 1]
    assert queue.popleft(3).tolist() == [2, 0, 4]
    assert len(queue) == 3 and 4 not in queue and 5 in queue


def test_a_removed_block_is_skipped_where_it_stood_and_found_where_it_went():
    queue = FreeQueue(5)
    queue.remove(ids(1, 3))            # touched by a prefix hit
    assert len(queue) == 3 and queue.ids().tolist() == [0, 2, 4]
    queue.extend(ids(1))               # freed again: now at the tail
    queue.move_to_end(2)
    assert queue.popleft(4).tolist() == [0, 4, 1, 2]
    assert len(queue) == 0


def test_stale_entries_are_dropped_once_they_outnumber_the_live_ones():
    queue = FreeQueue(3000)
    queue.remove(np.arange(0, 2100, dtype=np.int64))
    assert queue._num_stale == 0 and len(queue._segments) == 1    # rebuilt
    assert queue.ids().tolist() == list(range(2100, 3000))


def test_a_recency_list_starts_empty_and_is_scanned_without_taking():
    queue = FreeQueue(6, filled=False)
    assert len(queue) == 0 and queue.first(1, lambda ids: ids >= 0) is None
    queue.extend(ids(3, 1, 4, 5))
    queue.move_many_to_end(ids(1, 3))             # touched: 3 the most recent
    assert queue.ids().tolist() == [4, 5, 1, 3]
    assert queue.first(2, lambda ids: ids != 5).tolist() == [4, 1]
    assert len(queue) == 4                        # nothing taken


def test_a_scan_drops_the_stale_entries_at_the_head_once():
    queue = FreeQueue(3000)
    queue.remove(np.arange(0, 1500, dtype=np.int64))
    queue.remove(np.arange(1600, 1700, dtype=np.int64))
    odd = queue.first(300, lambda ids: ids % 2 == 1)
    assert odd.tolist() == list(range(1501, 1600, 2)) + list(range(1701, 2201, 2))
    assert queue._num_stale == 100 and queue._segments[0][2] == 1500


def test_a_pop_past_stale_entries_reads_the_first_segment_a_window_at_a_time():
    """Blocks 0..599 of one 3,000-block segment went stale: a one-block pop reads windows of
    256 entries until it finds block 600, leaving the rest of the segment unread."""
    queue = FreeQueue(3000)
    queue.remove(np.arange(0, 600, dtype=np.int64))
    assert queue.popleft(1).tolist() == [600]
    assert queue._segments[0][2] == 601 and queue._num_stale == 0
    queue.remove(ids(602, 604))
    assert queue.popleft(2).tolist() == [601, 603]
    assert queue._segments[0][2] == 604 and queue._num_stale == 1     # 604: read later
    assert queue.popleft(3).tolist() == [605, 606, 607] and queue._num_stale == 0


def test_stale_entries_are_counted_in_the_segment_that_holds_them():
    """A block moved out of the second segment leaves the first one clean: pops read it as it
    is, and the stale entry is passed (and uncounted) only when the head reaches it."""
    queue = FreeQueue(8, filled=False)
    queue.extend(ids(0, 1, 2))
    queue.extend(ids(3, 4, 5))
    queue.move_many_to_end(ids(4))
    assert [segment[3] for segment in queue._segments] == [0, 1, 0]
    assert queue.popleft(3).tolist() == [0, 1, 2] and queue._num_stale == 1
    assert queue.popleft(2).tolist() == [3, 5] and queue._num_stale == 0
    assert queue.popleft(1).tolist() == [4] and not queue._by_s0


def test_taking_more_than_is_queued_or_removing_a_block_not_there_is_refused():
    queue = FreeQueue(2)
    with pytest.raises(ValueError):
        queue.popleft(3)
    queue.popleft(1)
    with pytest.raises(ValueError):
        queue.remove(ids(0))
    assert queue.ids().tolist() == [1]


class AgainstALinkedList(RuleBasedStateMachine):
    """Every operation, in any order, gives what an ``OrderedDict`` used as vLLM's doubly
    linked list gives."""

    NUM_BLOCKS = 12

    def __init__(self):
        super().__init__()
        self.queue = FreeQueue(self.NUM_BLOCKS)
        self.model = OrderedDict.fromkeys(range(self.NUM_BLOCKS))
        self.taken: list[int] = []

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def pop(self, data):
        n = data.draw(st.integers(1, len(self.model)))
        expected = [self.model.popitem(last=False)[0] for _ in range(n)]
        assert self.queue.popleft(n).tolist() == expected
        self.taken += expected

    @precondition(lambda self: self.taken)
    @rule(data=st.data(), at_head=st.booleans())
    def push(self, data, at_head):
        chosen = data.draw(st.lists(st.sampled_from(self.taken), min_size=1, unique=True))
        self.taken = [b for b in self.taken if b not in chosen]
        if at_head:
            self.queue.extendleft(np.array(chosen, dtype=np.int64))
            for block_id in reversed(chosen):
                self.model[block_id] = None
                self.model.move_to_end(block_id, last=False)
        else:
            self.queue.extend(np.array(chosen, dtype=np.int64))
            self.model.update(dict.fromkeys(chosen))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data):
        chosen = self._some_queued(data)
        self.queue.remove(np.array(chosen, dtype=np.int64))
        for block_id in chosen:
            del self.model[block_id]
        self.taken += chosen

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def move_to_end(self, data):
        block_id = data.draw(st.sampled_from(list(self.model)))
        self.queue.move_to_end(block_id)
        self.model.move_to_end(block_id)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def move_many_to_end(self, data):
        chosen = self._some_queued(data)
        self.queue.move_many_to_end(np.array(chosen, dtype=np.int64))
        for block_id in chosen:
            self.model.move_to_end(block_id)

    def _some_queued(self, data) -> list[int]:
        return data.draw(st.lists(st.sampled_from(list(self.model)), min_size=1, unique=True))

    @rule(n=st.integers(0, 14), barred=st.sets(st.integers(0, 11)))
    def first(self, n, barred):
        eligible = [b for b in self.model if b not in barred]
        found = self.queue.first(n, lambda ids: ~np.isin(ids, list(barred)))
        assert (found is None) if n > len(eligible) else found.tolist() == eligible[:n]

    @invariant()
    def same_order(self):
        assert self.queue.ids().tolist() == list(self.model)
        assert len(self.queue) == len(self.model)

    @invariant()
    def stale_entries_counted_in_their_segments(self):
        queue, actual = self.queue, 0
        for ids, s0, start, stale in queue._segments:
            entries = np.arange(s0 + start, s0 + len(ids))
            assert stale == np.count_nonzero(queue._serial[ids[start:]] != entries)
            actual += stale
        assert actual == queue._num_stale
        assert sorted(queue._by_s0) == sorted(s0 for _, s0, _, _ in queue._segments)


TestAgainstALinkedList = AgainstALinkedList.TestCase


class AgainstALinkedListPastAWindow(AgainstALinkedList):
    """The same with more blocks than a pop reads past stale entries at a time."""

    NUM_BLOCKS = 700


TestAgainstALinkedListPastAWindow = AgainstALinkedListPastAWindow.TestCase
