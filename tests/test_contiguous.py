"""Contiguous layouts as small stories: the first-fit slot allocator, reservations, compaction."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.cache.contiguous import ContiguousKVManager, reservation_size
from kvsim.cache.request_state import RequestState
from kvsim.cache.slot_allocator import SlotAllocator
from kvsim.cache.step_plan import COMPACT
from kvsim.workloads import Request


def seq(rid, prompt, output):
    return RequestState(Request(rid, 0.0, prompt, output), 16)


# --- the allocator -----------------------------------------------------------------------

def test_first_fit_places_in_the_lowest_gap_that_holds_the_region():
    a = SlotAllocator(100)
    assert [a.allocate(n) for n in (10, 20, 30)] == [0, 10, 30]
    a.free(0, 10)
    a.free(30, 30)
    assert a.gaps() == [(0, 10), (30, 70)]
    assert a.allocate(15) == 30          # the gap at 0 is too short
    assert a.allocate(10) == 0           # exact fit removes the gap
    assert a.gaps() == [(45, 55)]
    assert a.allocate(56) is None and a.gaps() == [(45, 55)]


def test_free_coalesces_with_both_neighbours():
    a = SlotAllocator(60)
    offsets = [a.allocate(20) for _ in range(3)]
    assert offsets == [0, 20, 40] and a.gaps() == []
    a.free(0, 20)
    a.free(40, 20)
    assert a.gaps() == [(0, 20), (40, 20)]
    a.free(20, 20)
    assert a.gaps() == [(0, 60)] and a.num_free == 60


def test_double_free_and_out_of_range_are_refused():
    a = SlotAllocator(50)
    a.allocate(30)
    with pytest.raises(ValueError):
        a.free(25, 10)                   # [30, 35) is free already
    with pytest.raises(ValueError):
        a.free(45, 10)


def test_unusable_counts_gaps_too_short_for_a_request():
    a = SlotAllocator(100)
    for n in (10, 5, 10, 5, 70):
        a.allocate(n)
    a.free(10, 5)
    a.free(25, 5)
    assert a.gaps() == [(10, 5), (25, 5)]
    assert a.unusable(6) == 10 and a.unusable(5) == 0


def test_compaction_slides_regions_down_in_order():
    a = SlotAllocator(100)
    for n in (10, 20, 30, 40):
        a.allocate(n)
    a.free(0, 10)
    a.free(30, 30)
    assert a.compact([(60, 40), (10, 20)]) == [20, 0]
    assert a.gaps() == [(60, 40)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40)), max_size=60))
def test_allocator_never_overlaps_and_conserves_slots(ops):
    """Random allocations and frees: live regions never overlap, live + free = capacity, no
    two gaps touch (coalescing), and a failed allocation means no gap holds the size."""
    a, live = SlotAllocator(200), []
    for is_alloc, n in ops:
        if is_alloc or not live:
            offset = a.allocate(n)
            if offset is None:
                assert a.largest_gap < n
            else:
                live.append((offset, n))
        else:
            a.free(*live.pop(n % len(live)))
        spans = sorted(live + a.gaps())
        assert all(s + n <= t for (s, n), (t, _) in zip(spans, spans[1:]))
        assert sum(n for _, n in live) + a.num_free == 200
        gaps = a.gaps()
        assert all(s + n < t for (s, n), (t, _) in zip(gaps, gaps[1:]))


# --- reservations --------------------------------------------------------------------------

def test_reservation_sizes():
    assert [reservation_size(r, 499, 2048) for r in ("max", "pow2", "oracle")] == [2048, 512, 499]
    assert reservation_size("pow2", 512, 2048) == 512
    assert reservation_size("pow2", 1500, 1600) == 1600      # capped by max_model_len


def test_max_reservation_admits_pool_slots_over_max_len_requests():
    """The vLLM paper's Orca (Max): 982 blocks of 16 = 15,712 slots hold 7 regions of 2,048."""
    m = ContiguousKVManager(982, 16, 2048, reserve="max")
    results = [m.allocate(i, seq(i, 100, 50), 100) for i in range(8)]
    assert results[:7] == [[]] * 7 and results[7] is None
    assert [m.region(i).offset for i in range(7)] == [i * 2048 for i in range(7)]
    assert m.allocator.gaps() == [(7 * 2048, 15712 - 7 * 2048)]
    # tokens 700, reservation 7 * 50, over-reservation the rest, external the last gap
    assert m.fragmentation(next_request=seq(7, 100, 50)) == (
        700, 350, 7 * (2048 - 150), 15712 - 7 * 2048)


def test_decode_growth_fills_the_reservation_and_free_returns_it():
    m = ContiguousKVManager(10, 16, 160, reserve="oracle")
    s = seq(1, 30, 10)
    assert m.allocate(1, s, 30) == []
    assert (m.region(1).offset, m.region(1).size) == (0, 40)
    for computed in range(30, 39):
        assert m.allocate(1, s, 1, num_computed_tokens=computed) == []
    assert m.num_slots(1) == 39
    assert m.fragmentation() == (39, 1, 0, 0)
    m.free(1)
    assert m.allocator.gaps() == [(0, 160)] and m.fragmentation() == (0, 0, 0, 0)


def test_no_prefix_sharing_in_contiguous_regions():
    m = ContiguousKVManager(10, 16, 160)
    m.allocate(1, seq(1, 64, 4), 64)
    assert m.lookup(seq(2, 64, 4)).num_tokens == 0


def test_compaction_moves_live_regions_as_exact_chunk_pairs():
    """Pool 160 slots, oracle reservations of 40: A @0, B @40, C @80, D @120. A and C finish,
    leaving two 40-slot gaps; E needs 80: no gap holds it, the 80 unusable free slots are
    0.5 of the pool > 0.2, so B and D slide down (30 tokens each: two 16-slot chunks)."""
    m = ContiguousKVManager(10, 16, 160, reserve="oracle", compaction_threshold=0.2)
    for rid in "ABC":
        m.allocate(rid, seq(0, 30, 10), 30)
    m.allocate("D", seq(0, 30, 10), 30)          # D @120
    assert [m.region(r).offset for r in "ABCD"] == [0, 40, 80, 120]
    m.free("A")
    m.free("C")
    assert m.allocator.gaps() == [(0, 40), (80, 40)]
    assert m.allocate("E", seq(0, 60, 20), 60) == []        # 80 slots: compaction makes room
    assert [m.region(r).offset for r in "BDE"] == [0, 40, 80]
    (move,) = m.take_transfers()
    assert move.kind == COMPACT
    assert move.pairs == [(40, 0), (56, 16), (120, 40), (136, 56)]   # 30 tokens = 2 chunks each
    assert m.take_transfers() == []
    c = m.compaction
    assert (c.num_compactions, c.moved_slots, c.moved_blocks) == (1, 60, 4)
    assert c.external_before_sum == pytest.approx(80 / 160) and c.external_after_sum == 0


def test_no_compaction_below_threshold_or_without_room():
    m = ContiguousKVManager(10, 16, 160, reserve="oracle", compaction_threshold=0.6)
    for rid in "ABCD":
        m.allocate(rid, seq(0, 30, 10), 30)
    m.free("A")
    m.free("C")
    assert m.allocate("E", seq(0, 60, 20), 60) is None     # 80 free = 0.5 of the pool
    assert m.compaction.num_compactions == 0 and m.take_transfers() == []
