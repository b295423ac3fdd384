"""A decode run's opens and block tails: the arithmetic formulation equals the matrices."""

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.cache.run_grid import StepGrid, open_events, tail_offsets


def _run(num_computed, finish_step, joined=None):
    as_array = lambda v: None if v is None else np.array(v, dtype=np.int64)  # noqa: E731
    return SimpleNamespace(num_computed=as_array(num_computed),
                           finish_step=as_array(finish_step), joined=as_array(joined))


def test_a_story_of_two_requests_and_one_joining():
    # block size 4: request 0 has 6 tokens before step 0 (offset 2), finishes after step 5;
    # request 1 has 3 (offset 3), finishes after step 2; request 2 joins at step 2 with a
    # 5-token prompt (4 computed after its admitting step: kept as 4 - 2 = 2 before step 0)
    run = _run([6, 3, 2], [5, 2, 7], [-1, -1, 2])
    grid = StepGrid(run, 0, 6, 4)
    assert grid.offset.tolist() == [[2, 3, 2], [3, 0, 3], [0, 1, 0], [1, 2, 1], [2, 3, 2],
                                    [3, 0, 3]]
    # opens: request 1 at step 1 (4 tokens), request 0 at step 2 (8), request 2 decodes from
    # step 3 on and opens nothing before step 6
    assert [a.tolist() for a in grid.open_events()] == [[1, 2], [1, 0]]
    # tails after each step: who stays (0 until step 4, 1 until step 1, 2 from step 2)
    assert grid.tail_offsets().tolist() == [2 + 3, 3 + 0, 0 + 0, 1 + 1, 2 + 2, 0 + 3]
    assert [a.tolist() for a in open_events(run, 0, 6, 4)] == [[1, 2], [1, 0]]
    assert tail_offsets(run, 0, 6, 4).tolist() == [5, 3, 0, 2, 4, 3]


def test_a_window_later_in_the_run_counts_its_steps_from_its_first():
    run = _run([6, 3, 2], [5, 2, 7], [-1, -1, 2])
    rows, cols = open_events(run, 2, 4, 4)
    assert (rows.tolist(), cols.tolist()) == ([0], [0])     # request 0's open at step 2
    assert tail_offsets(run, 2, 4, 4).tolist() == [0, 2, 4, 3]


@st.composite
def _runs(draw):
    size = draw(st.integers(1, 12))
    bs = draw(st.sampled_from([1, 2, 3, 4, 7, 16]))
    first = draw(st.integers(0, 30))
    n = draw(st.integers(1, 40))
    finish = draw(st.lists(st.integers(0, 80), min_size=size, max_size=size))
    joined = None
    computed = draw(st.lists(st.integers(0, 300), min_size=size, max_size=size))
    if draw(st.booleans()):
        joined = [draw(st.integers(-1, f)) for f in finish]
        # a joining request's tokens before step 0 may be negative (its prompt, less its step)
        computed = [c - max(j, 0) for c, j in zip(computed, joined)]
    return _run(computed, finish, joined), first, n, bs


@settings(max_examples=400, deadline=None)
@given(_runs())
def test_the_arithmetic_equals_the_matrices(case):
    run, first, n, bs = case
    grid = StepGrid(run, first, n, bs)
    rows, cols = grid.open_events()
    found_rows, found_cols = open_events(run, first, n, bs)
    assert found_rows.tolist() == rows.tolist() and found_cols.tolist() == cols.tolist()
    assert tail_offsets(run, first, n, bs).tolist() == grid.tail_offsets().tolist()
