"""The buddy allocator of the vLLM paper's Orca baselines, and the paper's Pow2 reservation, as
small stories with exact offsets; then a run and the command line."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.cache.buddy_allocator import BuddyAllocator, block_size_for
from kvsim.cache.contiguous import ContiguousKVManager, reservation_size
from kvsim.cache.request_state import RequestState
from kvsim.errors import ConfigError
from kvsim.sim.serving import results
from kvsim.sim.config import RunConfig
from kvsim.sim.serving.runner import simulate
from kvsim.workloads import Request
from kvsim.workloads.generators.build import GenConfig, generate, preset_named

from clirun import kvsim

PAPER_POOL = 982 * 16        # the paper's OPT-13B / A100-40GB: 15,712 slots


def seq(rid, prompt, output):
    return RequestState(Request(rid, 0.0, prompt, output), 16)


# --- the allocator -----------------------------------------------------------------------

def test_a_pool_that_is_not_a_power_of_two_is_cut_into_aligned_blocks():
    a = BuddyAllocator(PAPER_POOL)
    assert a.gaps() == [(0, 8192), (8192, 4096), (12288, 2048), (14336, 1024), (15360, 256),
                        (15616, 64), (15680, 32)]
    assert a.largest_gap == 8192 and a.num_free == PAPER_POOL


def test_a_region_takes_the_smallest_block_that_holds_its_power_of_two():
    """300 slots need a 512 block: the 1,024 at 14,336 is halved; 600 slots need 1,024: the
    2,048 at 12,288 is halved; a second 300 takes the 512 left over at 14,848."""
    a = BuddyAllocator(PAPER_POOL)
    assert a.allocate(300) == 14336
    assert (14848, 512) in a.gaps() and (14336, 1024) not in a.gaps()
    assert a.allocate(600) == 12288
    assert (13312, 1024) in a.gaps()
    assert a.allocate(300) == 14848
    assert a.num_free == PAPER_POOL - 512 - 1024 - 512


def test_free_merges_buddies_back_up_to_the_top_level_block():
    a = BuddyAllocator(PAPER_POOL)
    first, second = a.allocate(300), a.allocate(300)
    assert (first, second) == (14336, 14848)
    a.free(first, 300)
    assert (14336, 512) in a.gaps()             # its buddy is still in use
    a.free(second, 300)
    assert a.gaps() == BuddyAllocator(PAPER_POOL).gaps() and a.num_free == PAPER_POOL


def test_free_space_in_small_blocks_cannot_serve_a_large_region():
    """Four 40-slot regions in 128 slots: each takes a 64 block, so only two fit although
    80 slots would remain free; the slots of smaller free blocks are unusable for them."""
    a = BuddyAllocator(128)
    assert [a.allocate(40) for _ in range(3)] == [0, 64, None]
    a.free(0, 40)
    assert a.allocate(20) == 0 and a.gaps() == [(32, 32)]
    assert a.unusable(40) == 32 and a.unusable(20) == 0 and not a.fits(33)


def test_double_free_and_misaligned_blocks_are_refused():
    a = BuddyAllocator(64)
    a.allocate(16)
    with pytest.raises(ValueError):
        a.free(16, 16)                    # [16, 32) is free already
    with pytest.raises(ValueError):
        a.free(8, 16)                     # a 16 block never starts at 8
    with pytest.raises(ValueError):
        a.allocate(0)
    assert [block_size_for(n) for n in (1, 16, 17)] == [1, 16, 32]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 70)), max_size=60))
def test_buddy_blocks_never_overlap_and_conserve_slots(ops):
    """Random allocations and frees over 200 slots: blocks are aligned to their size, never
    overlap, live + free = capacity; a failed allocation means no free block is big enough."""
    a, live = BuddyAllocator(200), []
    for is_alloc, n in ops:
        if is_alloc or not live:
            offset = a.allocate(n)
            if offset is None:
                assert a.largest_gap < block_size_for(n)
            else:
                live.append((offset, block_size_for(n), n))
        else:
            offset, _, n = live.pop(n % len(live))
            a.free(offset, n)
        spans = sorted([(o, b) for o, b, _ in live] + a.gaps())
        assert all(o % b == 0 for o, b in spans)
        assert all(o + b <= p for (o, b), (p, _) in zip(spans, spans[1:]))
        assert sum(b for o, b, _ in live) + a.num_free == 200 == sum(b for _, b in spans)


# --- reservations and the manager --------------------------------------------------------

def test_the_papers_pow2_over_reserves_the_output_only():
    """The paper: "if the true output length is 25, it reserves 32 positions for outputs"."""
    assert reservation_size("pow2-output", 125, 2048, prompt=100) == 132
    assert reservation_size("pow2", 125, 2048, prompt=100) == 128      # kvsim's pow2: final
    assert reservation_size("pow2-output", 2000, 2048, prompt=1600) == 2048   # capped


def test_buddy_manager_counts_the_blocks_slack_as_external_fragmentation():
    """160 slots = blocks of 128 + 32. Oracle regions of 40 occupy 64-slot blocks at 0 and 64;
    a third 40 finds only the 32 block (first-fit would place it at 80). Slack 2 * 24 slots
    is external fragmentation, and the 32 free slots too for a waiting 40."""
    m = ContiguousKVManager(10, 16, 160, reserve="oracle", allocator="buddy")
    assert [m.allocate(r, seq(0, 30, 10), 30) for r in "ABC"] == [[], [], None]
    assert [(m.region(r).offset, m.region(r).size, m.region(r).block) for r in "AB"] == [
        (0, 40, 64), (64, 40, 64)]
    assert m.num_reserved_slots == 128 and m.pool.num_used_blocks == 8
    assert m.fragmentation() == (60, 20, 0, 48)
    assert m.fragmentation(next_request=seq(0, 30, 10)) == (60, 20, 0, 80)
    first_fit = ContiguousKVManager(10, 16, 160, reserve="oracle")
    assert [first_fit.allocate(r, seq(0, 30, 10), 30) for r in "ABC"] == [[], [], []]
    m.free("A")
    assert m.allocator.gaps() == [(0, 64), (128, 32)] and m.fragmentation() == (30, 10, 0, 24)


def test_buddy_has_no_compaction_and_the_name_is_checked():
    with pytest.raises(ValueError):
        ContiguousKVManager(10, 16, 160, allocator="buddy", compaction_threshold=0.1)
    with pytest.raises(ValueError):
        ContiguousKVManager(10, 16, 160, allocator="best-fit")
    for bad in (dict(layout="contiguous", allocator="buddy", compaction_threshold=0.1),
                dict(layout="paged", allocator="buddy"), dict(allocator="best-fit")):
        with pytest.raises(ConfigError):
            RunConfig(**bad).validate()


# --- a run and the command line ------------------------------------------------------------

def test_buddy_oracle_batches_fewer_requests_than_first_fit():
    """ShareGPT-like lengths on the paper's pool: the buddy blocks' slack costs concurrency."""
    reqs = generate(preset_named("sharegpt-like"), GenConfig(num_requests=150, rate=20, seed=0))
    batch = {}
    for allocator in ("first-fit", "buddy"):
        r = simulate(reqs, RunConfig(model="opt-13b", gpu="a100-40gb", num_gpu_blocks=982,
                                     max_model_len=2048, layout="contiguous", reserve="oracle",
                                     allocator=allocator))
        requests = results.requests_frame(r)
        summary = results.build_summary(r, requests)
        assert sum(summary["fragmentation"].values()) == pytest.approx(1.0)
        batch[allocator] = summary["kv"]["mean_batch_size"]
    assert batch["buddy"] < 0.95 * batch["first-fit"]


def test_cli_buddy_with_compaction_is_one_line_exit_2():
    done = kvsim("run", "sample:azure-conv", "--layout", "contiguous", "--allocator", "buddy",
                 "--compaction-threshold", "0.1", "--limit", "5")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "compact" in done.stderr


def test_the_model_length_is_capped_by_the_largest_buddy_block():
    """400 blocks of 16 are 6,400 slots: the largest buddy block holds 4,096 (a request
    reserving more never fits: it hung the run as 'no progress')."""
    from kvsim.sim.serving.runner import resolve_deployment
    config = RunConfig(num_gpu_blocks=400, layout="contiguous", allocator="buddy")
    assert resolve_deployment(config).max_model_len == 4096
    with pytest.raises(ConfigError, match=r"largest region the buddy allocator .* \(4,096"):
        resolve_deployment(RunConfig(num_gpu_blocks=400, layout="contiguous",
                                     allocator="buddy", max_model_len=5000))
    one = [Request(0, 0.0, 100, 10)]
    r = simulate(one, config)
    assert results.requests_frame(r)["generated_tokens"].tolist() == [10]
