"""The opt-in step breakdown: every forward pass is split into host preparation, attention,
MLP, LM head and the rest, on any clock; detaching leaves the runner as it was."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("torch")

from kvsim.real_backend.breakdown import PARTS, StepBreakdown, mean_record, part_table  # noqa: E402,E501
from shapes import llama  # noqa: E402
from kvsim.real_backend.model_runner import ModelRunner, RequestChunk  # noqa: E402

SMALL = llama(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
              intermediate_size=128, vocab_size=101)


def ticking_clock():
    """A clock that advances by one second every time it is read."""
    ticks = itertools.count()
    return lambda: float(next(ticks))


def test_each_part_is_charged_the_time_between_its_own_clock_reads():
    runner = ModelRunner.create(SMALL, num_blocks=8, block_size=16)
    breakdown = StepBreakdown(ticking_clock()).attach(runner)
    runner.greedy([RequestChunk([1, 2, 3], 0, [0]), RequestChunk([4], 20, [1, 2])])
    # one tick per timed region: prepare 1, attention 1 per layer, mlp 1 per layer, head 1;
    # the pass reads the clock 2 + 4 x 2 layers + 2 times inside, so it spans 13 ticks
    assert breakdown.records == [{"prepare": 1.0, "attention": 2.0, "mlp": 2.0,
                                  "lm_head": 1.0, "other": 7.0, "total": 13.0}]


def test_detaching_restores_the_untimed_runner():
    runner = ModelRunner.create(SMALL, num_blocks=8, block_size=16)
    before = runner.greedy([RequestChunk([5, 6], 0, [0])])
    breakdown = StepBreakdown(ticking_clock()).attach(runner)
    assert runner.greedy([RequestChunk([5, 6], 0, [0])]) == before   # same tokens, timed
    breakdown.detach()
    assert runner.greedy([RequestChunk([5, 6], 0, [0])]) == before
    assert len(breakdown.records) == 1                                # the untimed pass: none
    assert "greedy" not in vars(runner) and "logits" not in vars(runner.model)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in runner.model.modules())


def test_a_step_gets_the_mean_of_its_forward_passes():
    a = {"prepare": 1.0, "attention": 4.0, "mlp": 2.0, "lm_head": 3.0, "other": 0.0,
         "total": 10.0}
    b = {**a, "attention": 6.0, "total": 12.0}
    assert mean_record([a, b]) == {**a, "attention": 5.0, "total": 11.0}
    assert mean_record([]) == dict.fromkeys(PARTS + ("total",), 0.0)   # block copies only


def test_part_table_shows_share_and_how_much_a_part_moved_in_the_replay():
    steps = {"parts": {"attention": [2.0, 0.0, 2.0], "total": [4.0, 1.0, 5.0]},
             "replayed_parts": {"attention": [3.0, 0.0, 1.0], "total": [4.0, 1.0, 5.0]}}
    table = part_table(steps)
    assert table["attention"] == {"mean_s": pytest.approx(4 / 3), "share": 0.4,
                                  "step_median_abs_rel_diff": 0.5,   # +50 % and -50 %
                                  "total_signed_rel_diff": 0.0}
    assert table["total"]["share"] == 1.0 and table["total"]["step_median_abs_rel_diff"] == 0.0
