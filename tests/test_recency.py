"""The host tier's recency order: last-use stamps, the head found through a candidate list."""

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvsim.cache import recency
from kvsim.cache.recency import RecencyOrder


def ids(*block_ids):
    return np.array(block_ids, dtype=np.int64)


def test_moved_blocks_become_the_most_recent_and_the_head_is_scanned_without_taking():
    order = RecencyOrder(6)
    assert len(order) == 0 and order.first(1, lambda b: b >= 0) is None
    order.extend(ids(3, 1, 4, 5))
    order.move_many_to_end(ids(1, 3))             # touched: 3 the most recent
    assert order.ids().tolist() == [4, 5, 1, 3]
    assert order.first(2, lambda b: b != 5).tolist() == [4, 1]
    assert order.first(5, lambda b: b >= 0) is None
    assert order.first(5, lambda b: b >= 0, partial=True).tolist() == [4, 5, 1, 3]
    assert len(order) == 4 and 5 in order and 0 not in order


def test_a_candidate_moved_or_removed_since_the_list_was_made_is_skipped(monkeypatch):
    monkeypatch.setattr(recency, "MIN_CANDIDATES", 3)
    order = RecencyOrder(10)
    order.extend(ids(0, 1, 2, 3, 4, 5, 6, 7))
    assert order.first(1, lambda b: b >= 0).tolist() == [0]
    assert order._candidates.tolist() == [0, 1, 2, 3]          # the 4 oldest (4 * n)
    order.remove(ids(0))                                        # evicted
    order.move_many_to_end(ids(2))                              # touched: now the newest
    order.extend(ids(9))                                        # newer than every candidate
    assert order.first(2, lambda b: b >= 0).tolist() == [1, 3]  # still from the old list
    assert order.first(3, lambda b: b >= 0).tolist() == [1, 3, 4]   # rebuilt
    assert order.ids().tolist() == [1, 3, 4, 5, 6, 7, 2, 9]


def test_the_oldest_eligible_block_is_read_off_the_candidates_one_at_a_time():
    order = RecencyOrder(8)
    order.extend(ids(5, 3, 7, 1))
    anything, not_5 = (lambda b: b >= 0, lambda b: b >= 0), (lambda b: b != 5, lambda b: b != 5)
    assert order.oldest(*not_5) == 3                 # no list yet: first() builds one
    assert order._candidates.tolist() == [5, 3, 7, 1]
    order.discard(3)                                 # evicted: its candidate is stale
    assert order.oldest(*not_5) == 7 and order._pos == 0     # 5 heads the list, not taken
    order.discard(5)
    assert order.oldest(*anything) == 7 and order._pos == 2  # stale leaders dropped
    assert order.oldest(lambda b: b < 0, lambda b: b < 0) is None
    assert order.ids().tolist() == [7, 1] and len(order) == 2


def test_adding_a_queued_block_or_moving_one_that_is_not_there_is_refused():
    order = RecencyOrder(3)
    order.extend(ids(1))
    with pytest.raises(ValueError):
        order.extend(ids(1))
    with pytest.raises(ValueError):
        order.append(1)
    with pytest.raises(ValueError):
        order.discard(2)
    with pytest.raises(ValueError):
        order.move_many_to_end(ids(0))
    with pytest.raises(ValueError):
        order.remove(ids(2))
    assert order.ids().tolist() == [1] and len(order) == 1


class CpuTierOperations(RuleBasedStateMachine):
    """The operations the CPU tier uses, in any order, give what an ``OrderedDict`` (vLLM's
    list) gives; a subclass makes the order (:meth:`make_order`) and may add operations."""

    NUM_BLOCKS = 12

    def __init__(self):
        super().__init__()
        self.order = self.make_order(self.NUM_BLOCKS)
        self.model: OrderedDict[int, None] = OrderedDict()

    def make_order(self, num_blocks: int):
        raise NotImplementedError

    @precondition(lambda self: len(self.model) < 12)
    @rule(data=st.data())
    def extend(self, data):
        absent = [b for b in range(self.NUM_BLOCKS) if b not in self.model]
        chosen = data.draw(st.lists(st.sampled_from(absent), min_size=1, unique=True))
        self.order.extend(np.array(chosen, dtype=np.int64))
        self.model.update(dict.fromkeys(chosen))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data):
        chosen = self._some_queued(data)
        self.order.remove(np.array(chosen, dtype=np.int64))
        for block_id in chosen:
            del self.model[block_id]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def move_many_to_end(self, data):
        chosen = self._some_queued(data)
        self.order.move_many_to_end(np.array(chosen, dtype=np.int64))
        for block_id in chosen:
            self.model.move_to_end(block_id)

    def _some_queued(self, data) -> list[int]:
        return data.draw(st.lists(st.sampled_from(list(self.model)), min_size=1, unique=True))

    @rule(n=st.integers(0, 14), busy=st.sets(st.integers(0, 11)),
          offered=st.one_of(st.none(), st.sets(st.integers(0, 11))))
    def first_free(self, n, busy, offered):
        ref = np.zeros(self.NUM_BLOCKS, dtype=np.int32)
        ref[list(busy)] = 1
        mark = None
        if offered is not None:
            mark = np.zeros(self.NUM_BLOCKS, dtype=bool)
            mark[list(offered)] = True
        eligible = [b for b in self.model if b not in busy and b not in (offered or ())]
        found = self.order.first_free(n, ref, mark)
        assert (found is None) if n > len(eligible) else found.tolist() == eligible[:n]

    @invariant()
    def same_order(self):
        assert self.order.ids().tolist() == list(self.model)
        assert len(self.order) == len(self.model)


@settings(max_examples=60, stateful_step_count=40)
class AgainstALinkedList(CpuTierOperations):
    """:class:`RecencyOrder`, with candidate lists small enough to be rebuilt often, and its
    other operations."""

    def make_order(self, num_blocks: int):
        self._min, recency.MIN_CANDIDATES = recency.MIN_CANDIDATES, 2
        return RecencyOrder(num_blocks)

    def teardown(self):
        recency.MIN_CANDIDATES = self._min

    @precondition(lambda self: len(self.model) < 12)
    @rule(data=st.data())
    def append(self, data):
        block_id = data.draw(st.sampled_from(
            [b for b in range(self.NUM_BLOCKS) if b not in self.model]))
        self.order.append(block_id)
        self.model[block_id] = None

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def discard(self, data):
        block_id = data.draw(st.sampled_from(list(self.model)))
        self.order.discard(block_id)
        del self.model[block_id]

    @rule(n=st.integers(0, 14), barred=st.sets(st.integers(0, 11)), partial=st.booleans())
    def first(self, n, barred, partial):
        eligible = [b for b in self.model if b not in barred]
        found = self.order.first(n, lambda b: ~np.isin(b, list(barred)), partial=partial)
        if n > len(eligible):
            assert (found.tolist() == eligible) if partial else found is None
        else:
            assert found.tolist() == eligible[:n]

    @rule(barred=st.sets(st.integers(0, 11)))
    def oldest(self, barred):
        eligible = [b for b in self.model if b not in barred]
        found = self.order.oldest(lambda b: ~np.isin(b, list(barred)),
                                  lambda b: b not in barred)
        assert found == (eligible[0] if eligible else None)


TestAgainstALinkedList = AgainstALinkedList.TestCase


ORDERS = [RecencyOrder] + ([recency.CompiledRecency] if recency.RecencyList is not None else [])


@pytest.mark.parametrize("make", ORDERS)
def test_the_cpu_tier_takes_the_oldest_blocks_in_no_use_and_not_offered(make):
    order = make(6)
    order.extend(ids(3, 1, 4, 5))
    order.move_many_to_end(ids(1, 3))                 # a finished request's: 3 the newest
    ref = np.array([0, 0, 0, 0, -1, 0], dtype=np.int32)   # 4 is being stored
    offered = np.zeros(6, dtype=bool)
    offered[1] = True                                 # held, and offered again by the store
    assert order.first_free(2, ref).tolist() == [5, 1]
    assert order.first_free(2, ref, offered).tolist() == [5, 3]
    assert order.first_free(3, ref, offered) is None
    assert order.first_free(0, ref).tolist() == []
    order.remove(ids(5))
    assert order.ids().tolist() == [4, 1, 3] and len(order) == 3
    assert 1 in order and 5 not in order


@pytest.mark.parametrize("make", ORDERS)
def test_the_cpu_tiers_order_refuses_a_block_queued_twice_or_not_there(make):
    order = make(3)
    order.extend(ids(1))
    for change, block_ids in ((order.extend, ids(1)), (order.move_many_to_end, ids(0)),
                              (order.remove, ids(2))):
        with pytest.raises(ValueError):
            change(block_ids)
    assert order.ids().tolist() == [1] and len(order) == 1


@pytest.mark.skipif(recency.RecencyList is None, reason="cache/_recency.c not built")
def test_the_compiled_list_checks_its_arguments():
    order = recency.CompiledRecency(3)
    with pytest.raises(IndexError):
        order.extend(ids(3))
    with pytest.raises(ValueError):
        order.extend(ids(2, 2))                       # (2 was linked once: it stays)
    assert order.ids().tolist() == [2]
    with pytest.raises(TypeError):
        order.first_free(1, np.zeros(3, dtype=np.int64))  # ref_cnt is int32
    with pytest.raises(ValueError):
        order.first_free(1, np.zeros(2, dtype=np.int32))  # too short for the blocks


@settings(max_examples=60, stateful_step_count=40)
class CompiledAgainstALinkedList(CpuTierOperations):
    """The compiled list (:class:`~kvsim.cache.recency.CompiledRecency`)."""

    def make_order(self, num_blocks: int):
        return recency.CompiledRecency(num_blocks)


TestCompiledAgainstALinkedList = pytest.mark.skipif(
    recency.RecencyList is None, reason="cache/_recency.c not built")(
        CompiledAgainstALinkedList.TestCase)
