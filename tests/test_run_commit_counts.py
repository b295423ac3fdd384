"""How a decode run counts the pool's used and cached idle blocks after each step of the
stretches that opened their blocks in bulk (:func:`kvsim.cache.run_commit._count_opened`)."""

import numpy as np

from kvsim.cache.run_commit import _count_opened


def _counts(taken, opened, n):
    used, idle = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    _count_opened(used, idle, np.array(taken, dtype=np.int64), opened)
    return used.tolist(), idle.tolist()


def test_a_stretch_counts_from_the_pool_before_it_and_evicts_past_the_free_empty_blocks():
    # 3 blocks opened by step 2; the pool held 10 used and 5 cached idle blocks, 1 free and
    # empty: the first block taken is the empty one, each later one evicts cached content
    assert _counts([1, 1, 3], [(0, 3, 10, 5, 1)], 3) == ([11, 11, 13], [5, 5, 3])


def test_each_stretch_starts_from_its_own_pool_and_counts_its_own_opens():
    # opens up to each step: 1 1 | 3 4 4 6; the second stretch starts after finishes left
    # 20 used, 7 cached idle and 2 free empty blocks, and counts the opens since step 1
    used, idle = _counts([1, 1, 3, 4, 4, 6], [(0, 2, 10, 5, 1), (2, 6, 20, 7, 2)], 6)
    assert used == [11, 11, 22, 23, 23, 25]
    assert idle == [5, 5, 7, 6, 6, 4]


def test_steps_of_stretches_opened_one_event_at_a_time_are_left_as_they_are():
    used, idle = _counts([1, 2, 2, 3, 5, 5], [(0, 2, 10, 0, 9), (4, 6, 30, 4, 0)], 6)
    assert used == [11, 12, -1, -1, 32, 32]
    assert idle == [0, 0, -1, -1, 2, 2]
