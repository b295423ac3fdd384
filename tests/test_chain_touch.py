"""The host tier's chain touches, kept pending until an eviction reaches them, evict exactly
what touching at once would (:mod:`kvsim.cache.chain_touch`)."""

import numpy as np
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvsim.cache import recency
from kvsim.cache.chain_touch import _ChainBlocks
from kvsim.cache.cpu_offload import LRUOffloadingManager

CHAINS = {"a": [1, 2, 3, 4, 5, 6], "b": [1, 2, 7, 8], "c": [9, 10, 3, 11, 12]}
HASHES = sorted({h for chain in CHAINS.values() for h in chain} | {20, 21, 22})


class AtOnce(LRUOffloadingManager):
    """The reference: vLLM's touch of the whole chain, at once; a store of one hash takes
    the array path of any other store."""

    _stores_one_by_scalars = False

    def touch_chain(self, key, n, hashes_at):
        self.touch(hashes_at(list(range(n))))


def stored(m, block_hashes):
    result = m.prepare_store(block_hashes)
    m.complete_store(block_hashes)
    return result


def chain_reader(key, looked_up=None):
    def hashes_at(positions):
        if looked_up is not None:
            looked_up.extend(positions)
        return [CHAINS[key][p] for p in positions]
    return hashes_at


def test_a_pending_touch_is_applied_before_an_eviction_could_take_its_blocks():
    m, now = LRUOffloadingManager(5), AtOnce(5)
    looked_up = []
    for manager in (m, now):
        stored(manager, [1, 2, 20, 21, 22])
    m.touch_chain("b", 2, chain_reader("b", looked_up))     # 1 and 2: pending
    now.touch_chain("b", 2, chain_reader("b"))
    assert looked_up == [0, 1] and len(m._chains) == 1
    # by its old stamp 1 would go first: the touch is applied, and 20 goes
    assert stored(m, [9]).evicted == stored(now, [9]).evicted == [20]
    assert len(m._chains) == 0 and looked_up == [0, 1]      # (its blocks were remembered)
    assert stored(m, [10, 3]).evicted == stored(now, [10, 3]).evicted == [21, 22]
    assert stored(m, [11]).evicted == stored(now, [11]).evicted == [2]   # the tail first
    assert m.blocks == now.blocks == [1, 9, 10, 3, 11]


def test_victims_older_than_a_pending_chain_leave_it_pending():
    m, now = LRUOffloadingManager(4), AtOnce(4)
    for manager in (m, now):
        stored(manager, [20, 1, 2, 21])
        manager.touch_chain("b", 2, chain_reader("b"))
    assert stored(m, [22]).evicted == stored(now, [22]).evicted == [20]
    assert len(m._chains) == 1                 # 20 was older than 1 and 2 anyway
    assert m.blocks == now.blocks == [21, 2, 1, 22]


def test_forgetting_a_chain_applies_its_touch():
    m, now = LRUOffloadingManager(4), AtOnce(4)
    for manager in (m, now):
        stored(manager, [1, 2, 20, 21])
        manager.touch_chain("b", 2, chain_reader("b"))
        manager.touch([21])
    m.forget_chain("b")
    assert m._chains.lowest_floor() == float("inf")      # nothing pending
    assert stored(m, [22, 7]).evicted == stored(now, [22, 7]).evicted == [20, 2]


@settings(max_examples=150, stateful_step_count=50, deadline=None)
class AgainstTouchingAtOnce(RuleBasedStateMachine):
    """Any sequence of stores, completions, loads and touches gives the same stores,
    evictions, hits and order as the reference, with candidate lists small enough to be
    rebuilt often."""

    NUM_BLOCKS = 6

    def __init__(self):
        super().__init__()
        self._min, recency.MIN_CANDIDATES = recency.MIN_CANDIDATES, 2
        self.lazy, self.now = LRUOffloadingManager(self.NUM_BLOCKS), AtOnce(self.NUM_BLOCKS)
        self.pinned: list[list[int]] = []

    def teardown(self):
        recency.MIN_CANDIDATES = self._min

    def both(self, name, *args):
        results = [getattr(m, name)(*args) for m in (self.lazy, self.now)]
        if name == "prepare_store" and None not in results:
            results = [(r.stored, r.evicted) for r in results]
        assert results[0] == results[1], name
        return results[0]

    @rule(hashes=st.lists(st.sampled_from(HASHES), min_size=1, max_size=4, unique=True),
          complete=st.booleans())
    def store(self, hashes, complete):
        self.both("prepare_store", hashes)
        if complete:
            self.both("complete_store", hashes)

    @rule(hashes=st.lists(st.sampled_from(HASHES), min_size=1, max_size=3, unique=True),
          success=st.booleans())
    def complete(self, hashes, success):
        self.both("complete_store", hashes, success)

    @rule(key=st.sampled_from(sorted(CHAINS)), data=st.data())
    def touch_chain(self, key, data):
        n = data.draw(st.integers(1, len(CHAINS[key])))
        for m in (self.lazy, self.now):
            m.touch_chain(key, n, chain_reader(key))

    @rule(key=st.sampled_from(sorted(CHAINS)))
    def forget_chain(self, key):
        self.both("forget_chain", key)

    @rule(hashes=st.lists(st.sampled_from(HASHES), min_size=1, max_size=3, unique=True))
    def touch(self, hashes):
        self.both("touch", hashes)

    @rule(key=st.sampled_from(sorted(CHAINS)))
    def pin(self, key):
        n = self.both("lookup", CHAINS[key])
        if n:
            self.both("prepare_load", CHAINS[key][:n])
            self.pinned.append(CHAINS[key][:n])

    @rule()
    def unpin(self):
        if self.pinned:
            self.both("complete_load", self.pinned.pop())

    @rule()
    def read_order(self):               # applies every pending touch of the lazy one
        assert self.lazy.blocks == self.now.blocks

    @invariant()
    def same_hits_and_usage(self):
        for chain in CHAINS.values():
            assert self.lazy.lookup(chain) == self.now.lookup(chain)
        assert self.lazy.num_cached_blocks == self.now.num_cached_blocks
        assert self.lazy.num_dropped_blocks == self.now.num_dropped_blocks


TestAgainstTouchingAtOnce = AgainstTouchingAtOnce.TestCase


def test_raising_a_stamp_inside_the_candidate_list_rebuilds_it():
    order = recency.RecencyOrder(4)
    order.extend(np.arange(4))
    base = order.reserve(2)                          # stamps 4 and 5
    order.move_many_to_end(np.array([0]))            # 0: stamp 6
    assert order.first(2, lambda ids: ids >= 0).tolist() == [1, 2]
    order.raise_to(np.array([1, 0]), np.array([base, base + 1]))   # 1 -> 4; 0 keeps 6
    assert order.first(4, lambda ids: ids >= 0).tolist() == [2, 3, 1, 0]


def test_a_long_chain_touched_as_it_grows_evicts_as_touching_at_once():
    long_chain = list(range(1000, 1150))
    m, now = LRUOffloadingManager(120), AtOnce(120)

    def hashes_at(positions):
        return [long_chain[p] for p in positions]

    other = iter(range(5000, 6000))
    for end in range(10, 151, 10):                 # the chain grows past its first buffer
        for manager in (m, now):
            stored(manager, long_chain[end - 10:end])
        extra = [next(other) for _ in range(7)]
        assert stored(m, extra).evicted == stored(now, extra).evicted
        m.touch_chain("long", end, hashes_at)
        now.touch_chain("long", end, hashes_at)
    assert m.blocks == now.blocks


def test_a_chain_grown_one_block_at_a_time_keeps_every_position():
    blocks = _ChainBlocks()
    for position in range(70):             # past the first 64 slots: the arrays grow
        blocks.append_one(position, 2 * position)
    blocks.append_one(-1, -1)              # a position no host block holds
    assert blocks.size == 71
    assert blocks.ids[:71].tolist() == [*range(70), -1]
    assert blocks.versions[:71].tolist() == [*range(0, 140, 2), -1]


def test_positions_just_stored_are_not_looked_up_again_and_touch_alike():
    """A store hands its host blocks to the chain's touch (offloading's ``stored``): the
    positions it covers are not looked up by hash, and the order stays the lookup's."""
    chain = list(range(1000, 1040))
    told, asked = LRUOffloadingManager(30), LRUOffloadingManager(30)
    looked_up: list[int] = []

    def hashes_at(positions):
        looked_up.extend(positions)
        return [chain[p] for p in positions]

    other = iter(range(5000, 6000))
    for start, end in ((0, 8), (8, 9), (9, 10), (10, 20)):      # a prefill, decode fills
        result = stored(told, chain[start:end])
        stored(asked, chain[start:end])
        del looked_up[:]
        told.touch_chain("c", end, hashes_at, (start, result.block_ids))
        assert looked_up == []
        asked.touch_chain("c", end, hashes_at)
        extra = [next(other) for _ in range(5)]
        assert stored(told, extra).evicted == stored(asked, extra).evicted
    assert told.blocks == asked.blocks
