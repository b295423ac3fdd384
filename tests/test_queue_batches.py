"""The batched queue policies against the one-block-at-a-time ones they replaced.

``tests/queue_reference.py`` keeps ARC and S3-FIFO as they were (a Python call per block).
The batched hooks (``fill_many``, ``hit_many``, ``release_many``, ``acquire_many``,
``victims(n)``), S3-FIFO's runs and :class:`~kvsim.cache.ghost.Ghost` must give the same
victims, queue orders, ghosts and counts: stories with exact block ids, then random
operations through both pools side by side.
"""

import random
from collections import OrderedDict

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvsim.cache.bulk import gather, set_all
from kvsim.cache.eviction import make_policy, make_pool
from kvsim.cache.ghost import Ghost
from kvsim.cache.intmap import CompiledGhost
from kvsim.cache.policy_pool import UNREACHABLE

from queue_reference import RefARCPolicy, RefQueuePool, RefS3FIFOPolicy
from pool_stories import put, use

REFERENCE = {"arc": RefARCPolicy, "s3fifo": RefS3FIFOPolicy}


def pools(name, n):
    """A batched pool and a reference pool of ``n`` blocks evicting by ``name``."""
    return make_pool(n, policy=make_policy(name)), RefQueuePool(n, policy=REFERENCE[name]())


def state(pool, anonymous=frozenset(), unregistered=frozenset()):
    """Everything observable of a queue pool and its policy, comparable across versions.
    ``anonymous``: hashes of private blocks the pool was never told (the reference pool
    registered them), ``unregistered``: blocks holding them, held: both read "P", as
    ``UNREACHABLE`` does."""
    def named(h):
        return "P" if h is UNREACHABLE or h in anonymous else h
    p = pool.policy
    hashes = ["P" if b in unregistered else named(h) for b, h in enumerate(pool.block_hashes)]
    index = {h: b for h, b in dict(pool.index._map).items() if h not in anonymous}
    common = (pool.free_queue(), list(pool.ref_counts), hashes, index,
              pool.num_cached_free_blocks, pool.num_evictions)
    if p.name == "arc":
        return common + (list(p.t1), list(p.t2), [*map(named, p.b1)], [*map(named, p.b2)],
                         len(p.b1), len(p.b2), [bool(x) for x in p.in_t2], p.num_t1,
                         p.num_t2, p.target_t1)
    return common + (list(p.small), list(p.main), [*map(named, p.ghost)], len(p.ghost),
                     list(p.freq), [bool(x) for x in p.in_main], p.num_main_free)


def take(pool, hashes):
    """A request gets ``len(hashes)`` new blocks and fills them; returns their ids (held)."""
    block_ids = pool.get_new_blocks(len(hashes))
    pool.cache_blocks(block_ids, hashes)
    return block_ids


# --- victims(n) is n victims of the old policy ---------------------------------------------

def test_arc_victims_run_from_t1_to_t2_as_one_at_a_time():
    new, ref = pools("arc", 8)
    for pool in (new, ref):
        for h in range(6):
            put(pool, h)              # T1: 0..5
        use(pool, 2), use(pool, 4)    # T2: 2, 4
        pool.policy.target_t1 = 2     # T1 over target by two: then T2
    assert new.policy.victims(3) == [ref.policy.victim() for _ in range(3)] == [0, 1, 2]
    assert list(new.policy.b1) == list(ref.policy.b1) == [0, 1]
    assert list(new.policy.b2) == list(ref.policy.b2) == [2]
    assert (new.policy.num_t1, new.policy.num_t2) == (ref.policy.num_t1, ref.policy.num_t2)


def test_arc_victims_count_the_fills_reported_late_as_if_each_came_at_once():
    """A decode run takes its blocks in one call and registers the blocks it filled meanwhile
    afterwards: a fill between two victims raises ``num_t1`` over the target, so the second
    victim comes from T1, as when the fill is reported before it."""
    late, now = make_pool(6, policy=make_policy("arc")), make_pool(6, policy=make_policy("arc"))
    for pool in (late, now):
        for h in (10, 11, 12, 13):
            put(pool, h)              # T1: blocks 0..3
        use(pool, 10), use(pool, 11)  # T2: blocks 0, 1; T1 free: 2, 3; num_t1 = 2
        pool.policy.target_t1 = 2
        assert pool.get_new_blocks(2) == [4, 5]     # the unhashed ones, held
    assert [now.get_new_blocks(1)[0], now.cache_block(4, 20), now.get_new_blocks(1)[0],
            now.get_new_blocks(1)[0]] == [0, None, 2, 1]
    assert late.get_new_blocks(3, fills_before=[0, 1, 1]) == [0, 2, 1]
    late.cache_blocks([4], [20])
    for pool in (late, now):
        arc = pool.policy
        assert (arc.num_t1, arc.num_t2, list(arc.b1), list(arc.b2)) == (2, 0, [12], [10, 11])
        assert list(arc.t1) == [3] and not arc.t2 and pool.index.get(20) == 4
    assert make_pool(6, policy=make_policy("arc")).get_new_blocks(3, [0, 0, 0]) == [0, 1, 2]


def test_arc_takes_late_fills_only_with_hashes_no_ghost_list_holds():
    pool = make_pool(4, policy=make_policy("arc"))
    for h in (1, 2, 3, 4, 5):         # 1 is evicted into B1
        put(pool, h)
    assert pool.opens_in_bulk == "new_fills"
    assert pool.takes_new_fills([7, 8], 2) and not pool.takes_new_fills([7, 1], 2)
    assert not pool.takes_new_fills([5], 1)        # a block holds it


def test_s3fifo_takes_late_fills_only_while_s_stays_under_its_share_and_m_gives_every_victim():
    pool = make_pool(40, policy=make_policy("s3fifo"))      # S's share: 4 blocks
    s3 = pool.policy
    take(pool, [1, 2])                                      # S: two held blocks; M empty
    assert pool.opens_in_bulk == "new_fills" and pool.orders_fills
    assert not pool.takes_new_fills([7], 1)                 # no victim can come from M
    s3._main_len, s3.num_main_free = 5, 2                   # as if M held 5 blocks, 2 free
    assert pool.takes_new_fills([7], 2)                     # S: 2 + 1 < 4; M gives both
    assert not pool.takes_new_fills([7, 8], 2)              # S would reach its share
    assert not pool.takes_new_fills([7], 3)                 # M has two free blocks only
    assert not pool.takes_new_fills([1], 1)                 # a block holds it
    s3.ghost.add([9], s3.capacity)
    assert not pool.takes_new_fills([9], 1)                 # it would go to M


def test_s3fifo_takes_late_fills_while_s_gives_every_victim_at_its_share_or_over():
    """S (its share set to 2) holds 0 (held), 1, 2, 3 (free); M is empty. The next two victims
    come from S, which holds its share or more before each (0 moves to M and 1 goes, leaving
    2 and 3; then 2 goes): fills joining S's tail meanwhile change neither. Before a third, S
    would hold one block only."""
    late, now = (make_pool(8, policy=make_policy("s3fifo")) for _ in range(2))
    for pool in (late, now):
        take(pool, [100])                           # block 0, held
        for h in (1, 2, 3):
            put(pool, h)                            # blocks 1..3, free
        pool.policy.small_capacity = 2
        assert pool.get_new_blocks(4) == [4, 5, 6, 7]       # the unhashed ones, held
    assert late.policy._small_gives(2) and late.takes_new_fills([7, 8], 2, num_private=5)
    assert not late.policy._small_gives(3) and not late.takes_new_fills([7], 3)
    assert late.get_new_blocks(2, fills_before=[1, 2]) == [1, 2]
    late.cache_blocks([4, 5], [200, 201])
    now.cache_blocks([4], [200])
    assert now.get_new_blocks(1) == [1]
    now.cache_blocks([5], [201])
    assert now.get_new_blocks(1) == [2]
    assert state(late) == state(now) and late.policy.small == [3, 4, 5]


def test_s3fifo_orders_the_late_fills_as_they_came():
    pool = make_pool(40, policy=make_policy("s3fifo"))
    s3 = pool.policy
    held = take(pool, [100, 101])                 # S: 0, 1 (held)
    a, b = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_blocks(b, [201]), pool.cache_blocks(a, [200])     # reported b first
    assert s3.small == [*held, *b, *a]
    s3.order_fills([*a, *b])                      # filled a, then b
    assert s3.small == [*held, *a, *b]
    with pytest.raises(ValueError):
        s3.order_fills([*held])                   # not the last to join S


def test_s3fifo_victims_stop_a_stretch_at_a_hit_block_as_one_at_a_time():
    new, ref = pools("s3fifo", 20)    # S's share: 2 blocks
    for pool in (new, ref):
        for h in range(20):
            put(pool, h)
        use(pool, 2)                  # block 2: frequency 1, goes to M when S reaches it
    assert new.policy.victims(5) == [ref.policy.victim() for _ in range(5)] == [0, 1, 3, 4, 5]
    assert new.policy.main == list(ref.policy.main) == [2]
    assert list(new.policy.ghost) == list(ref.policy.ghost) == [0, 1, 3, 4, 5]


def test_s3fifo_victims_leave_s_at_its_share_then_a_main_without_free_blocks_hands_back():
    new, ref = pools("s3fifo", 20)   # S's share: 2 blocks
    for pool in (new, ref):
        take(pool, [100, 101, 102])  # blocks 0..2, held: promoted to M when S reaches them
        for h in range(17):
            put(pool, h)             # blocks 3..19, free
    # 3..18 in one stretch (S keeps its share until 18 goes), then M, all held, hands over
    got = new.policy.victims(17)
    assert got == [ref.policy.victim() for _ in range(17)] == list(range(3, 20))
    assert new.policy.main == [0, 1, 2] and new.policy.small == []
    assert state(new) == state(ref)


def test_s3fifo_victims_from_s_while_m_has_no_free_block_stop_when_a_promotion_gives_it_one():
    new, ref = pools("s3fifo", 12)   # S's share: 1 block
    for pool in (new, ref):
        take(pool, [100, 101, 102])  # blocks 0..2, held
        for h in range(9):
            put(pool, h)             # blocks 3..11, free
        assert put(pool, 50) == 3    # S promotes 0..2 (held) to M, evicts 3, which takes 50
        use(pool, 1)                 # block 4: frequency 1
        pool.policy.small_capacity = 100     # S under its share, M without a free block
    # 4 moves to M (free), 5 goes; then M has a free block: the clock passes 0..2, takes
    # 4's hit and comes back to take 4 (not 6, the next one S would give)
    got = new.policy.victims(3)
    assert got == [ref.policy.victim() for _ in range(3)] == [5, 4, 6]
    assert state(new) == state(ref)


# --- S3-FIFO's runs: exact orders -------------------------------------------------------------

def test_s3fifo_main_runs_move_whole_split_and_cut_as_the_clock_does():
    new, ref = pools("s3fifo", 12)
    for pool in (new, ref):
        held = take(pool, list(range(12)))           # blocks 0..11, all held, in S
        pool.free_blocks([11, 10])
        assert pool.get_new_blocks(1) == [10]        # S promotes 0..9 (held), evicts 10
        assert list(pool.policy.main) == list(range(10))
        pool.free_blocks([3]), pool.free_blocks([8])
        pool.policy.small_capacity = 100             # from now on M first
    s3 = new.policy
    assert len(s3._runs) == 1
    # victim 3: the three blocks passed before it are fewer than the six after: they move
    assert new.get_new_blocks(1) == ref.get_new_blocks(1) == [3]
    assert s3.main == list(ref.policy.main) == [4, 5, 6, 7, 8, 9, 0, 1, 2]
    assert [run.ids[run.off:] for run in s3._runs] == [[4, 5, 6, 7, 8, 9], [0, 1, 2]]
    # victim 8: four passed before it, one after: the run keeps 4..7 and goes to the tail
    assert new.get_new_blocks(1) == ref.get_new_blocks(1) == [8]
    assert s3.main == list(ref.policy.main) == [9, 0, 1, 2, 4, 5, 6, 7]
    assert [run.ids[run.off:] for run in s3._runs] == [[9], [0, 1, 2], [4, 5, 6, 7]]
    assert all(s3._run_of[b] is run for run in s3._runs for b in run.ids[run.off:])
    # block 0 hit and freed (frequency 1), 5 freed: the all-held run [9] is passed whole,
    # 0 loses its hit, 5 goes
    for pool in (new, ref):
        pool.touch([0]), pool.free_blocks([0]), pool.free_blocks([0]), pool.free_blocks([5])
    assert new.get_new_blocks(1) == ref.get_new_blocks(1) == [5]
    assert s3.main == list(ref.policy.main) == [6, 7, 9, 0, 1, 2, 4]
    assert s3.freq[0] == 0 and s3.num_main_free == 1
    assert new.get_new_blocks(1) == ref.get_new_blocks(1) == [0]     # next lap
    assert state(new) == state(ref)


def test_s3fifo_a_touch_with_a_block_twice_is_two_hits():
    new, ref = pools("s3fifo", 4)
    for pool in (new, ref):
        put(pool, 7)
        pool.touch([0, 0]), pool.free_blocks([0, 0])
    assert new.policy.freq[0] == ref.policy.freq[0] == 2
    assert state(new) == state(ref)


def test_arc_a_touch_with_a_block_twice_promotes_once():
    new, ref = pools("arc", 4)
    for pool in (new, ref):
        put(pool, 7)
        pool.touch([0, 0]), pool.free_blocks([0, 0])
    assert (new.policy.num_t1, new.policy.num_t2) == (0, 1)
    assert state(new) == state(ref)


def test_a_batch_with_a_hash_twice_indexes_both_blocks_oldest_first():
    for name in ("arc", "s3fifo"):
        new, ref = pools(name, 6)
        for pool in (new, ref):
            take(pool, [5, 9, 5])
        assert new.index._map[5] == {0: None, 2: None} and new.index.get(5) == 0
        assert state(new) == state(ref)


# --- the ghost: an OrderedDict FIFO -----------------------------------------------------------

def ordered_add(ghost, hashes, capacity):
    for h in hashes:
        ghost[h] = None
        if len(ghost) > capacity:
            ghost.popitem(last=False)


GHOST_KINDS = ["python"] + (["compiled"] if CompiledGhost is not None else [])


def new_ghost(kind, slack=1024):
    """An empty ghost list of ``kind`` that rebuilds its FIFO past ``slack`` stale entries (the
    Python one reads its class's ``slack``: set by the caller)."""
    return Ghost() if kind == "python" else CompiledGhost(slack=slack, anonymous=UNREACHABLE)


@pytest.mark.parametrize("kind", GHOST_KINDS)
def test_ghost_keeps_a_present_hash_in_place_and_sends_a_returning_one_to_the_end(kind):
    g = new_ghost(kind)
    g.add([1, 2, 3], 3)
    g.add([2, 4], 3)                  # 2 stays second; 4 drops 1
    assert list(g) == [2, 3, 4] and len(g) == 3 and 1 not in g
    assert g.first_present([7, 1, 4, 2], 0) == 2 and g.first_present([7, 1, 4, 2], 3) == 3
    assert g.first_present([7, 1], 0) == 2 and g.isdisjoint([7, 1]) and not g.isdisjoint([1, 3])
    g.discard(3)
    g.add([3], 3)
    assert list(g) == [2, 4, 3]
    # over a smaller capacity each addition drops one: 2, then 4, then (5 being present) 3
    g.add([5, 6, 5], 2)
    assert list(g) == [5, 6]
    with pytest.raises(KeyError):
        g.discard(3)
    assert g.take_run([9, 6, 5, 6], 1, 4) == 3 and list(g) == []    # 6 and 5; then 6 is gone


@pytest.mark.parametrize("kind", GHOST_KINDS)
def test_ghost_an_evicted_unreachable_block_takes_a_place_until_it_is_the_oldest(kind):
    g = new_ghost(kind)
    g.add([1, UNREACHABLE, 2, UNREACHABLE], 3)      # 1 goes: three are present
    assert list(g) == [UNREACHABLE, 2, UNREACHABLE] and len(g) == 3
    g.discard(2)
    g.add([3, 4], 3)                                # the older anonymous entry goes
    assert list(g) == [UNREACHABLE, 3, 4] and g.first_present([4, 3], 0) == 0


@pytest.mark.parametrize("kind", GHOST_KINDS)
def test_ghost_matches_an_ordered_dict_under_random_use(kind, monkeypatch):
    """Anonymous entries (``UNREACHABLE`` added) are unique keys of the dict."""
    for seed in range(300):
        rng = random.Random(seed)
        slack = rng.choice([0, 2, 1024])
        monkeypatch.setattr(Ghost, "slack", slack)
        g, ref, cap = new_ghost(kind, slack), OrderedDict(), rng.randint(0, 20)
        anonymous = rng.choice([0, 0.2, 0.9])
        for _ in range(150):
            present = [h for h in ref if isinstance(h, int)]
            if rng.random() < 0.7 or not present:
                hashes = [rng.randrange(-3, 40) for _ in range(rng.randint(0, 10))]
                start = rng.randint(0, len(hashes))
                found = next((j for j in range(start, len(hashes)) if hashes[j] in ref),
                             len(hashes))
                assert g.first_present(hashes, start) == found, seed
                c = cap if rng.random() < 0.9 else rng.randint(-3, 30)
                hashes = [UNREACHABLE if rng.random() < anonymous else h for h in hashes]
                g.add(hashes, c)
                ordered_add(ref, [object() if h is UNREACHABLE else h for h in hashes], c)
            elif rng.random() < 0.5:
                h = rng.choice(present)
                g.discard(h)
                del ref[h]
            else:                       # a run of present hashes from some point on
                hashes = rng.sample(present, rng.randint(1, len(present))) + [rng.randrange(40)]
                start, stop = rng.randint(0, 2), rng.randint(0, len(hashes) + 1)
                end = start
                while end < min(stop, len(hashes)) and hashes[end] in ref:
                    del ref[hashes[end]]
                    end += 1
                assert g.take_run(hashes, start, stop) == max(start, end), seed
            named = [h if isinstance(h, int) else UNREACHABLE for h in ref]
            assert list(g) == named and len(g) == len(ref), seed


def test_gather_and_set_all():
    values = [10, 11, 12, 13]
    assert gather(values, []) == () and gather(values, [2]) == (12,)
    assert gather(values, [3, 0, 3]) == (13, 10, 13)
    set_all(values, [1, 3], 0)
    assert values == [10, 0, 12, 0]


@pytest.mark.parametrize("compiled", [True, False])
def test_marked_gives_the_ids_whose_mark_is_set_in_order(compiled, monkeypatch):
    """(Python: as where ``_bulk`` was not built, or built before it had the loop.)"""
    from kvsim.cache import bulk
    if not compiled:
        monkeypatch.setattr(bulk, "_marked", None)
    marks = bytearray([0, 1, 0, 2])
    assert bulk.marked(marks, [3, 2, 1, 0, 3]) == [3, 1, 3] and bulk.marked(marks, []) == []
    with pytest.raises(IndexError):
        bulk.marked(marks, [4])


@pytest.mark.parametrize("compiled", [True, False])
def test_without_marked_keeps_the_pairs_whose_value_is_not_the_marker(compiled, monkeypatch):
    from kvsim.cache import bulk
    if not compiled:
        monkeypatch.setattr(bulk, "_without_marked", None)
    found = (7, UNREACHABLE, 9, UNREACHABLE)
    assert bulk.without_marked(UNREACHABLE, [3, 1, 4, 2], found) == ([3, 4], [7, 9])
    assert bulk.without_marked(UNREACHABLE, [3, 4], (7, 9)) is None
    assert bulk.without_marked(UNREACHABLE, [5], (UNREACHABLE,)) == ([], [])


# --- random operations through both pools -----------------------------------------------------

class BatchedVsReference(RuleBasedStateMachine):
    """The same requests through a batched pool and a reference pool: same block ids back,
    same state after every step (several blocks per call, repeated hashes, shared blocks).
    A private request's blocks: the batched pool hears them filled without their hashes,
    the reference registers unique ones; when it ends they become unreachable content
    (finished) or are registered (preempted)."""

    def __init__(self):
        super().__init__()
        self.new = self.ref = None
        self.held: list[list[int]] = []
        self.private: list[tuple[list[int], list[int]]] = []
        self.anonymous: set[int] = set()
        self.unregistered: set[int] = set()
        self.next_private = 1000

    @precondition(lambda self: self.new is None)
    @rule(name=st.sampled_from(["arc", "s3fifo"]), n=st.integers(1, 40),
          small=st.none() | st.integers(0, 45), log=st.booleans())
    def start(self, name, n, small, log):
        self.new, self.ref = pools(name, n)
        if small is not None and name == "s3fifo":
            self.new.policy.small_capacity = self.ref.policy.small_capacity = small
        if log:
            self.new.evicted, self.ref.evicted = [], []

    @precondition(lambda self: self.new is not None and self.new.num_free_blocks > 0)
    @rule(data=st.data())
    def allocate(self, data):
        k = data.draw(st.integers(1, self.new.num_free_blocks))
        block_ids = self.new.get_new_blocks(k)
        assert block_ids == self.ref.get_new_blocks(k)
        hashes = data.draw(st.lists(st.integers(0, 60), max_size=k))
        self.new.cache_blocks(block_ids[:len(hashes)], hashes)
        self.ref.cache_blocks(block_ids[:len(hashes)], hashes)
        self.held.append(block_ids)

    @precondition(lambda self: self.new is not None and self.new.num_free_blocks > 0)
    @rule(data=st.data())
    def allocate_private(self, data):
        k = data.draw(st.integers(1, self.new.num_free_blocks))
        block_ids = self.new.get_new_blocks(k)
        assert block_ids == self.ref.get_new_blocks(k)
        hashes = list(range(self.next_private, self.next_private + k))
        self.next_private += k
        self.new.fill_private(block_ids)
        self.ref.cache_blocks(block_ids, hashes)
        self.private.append((block_ids, hashes))
        self.anonymous.update(hashes)
        self.unregistered.update(block_ids)

    @precondition(lambda self: self.new is not None and self.private)
    @rule(data=st.data(), finished=st.booleans())
    def release_private(self, data, finished):
        block_ids, hashes = self.private.pop(data.draw(st.integers(0, len(self.private) - 1)))
        if finished:
            self.new.cache_unreachable(block_ids)
        else:
            self.new.register_filled(block_ids, hashes)
            self.anonymous.difference_update(hashes)
        self.unregistered.difference_update(block_ids)
        self.new.free_blocks(block_ids[::-1])
        self.ref.free_blocks(block_ids[::-1])

    @precondition(lambda self: self.new is not None)
    @rule(hashes=st.lists(st.integers(0, 60), min_size=1, max_size=8), twice=st.booleans())
    def hit(self, hashes, twice):
        block_ids = [b for b in map(self.new.index.get, hashes) if b is not None]
        assert block_ids == [b for b in map(self.ref.index.get, hashes) if b is not None]
        if block_ids:
            block_ids += block_ids[:1] if twice else []
            self.new.touch(block_ids)
            self.ref.touch(block_ids)
            self.held.append(block_ids)

    @precondition(lambda self: self.new is not None and self.held)
    @rule(data=st.data(), tail_first=st.booleans())
    def release(self, data, tail_first):
        block_ids = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        order = block_ids[::-1] if tail_first else block_ids
        self.new.free_blocks(order)
        self.ref.free_blocks(order)

    @precondition(lambda self: self.new is not None and self.new.num_free_blocks > 0)
    @rule(block_hash=st.integers(0, 60))
    def put_cached(self, block_hash):
        assert self.new.put_cached(block_hash) == self.ref.put_cached(block_hash)

    @precondition(lambda self: self.new is not None and not self.held and not self.private)
    @rule()
    def reset(self):
        assert self.new.reset_prefix_cache() == self.ref.reset_prefix_cache()

    @invariant()
    def same_state(self):
        if self.new is not None:
            assert (state(self.new, self.anonymous, self.unregistered)
                    == state(self.ref, self.anonymous, self.unregistered))
            if self.new.evicted is not None:
                assert self.new.evicted == [e for e in self.ref.evicted
                                            if e[1] not in self.anonymous]
            if self.new.policy.name == "s3fifo":
                s3, refs = self.new.policy, self.new.ref_counts
                assert s3._main_len == len(s3.main)
                for run in s3._runs:
                    live = run.ids[run.off:]
                    assert live and run.free == sum(refs[b] == 0 for b in live)
                    assert all(s3._run_of[b] is run for b in live)


TestBatchedVsReference = BatchedVsReference.TestCase
TestBatchedVsReference.settings = settings(max_examples=150, stateful_step_count=50,
                                           deadline=None)
