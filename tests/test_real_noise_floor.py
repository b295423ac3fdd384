"""The noise floor: a real run's steps replayed exactly, and every error judged against how
much the real backend disagrees with itself."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from kvsim.cache.step_plan import SWAP_OUT, BlockTransfer, ScheduledRequest, StepPlan  # noqa: E402,E501
from kvsim.real_backend import noise_floor as nf  # noqa: E402
from kvsim.real_backend.validate_report import note_lines, profile_lines  # noqa: E402


def test_a_snapshot_keeps_the_block_tables_of_its_step():
    live = {7: [0, 1], 8: [2]}
    plan = StepPlan([ScheduledRequest(7, 1, 40), ScheduledRequest(8, 5, 0)],
                    transfers=[BlockTransfer(SWAP_OUT, [(3, 0)])], block_table=live.__getitem__)
    frozen = nf.snapshot(plan)
    live[7].append(9)          # the scheduler moves on: request 7 grows a block
    plan.scheduled[0].num_computed_tokens = 41
    plan.transfers[0].pairs.clear()
    assert frozen.block_table(7) == [0, 1] and frozen.block_table(8) == [2]
    assert frozen.scheduled[0].num_computed_tokens == 40
    assert frozen.transfers[0].pairs == [(3, 0)]


def test_replay_runs_every_plan_in_order_after_host_work():
    seen, pauses = [], []

    class Recorder:
        def step_duration(self, plan):
            seen.append(plan)
            return 0.01 * len(seen)

    plans = [StepPlan(), StepPlan(), StepPlan()]
    durations = nf.replay(Recorder(), plans, between=lambda: pauses.append(len(seen)))
    assert durations == [0.01, 0.02, 0.03]
    assert seen == plans and pauses == [0, 1, 2]


def test_floor_compares_two_measurements_of_the_same_steps():
    first = [0.010, 0.020, 0.0, 0.040]        # the third step copied blocks only, untimed
    second = [0.011, 0.018, 0.0, 0.040]
    out = nf.floor(first, second, duration_s=0.100)   # 0.03 s of the run were idle
    assert out["steps"] == 3
    assert out["step_median_abs_rel_diff"] == pytest.approx(0.10)   # +10 %, -10 %, 0 %
    assert out["total_time_rel_diff"] == pytest.approx(0.001 / 0.070)
    assert out["total_time_signed_rel_diff"] == pytest.approx(-0.001 / 0.070)
    assert out["throughput_rel_diff"] == pytest.approx(0.100 / 0.099 - 1)


def test_an_error_inside_the_floor_is_neither_a_pass_nor_a_fail():
    assert nf.judge(0.03, 0.04, 0.05)["verdict"] == nf.WITHIN
    assert nf.judge(0.08, 0.10, 0.05) == {"error": 0.08, "noise_floor": 0.10, "target": 0.05,
                                          "times_floor": pytest.approx(0.8),
                                          "verdict": nf.WITHIN, "floor_above_target": True}
    assert nf.judge(0.04, 0.02, 0.05)["verdict"] == nf.PASS
    assert nf.judge(0.07, 0.02, 0.05)["verdict"] == nf.FAIL
    assert nf.judge(0.07, None, 0.05)["verdict"] == nf.UNJUDGED


def report(step=0.04, thr=0.02, floor_step=0.06, floor_thr=0.01):
    return {"step_duration": {"all": {"median_abs_rel_error": step}},
            "metrics": {"throughput_output_tokens_per_s": {"rel_error": thr}},
            "noise_floor": {"step_median_abs_rel_diff": floor_step,
                            "throughput_rel_diff": floor_thr, "total_time_rel_diff": 0.01}}


def test_a_validation_judges_step_time_and_throughput_against_its_floor():
    v = nf.verdicts(report())
    assert v["step_median"]["verdict"] == nf.WITHIN and v["throughput"]["verdict"] == nf.PASS
    no_floor = {k: v for k, v in report().items() if k != "noise_floor"}
    assert {j["verdict"] for j in nf.verdicts(no_floor).values()} == {nf.UNJUDGED}


def test_the_printed_notes_say_the_floor_and_each_verdict():
    r = report()
    r["verdicts"] = nf.verdicts(r)
    r["steps"], r["offline"] = {}, True
    lines = note_lines(r)
    assert lines[0].startswith("noise floor (the real steps replayed once more): step 6.0%")
    assert lines[1] == ("step duration (median): error 4.0% against a noise floor of 6.0% = "
                        "0.7x the floor, target 5.0%: WITHIN NOISE FLOOR, and within the 5.0% "
                        "target (the best this host can tell) (the floor itself is above the "
                        "target)")
    assert lines[2].endswith("target 5.0%: PASS")
    timed = note_lines({**r, "offline": False})[2]
    assert timed.endswith("PASS (timed arrivals: the throughput follows their rate unless the "
                          "deployment is saturated; --offline judges the model's)")
    tiny = {**r, "verdicts": {"throughput": {**r["verdicts"]["throughput"], "error": 0.0004,
                                             "noise_floor": 0.0003}}}
    assert "error 0.04% against a noise floor of 0.03%" in note_lines(tiny)[1]
    r["speed_refit"] = nf.speed_refit([1.2] * 10, [1.0] * 10, fraction=0.5)
    assert note_lines(r)[3] == ("host speed vs profile, refitted on the first 5 steps: x1.200; on "
                                "the other steps the step error goes 16.7% -> 0.0% (median), "
                                "busy time -16.7% -> +0.0%")
    silent = {"steps": {}, "noise_floor": None}
    assert "not measured" in note_lines(silent)[0]


def quality(**kw):
    return {"source": "full grid", "points": 73, "passes": 3, "fit_median": 0.02,
            "fit_max": 0.12, "round_spread": {"passes": 3, "median": 0.01, "p90": 0.03,
                                              "drift": 0.0}, "age_s": 1.0, **kw}


def test_a_sound_fresh_profile_gets_no_warning_and_a_rough_one_says_by_how_much():
    assert profile_lines(quality()) == []
    rough = profile_lines(quality(source="quick grid", points=29, passes=1, fit_median=0.146,
                                  fit_max=0.244, round_spread=None))
    assert rough == ["warning: quick profile (29 points, one pass): rough. Its fit misses its "
                     "own points by 14.6% median, 24.4% max, and one pass cannot see the host "
                     "drifting while it ran: expect step errors of the fit error plus the "
                     "noise floor, or more (drop --quick-profile for the full grid)"]
    drifting = profile_lines(quality(round_spread={"passes": 3, "median": 0.08, "p90": 0.2,
                                                   "drift": -0.11}))
    assert drifting == ["warning: the profile's 3 passes disagreed by 8.0% per point (median), "
                        "whole grid drifted -11.0%: the host changed speed while profiling, "
                        "and may again before the run (--profile-timing interleaved follows "
                        "it)"]
    followed = profile_lines(quality(timing="interleaved", between_steps=0.4, passes=7,
                                     round_spread={"passes": 7, "median": 0.3, "p90": 0.5,
                                                   "drift": 0.02}))
    assert followed == ["note: the profile's 7 passes, spread over the real run, disagreed by "
                        "30.0% per point (median): the host's speed moved during the run; each "
                        "point's median over the passes follows it",
                        "note: the run was short: 40% of the profile's measurements fell "
                        "between its steps, the rest right after it"]
    old = profile_lines(quality(source="file", age_s=1800.0))
    assert len(old) == 1 and old[0].startswith("warning: the profile is 30 min old")


def test_a_speed_offset_refitted_on_the_first_steps_leaves_only_the_shape_error():
    # the host runs 20 % slower than profiled, and the model misses step 4 by 10 % besides
    predicted = [1.0] * 10 + [2.0, 2.0, 2.0, 2.0]
    measured = [1.2] * 10 + [2.4, 2.4, 2.4, 2.2 * 1.2]
    out = nf.speed_refit(measured, predicted, fraction=0.5)
    assert out["first_steps"] == 7 and out["factor"] == pytest.approx(1.2)
    assert out["step_median_before"] == pytest.approx(abs(1 / 1.2 - 1))
    assert out["step_median_after"] == pytest.approx(0.0)
    # the rest: predicted 11 s, measured 13.44 s; refitted 13.2 s
    assert out["busy_time_before"] == pytest.approx(11 / 13.44 - 1)
    assert out["busy_time_after"] == pytest.approx(13.2 / 13.44 - 1)
    assert nf.speed_refit([0.1], [0.1])["factor"] is None      # too few steps to refit
