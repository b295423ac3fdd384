"""A profile measured between the real run's steps: it keeps pace with the run (profiling
time = ``share`` x run time, checked after every step), cycles through the grid, completes
its last pass, and never touches the run's KV."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import numpy as np  # noqa: E402

from kvsim.errors import ConfigError  # noqa: E402
from kvsim.real_backend import interleaved_profile as ip  # noqa: E402
from kvsim.real_backend.profiling import Limits  # noqa: E402
from kvsim.real_backend.session import (BackendSettings, build_runner,  # noqa: E402
                                        prepare_device, warm_up)
from kvsim.real_backend.validate import ValidateJob, validate  # noqa: E402
from kvsim.real_backend.validate_report import profile_lines, render_table  # noqa: E402

SETTINGS = BackendSettings(clock="cpu")
LIMITS = Limits(max_num_seqs=4, max_num_batched_tokens=64, max_context=128)


class FakeWall:
    """A wall clock that moves only when told: a run step, or one measured grid item."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def profiler(monkeypatch):
    """A quick-grid profile whose every item 'takes' one second of the fake wall clock and
    measures 1 ms (+ 1 ms per pass already taken, so passes are told apart)."""
    wall = FakeWall()
    model = prepare_device(SETTINGS)
    runner = build_runner(SETTINGS, model, num_blocks=8)
    warm_up(runner, LIMITS.max_num_seqs)
    prof = ip.InterleavedProfile(runner, SETTINGS, model, LIMITS, share=0.5, quick=True,
                                 wall=wall)

    def one_second(call, device, now, warmup, repeats):
        wall.now += 1.0
        return 1e-3 * (1 + len(prof.samples[prof._next]))
    monkeypatch.setattr(ip, "steady_median", one_second)
    return prof, wall, runner


def test_profiling_keeps_pace_with_the_run_at_its_share(profiler):
    prof, wall, _ = profiler
    prof.start()
    wall.now += 4.0                       # a 4-second step
    prof.between_steps()                  # half of it: two items
    assert [len(s) for s in prof.samples[:3]] == [1, 1, 0]
    assert prof.spent_s == 2.0 and prof.num_between == 2
    wall.now += 1.0                       # a 1-second step: the run has had 5 s, profiling 2
    prof.between_steps()
    assert prof.num_between == 3 and prof.spent_s == 3.0
    prof.between_steps()                  # no run time since: nothing more
    assert prof.num_between == 3


def test_the_profile_completes_its_pass_and_takes_each_items_median(profiler):
    prof, wall, _ = profiler
    items = len(prof.calls)
    prof.start()
    wall.now += 2.0 * (items + 2)         # a step long enough for one pass and two items
    prof.between_steps()
    assert [len(s) for s in prof.samples] == [2, 2] + [1] * (items - 2)
    out = prof.profile()
    assert prof.passes == 2 and {len(s) for s in prof.samples} == {2}
    assert out["grid"]["rounds"] == 2
    assert out["timing"] == {"kind": "interleaved", "share": 0.5, "items": items,
                             "measured_between_steps": pytest.approx((items + 2) / (2 * items))}
    assert {p["measured_s"] for p in out["points"]} == {1.5e-3}   # median of 1 and 2 ms
    assert out["round_spread"]["drift"] == pytest.approx(1.0)      # the second pass: 2x


def test_with_nothing_measured_during_the_run_it_still_makes_its_minimum_passes(profiler):
    prof, _, _ = profiler
    prof.min_passes = 2
    prof.start()
    prof.between_steps()                  # no run time yet: nothing
    assert prof.num_between == 0
    out = prof.profile()
    assert prof.passes == 2 and out["timing"]["measured_between_steps"] == 0.0


def test_profiling_leaves_the_runs_kv_and_weights_as_they_were():
    import torch
    model = prepare_device(SETTINGS)
    runner = build_runner(SETTINGS, model, num_blocks=8)
    warm_up(runner, LIMITS.max_num_seqs)
    kv = runner.kv_store.device_kv.clone()
    prof = ip.InterleavedProfile(runner, SETTINGS, model, LIMITS, quick=True)
    prof.start()
    for _ in range(len(prof.calls)):      # one real pass over every item
        prof._measure_next()
    assert prof.runner.model is runner.model and prof.runner.kv_store is not runner.kv_store
    assert torch.equal(runner.kv_store.device_kv, kv)
    assert prof.passes == 1 and min(min(s) for s in prof.samples) > 0


def test_a_validation_with_an_interleaved_profile_predicts_with_it():
    from test_real_validate import workload
    job = ValidateJob(SETTINGS, {"num_gpu_blocks": 64, "max_num_seqs": 4,
                                 "max_num_batched_tokens": 128},
                      offline=True, profile_grid="quick", breakdown=True)
    report = validate(workload(8), job)
    assert report["profile_source"] == "quick grid"
    assert report["profile_quality"]["timing"] == "interleaved"
    assert report["noise_floor"]["same_outputs"]
    steps = report["steps"]
    assert len(steps["predicted_s"]) == len(steps["measured_s"]) == len(steps["parts"]["total"])
    # the profile measured here, not a GPU's: predictions in milliseconds, as the CPU steps
    ratio = np.median(np.array(steps["predicted_s"]) / np.array(steps["measured_s"]))
    assert 0.5 < ratio < 2.0
    assert profile_lines(report["profile_quality"])[0].startswith("warning: quick profile")
    assert "measured between the real steps" in render_table(report).splitlines()[0]


@pytest.mark.parametrize("timing, share", [("during", 1.0), ("interleaved", 0.0)])
def test_an_unknown_timing_or_a_share_that_is_not_positive_is_refused(timing, share):
    job = ValidateJob(SETTINGS, profile_timing=timing, profile_share=share)
    with pytest.raises(ConfigError):
        validate(workload_of_one(), job)


def workload_of_one():
    from kvsim.workloads import Request
    return [Request(0, 0.0, 16, 2)]
