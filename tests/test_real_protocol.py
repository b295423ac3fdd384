"""The reproducible validation protocol: N validations, each profiling first; every quantity
with its median and spread over the repeats, each error against its own noise floor."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from kvsim.real_backend import protocol  # noqa: E402
from kvsim.real_backend.noise_floor import verdicts  # noqa: E402
from kvsim.real_backend.session import BackendSettings  # noqa: E402
from kvsim.real_backend.validate import ValidateJob  # noqa: E402


def report(step, thr, floor_step, floor_thr, signed=0.01, parts=None):
    """A validation report as :func:`validate` returns it, with only the numbers read."""
    r = {"step_duration": {"all": {"median_abs_rel_error": step},
                           "total_time_signed_error": signed},
         "metrics": {"throughput_output_tokens_per_s": {"rel_error": thr}},
         "noise_floor": {"step_median_abs_rel_diff": floor_step, "throughput_rel_diff": floor_thr},
         "profile_quality": {"fit_median": 0.02, "round_spread": {"median": 0.01}},
         "mean_step_s": {"real": 0.011}, "decisions": {"identical": True},
         "host": {"others_cpus": 0.0, "wall_s": 70.0},
         "steps": {"measured_s": [0.01]}}
    if parts:
        r["steps"]["parts"], r["steps"]["replayed_parts"] = parts
    r["verdicts"] = verdicts(r)
    return r


def parts(attention, again):
    """Two steps' parts: attention as given, 1 s of everything else per step."""
    run = {"prepare": [0.0, 0.0], "attention": attention, "mlp": [0.0, 0.0],
           "lm_head": [1.0, 1.0], "other": [0.0, 0.0]}
    run["total"] = [a + 1.0 for a in attention]
    replay = {**run, "attention": again, "total": [a + 1.0 for a in again]}
    return run, replay


def test_three_repeats_give_median_spread_and_verdicts():
    reports = [protocol.slim(report(0.030, 0.010, 0.020, 0.005, signed=-0.02)),
               protocol.slim(report(0.045, 0.020, 0.050, 0.010, signed=+0.03)),
               protocol.slim(report(0.070, 0.040, 0.030, 0.008, signed=+0.01))]
    s = protocol.summarize(reports)
    assert s["quantities"]["step_median_error"] == {
        "values": [0.030, 0.045, 0.070], "median": 0.045, "min": 0.030, "max": 0.070,
        "spread": pytest.approx(0.040)}
    assert s["quantities"]["busy_time_signed_error"]["values"] == [-0.02, 0.03, 0.01]
    assert s["quantities"]["step_error_times_floor"]["values"] == pytest.approx([1.5, 0.9, 7 / 3])
    assert s["verdicts"] == {"step_median": ["pass", "within noise floor", "fail"],
                             "throughput": ["pass", "pass", "pass"]}
    assert s["conclusion"]["throughput"] == ("within the 5% target and above the noise floor "
                                             "in all 3 repeats")
    assert s["conclusion"]["step_median"] == ("failed the 5% target (above the noise floor) "
                                              "in 1 of 3 repeats; pass 1, within the noise "
                                              "floor 1")
    assert "steps" not in s["repeats"][0] and "parts" not in s


def test_no_failure_when_every_repeat_is_inside_its_floor_or_the_target():
    assert protocol.conclusion(["within noise floor", "pass", "within noise floor"], 0.05) == (
        "within the noise floor in 2 of 3 repeats, within the 5% target in the other 1: no "
        "repeat failed")
    assert protocol.conclusion(["not judged", "pass"], 0.05) == (
        "not judged in 1 of 2 repeats (no noise floor); pass 1, within the noise floor 0, "
        "fail 0")


def test_the_parts_say_which_moved_between_runs_and_within_one():
    one = protocol.slim(report(0.03, 0.01, 0.02, 0.01, parts=parts([2.0, 2.0], [3.0, 1.0])))
    two = protocol.slim(report(0.03, 0.01, 0.02, 0.01, parts=parts([3.0, 3.0], [3.0, 3.0])))
    moved = protocol.summarize([one, two])["parts"]
    # attention totals over the four runs: 4, 4, 6, 6 s (median 5): spread 40 %
    assert moved["attention"]["totals_s"] == [4.0, 4.0, 6.0, 6.0]
    assert moved["attention"]["run_to_run_spread"] == pytest.approx(0.4)
    assert moved["attention"]["step_move_median"] == pytest.approx(0.25)   # 50 %, then 0 %
    assert moved["lm_head"]["run_to_run_spread"] == 0.0
    assert moved["lm_head"]["share"] == pytest.approx(8 / 28)
    table = protocol.render_protocol(protocol.summarize([one, two]))
    assert "attention" in table and "moved between runs" in table


def test_each_repeat_is_a_validation_that_profiles_between_its_steps(monkeypatch):
    jobs = []

    def fake_validate(reqs, job, progress):
        jobs.append((len(reqs), job.profile, job.profile_grid, job.profile_timing))
        return report(0.02, 0.01, 0.03, 0.02)
    monkeypatch.setattr(protocol, "validate", fake_validate)
    job = ValidateJob(BackendSettings(clock="cpu"), offline=True)
    s = protocol.run_protocol(iter(range(5)), job, repeats=3)
    assert jobs == [(5, None, "full", "interleaved")] * 3
    assert s["num_repeats"] == 3 and s["verdicts"]["step_median"] == ["within noise floor"] * 3
    assert all(r["host"]["wall_s"] >= 0 for r in s["repeats"])
    lines = protocol.render_protocol(s).splitlines()
    assert lines[0].split() == ["quantity", "repeat", "1", "repeat", "2", "repeat", "3",
                                "median", "spread"]
    assert lines[1].split()[-5:] == ["2.0%", "2.0%", "2.0%", "2.0%", "0.0%"]
