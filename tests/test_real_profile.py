"""`kvsim profile`: the grid spans the operating range, the fit recovers known coefficients,
and the written profile drives the cost model (also through `kvsim run --profile`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from kvsim.cache.step_plan import COMPACT, SWAP_OUT, BlockTransfer, ScheduledRequest, StepPlan  # noqa: E402,E501
from kvsim.errors import ConfigError  # noqa: E402
from kvsim.real_backend.backend_model import resolve_backend_model  # noqa: E402
from kvsim.real_backend.profile_fit import fit_errors, fit_profile, predict  # noqa: E402
from kvsim.real_backend.profiling import Limits, default_grid  # noqa: E402
from kvsim.sim.perf.cost_model import CostModel  # noqa: E402
from kvsim.sim.perf.profile import FITTED_TERMS, MODEL_SHAPE_KEYS  # noqa: E402
from kvsim.sim.serving.executor import Executor  # noqa: E402
from clirun import kvsim  # noqa: E402

TINY = resolve_backend_model("tiny-llama")
TRUE = {"step_s": 4e-3, "per_seq_s": 2e-4, "per_token_s": 4e-5, "per_kv_token_s": 1.5e-6,
        "per_attn_unit_s": 1e-8, "copy_call_s": 1e-5}
BLOCK_BYTES = 32 * 4096


def synthetic_times(points):
    copy = {SWAP_OUT: 2e-10, COMPACT: 1.5e-10}
    out = []
    for p in points:
        if p.copy:
            out.append(TRUE["copy_call_s"] + p.copy[1] * BLOCK_BYTES * copy[p.copy[0]])
        else:
            f = p.features()
            out.append(float(np.dot(f, [TRUE[k] for k in list(TRUE)[:5]])))
    return out


def fitted_profile(**coef):
    shape = {k: getattr(TINY.spec, k) for k in MODEL_SHAPE_KEYS}
    return {"kind": "fitted", "model_shape": shape,
            "fitted": {**{k: 0.0 for k in FITTED_TERMS}, **coef}}


def test_grid_stays_inside_the_operating_range():
    limits = Limits(max_num_seqs=12, max_num_batched_tokens=300, max_context=700)
    grid = default_grid(limits)
    groups = {p.group for p in grid.points}
    assert groups == {"prefill", "decode", "mixed", "transfer"}
    for p in grid.points:
        assert all(q + c <= limits.max_context for q, c in p.batch)
        if p.group in ("decode", "mixed"):
            assert sum(1 for q, _ in p.batch if q == 1) <= limits.max_num_seqs
        if p.group != "prefill":
            assert sum(q for q, _ in p.batch) <= limits.max_num_batched_tokens + limits.max_num_seqs
    assert len(default_grid(limits, quick=True).points) < len(grid.points)


def test_fit_recovers_known_coefficients():
    grid = default_grid(Limits(16, 512, 1024))
    times = synthetic_times(grid.points)
    coef = fit_profile(grid.points, times, BLOCK_BYTES)
    for key, value in TRUE.items():
        assert coef[key] == pytest.approx(value, rel=1e-6, abs=1e-12)
    assert coef["host_copy_s_per_byte"] == pytest.approx(2e-10)
    errors = fit_errors(grid.points, times, coef, BLOCK_BYTES)
    assert max(e["median_abs_rel_error"] for e in errors.values()) < 1e-6
    assert predict(grid.points[0], coef, BLOCK_BYTES) == pytest.approx(times[0])


def test_fitted_profile_sets_the_cost_model_directly():
    prof = fitted_profile(**{k: TRUE[k] for k in ("step_s", "per_seq_s", "per_token_s",
                                                  "per_kv_token_s", "per_attn_unit_s")},
                          host_copy_s_per_byte=1e-10, copy_call_s=1e-5)
    cm = CostModel(TINY.sim_model, "a100-80gb", block_size=32, profile=prof, dtype="fp32")
    plan = StepPlan(scheduled=[ScheduledRequest(0, 100, 28), ScheduledRequest(1, 1, 63)])
    tokens, seqs, kv, units = 101, 2, 128 + 64, 100 * (56 + 101) + 1 * (126 + 2)
    expected = (TRUE["step_s"] + seqs * TRUE["per_seq_s"] + tokens * TRUE["per_token_s"]
                + kv * TRUE["per_kv_token_s"] + units * TRUE["per_attn_unit_s"])
    assert cm.step_duration(plan) == pytest.approx(expected, rel=1e-12)
    plan.transfers.append(BlockTransfer(SWAP_OUT, [(0, 0), (1, 1)]))
    assert cm.step_duration(plan) == pytest.approx(expected + 1e-5 + 2 * cm.block_bytes * 1e-10)
    decode = cm.decode_durations(4, 400, 3)
    plans = [StepPlan(scheduled=[ScheduledRequest(i, 1, 100 + k) for i in range(4)])
             for k in range(3)]
    assert decode.tolist() == [cm.step_duration(p) for p in plans]   # skip-ahead bit for bit
    stretches = [(1, 3, 300, 40), (5, 4, 400, 0), (2, 2, 90, 0)]    # (the per-step path: the
    assert cm._decode_slope == 0.0                                    # fitted additive terms)
    assert cm.steps_until(iter(stretches), 1.0, 2.0) == \
        Executor.steps_until(cm, iter(stretches), 1.0, 2.0)
    assert cm.steps_until(iter(stretches), 1.0, 2.0)[0][1:6] == decode.tolist() + \
        cm.decode_durations(4, 412, 2).tolist()


def test_fitted_profile_refuses_another_model_and_names_the_one_of_its_shape():
    with pytest.raises(ConfigError) as err:
        CostModel("llama-2-7b", "a100-80gb", profile=fitted_profile(step_s=0.01))
    assert str(err.value).startswith("field 'profile': the fitted profile was measured on "
                                     "another model than llama-2-7b: num_layers 2 (not 32)")
    assert str(err.value).endswith("; run it with --model tiny-llama")     # (bundled)
    odd = fitted_profile(step_s=0.01)
    odd["model_shape"] = {**odd["model_shape"], "num_layers": 3}       # no model kvsim knows
    with pytest.raises(ConfigError) as err:
        CostModel("llama-2-7b", "a100-80gb", profile=odd)
    assert str(err.value).endswith("; give --model the config.json of the model it was "
                                   "measured on")
    named = {**odd, "sim_model": "exp/m.json"}                        # (as profile writes)
    with pytest.raises(ConfigError) as err:
        CostModel("llama-2-7b", "a100-80gb", profile=named)
    assert str(err.value).endswith("; run it with --model exp/m.json, the model it was "
                                   "measured on")
    shape = {k: getattr(CostModel("llama-3-8b", "a100-80gb").model, k) for k in MODEL_SHAPE_KEYS}
    profile = {**fitted_profile(step_s=0.01), "model_shape": shape}
    with pytest.raises(ConfigError) as err:
        CostModel("llama-2-7b", "a100-80gb", tp=2, profile=profile)
    assert str(err.value).endswith("tp 1 (not 2); run it with --model llama-3-8b or "
                                   "llama-3.1-8b and --tp 1")


def test_profile_command_writes_a_profile_that_run_accepts(tmp_path):
    out = tmp_path / "cpu.json"
    done = kvsim("profile", "--quick", "--out", str(out), "--max-num-seqs", "4",
                 "--max-num-batched-tokens", "128", "--max-context", "256")
    assert done.returncode == 0, done.stderr
    assert "prefill" in done.stdout and "decode" in done.stdout
    profile = json.loads(out.read_text())
    assert profile["kind"] == "fitted" and profile["device"] == "cpu"
    assert set(FITTED_TERMS) <= set(profile["fitted"])
    assert set(profile["fit_error"]) == {"prefill", "decode", "mixed", "transfer"}
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"prompt_tokens": 40 + i, "output_tokens": 5,
                                         "arrival_s": 0.01 * i}) + "\n" for i in range(5)))
    run = kvsim("run", str(trace), "--model", TINY.sim_model, "--profile", str(out),
                "--num-gpu-blocks", "64", "--block-size", "32", "--out", str(tmp_path / "r"),
                "--json")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["num_completed"] == 5 and summary["duration_s"] > 0


def test_profile_command_reports_bad_input_in_one_line(tmp_path):
    done = kvsim("profile", "--device", "tpu", "--out", str(tmp_path / "p.json"))
    assert done.returncode == 2 and "device" in done.stderr
    done = kvsim("profile", "--model", "opt-13b", "--out", str(tmp_path / "p.json"))
    assert done.returncode == 2 and "Llama-like" in done.stderr


def test_a_coefficient_the_data_wants_negative_is_held_at_zero():
    from kvsim.real_backend.profile_fit import nnls_small
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    coef = nnls_small(x, np.array([3.0, 2.0, 1.0]))   # slope -1 unconstrained
    assert coef[1] == 0.0 and coef[0] == pytest.approx(2.0)


# --- per-batch table (LM head per row count), steady-state timing, outliers --------------------

TABLE = [1e-3, 3e-3, 2.5e-3, 2.6e-3, 3.4e-3, 3.3e-3, 3.9e-3, 4.1e-3]   # irregular, like a CPU head


def test_fit_with_a_batch_table_recovers_the_linear_terms():
    from kvsim.real_backend.profile_fit import batch_slope, batch_time
    grid = default_grid(Limits(16, 512, 1024))
    slope = batch_slope(TABLE)
    times = [t + (0.0 if p.copy else batch_time(len(p.batch), TABLE, slope))
             for p, t in zip(grid.points, synthetic_times(grid.points))]
    coef = fit_profile(grid.points, times, BLOCK_BYTES, TABLE)
    for key in ("step_s", "per_seq_s", "per_token_s", "per_kv_token_s", "per_attn_unit_s"):
        assert coef[key] == pytest.approx(TRUE[key], rel=1e-6, abs=1e-12)
    assert coef["per_batch_s"] == pytest.approx(TABLE, rel=1e-6)    # nothing left to backfit
    assert coef["per_batch_slope_s"] == pytest.approx(slope, rel=1e-6)
    errors = fit_errors(grid.points, times, coef, BLOCK_BYTES)
    assert max(e["max_abs_rel_error"] for e in errors.values()) < 1e-6


def test_a_point_the_linear_form_cannot_follow_is_left_out_of_the_fit():
    grid = default_grid(Limits(16, 512, 1024))
    times = synthetic_times(grid.points)
    worst = max((i for i, p in enumerate(grid.points) if p.group == "decode"),
                key=lambda i: grid.points[i].features()[3])
    times[worst] *= 2.5                  # e.g. gathered KV outgrowing the caches
    coef = fit_profile(grid.points, times, BLOCK_BYTES)
    for key in ("step_s", "per_token_s", "per_kv_token_s"):
        assert coef[key] == pytest.approx(TRUE[key], rel=1e-6)
    assert fit_errors(grid.points, times, coef, BLOCK_BYTES)["decode"]["max_abs_rel_error"] > 0.5


def test_the_batch_table_reaches_the_cost_model_and_skip_ahead_stays_exact():
    from kvsim.real_backend.profile_fit import batch_slope
    slope = batch_slope(TABLE)
    prof = fitted_profile(step_s=1e-3, per_seq_s=1e-5, per_token_s=4e-5, per_kv_token_s=1e-6,
                          per_attn_unit_s=1e-9)
    prof["fitted"].update(per_batch_s=TABLE, per_batch_slope_s=slope)
    cm = CostModel(TINY.sim_model, "a100-80gb", block_size=32, profile=prof, dtype="fp32")
    plain = CostModel(TINY.sim_model, "a100-80gb", block_size=32, dtype="fp32",
                      profile=fitted_profile(step_s=1e-3, per_seq_s=1e-5, per_token_s=4e-5,
                                             per_kv_token_s=1e-6, per_attn_unit_s=1e-9))
    for n in (1, 2, 3, 8, 9, 20):
        plan = StepPlan(scheduled=[ScheduledRequest(i, 1, 50 + i) for i in range(n)])
        extra = TABLE[n - 1] if n <= len(TABLE) else TABLE[-1] + (n - len(TABLE)) * slope
        assert cm.step_duration(plan) == pytest.approx(plain.step_duration(plan) + extra)
        plans = [StepPlan(scheduled=[ScheduledRequest(i, 1, 50 + k) for i in range(n)])
                 for k in range(4)]
        assert cm.decode_durations(n, 50 * n, 4).tolist() == [cm.step_duration(p) for p in plans]
    with pytest.raises(ConfigError):
        CostModel(TINY.sim_model, "a100-80gb", profile={**prof, "fitted": {
            **prof["fitted"], "per_batch_s": [-1.0]}})


def test_backfitting_moves_the_table_to_what_whole_decode_steps_cost():
    from kvsim.real_backend.profile_fit import batch_slope, batch_time
    grid = default_grid(Limits(8, 512, 1024))
    slope = batch_slope(TABLE)
    inside = [v + (0.5e-3 if n == 3 else 0.0) for n, v in enumerate(TABLE, 1)]   # head slower
    times = [t + (0.0 if p.copy else batch_time(len(p.batch), inside, slope))
             for p, t in zip(grid.points, synthetic_times(grid.points))]
    coef = fit_profile(grid.points, times, BLOCK_BYTES, TABLE)
    assert coef["per_batch_s"][2] == pytest.approx(inside[2], rel=1e-2)   # was 2.5e-3
    decode = fit_errors(grid.points, times, coef, BLOCK_BYTES)["decode"]
    assert decode["median_abs_rel_error"] < 1e-2


def test_batch_slope_is_the_upper_half_trend_and_never_negative():
    from kvsim.real_backend.profile_fit import batch_slope, batch_time
    assert batch_slope([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == pytest.approx(1.0)
    assert batch_slope([5.0, 4.0, 3.0, 2.0]) == 0.0
    assert batch_slope([2.0]) == 0.0
    assert batch_time(3, []) == 0.0
    assert batch_time(8, [1.0, 2.0], 0.5) == pytest.approx(5.0)


def test_grid_times_each_point_back_to_back_over_rounds():
    from kvsim.real_backend import profiling
    calls = []

    class FakeRunner:
        device = type("D", (), {"type": "cpu"})()

    grid = profiling.Grid([profiling.Point("decode", ((1, 3),)), profiling.Point("decode",
                                                                                ((1, 5),))],
                          repeats=3, warmup=2, rounds=2)
    orig = profiling.point_call
    profiling.point_call = lambda runner, p, rng: (lambda: calls.append(p.batch[0][1]))
    try:
        times, table = profiling.measure_grid(FakeRunner(), grid, "wall")
    finally:
        profiling.point_call = orig
    assert calls == [3] * 5 + [5] * 5 + [3] * 5 + [5] * 5      # warm-up + repeats, per round
    assert len(times) == 2 and table == []


def test_a_profile_records_the_head_layouts_and_validate_reuses_them():
    from kvsim.real_backend.session import BackendSettings, build_runner, prepare_device, warm_up
    settings = BackendSettings()
    model = prepare_device(settings)
    runner = build_runner(settings, model, 8)
    warm_up(runner, 4, {"1": True, "2": False})
    layouts = runner.model.cpu_head().layouts()
    assert layouts[1] is True and layouts[2] is False and set(layouts) == {1, 2, 3, 4}


def test_round_spread_says_how_much_the_passes_disagreed():
    from kvsim.real_backend.profiling import round_spread
    passes = [[1.0, 2.0, 4.0], [1.1, 2.0, 4.0], [1.0, 2.2, 3.0]]
    spread = round_spread(passes)
    # per point (max - min) / median: 10 %, 10 %, 25 %; the last pass took 6.2 s against 7
    assert spread == {"passes": 3, "median": pytest.approx(0.1),
                      "p90": pytest.approx(0.22), "drift": pytest.approx(6.2 / 7 - 1)}
    assert round_spread(passes[:1]) is None       # one pass cannot see drift


def test_profile_quality_names_its_source_fit_passes_and_age():
    from calendar import timegm
    from time import strptime

    from kvsim.real_backend.validate_profile import profile_quality
    profile = {"created": "2026-12-01T18:00:00Z", "grid": {"rounds": 3},
               "points": [{}] * 5, "round_spread": {"median": 0.02},
               "fit_error": {"prefill": {"median_abs_rel_error": 0.02, "max_abs_rel_error": 0.1},
                             "decode": {"median_abs_rel_error": 0.03, "max_abs_rel_error": 0.2},
                             "transfer": {"median_abs_rel_error": 0.3,
                                          "max_abs_rel_error": 0.9}}}
    now = timegm(strptime("2026-12-01T18:10:00Z", "%Y-%m-%dT%H:%M:%SZ"))
    assert profile_quality(profile, "file", now) == {
        "source": "file", "timing": "before", "between_steps": None, "points": 5,
        "passes": 3, "fit_median": 0.03, "fit_max": 0.2, "round_spread": {"median": 0.02},
        "age_s": 600.0}                                         # copies are not step time
    assert profile_quality({}, "quick grid")["age_s"] is None


def test_a_sliding_window_model_is_refused_before_the_backend_builds_it(tmp_path):
    config = dict(TINY.hf_config)
    config.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=128)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="has sliding-window or chunked attention layers"):
        resolve_backend_model(path)
    config["sliding_window"] = None                 # (every layer full: built as before)
    path.write_text(json.dumps(config))
    assert resolve_backend_model(path).spec.layer_kinds in ((), ("full",) * 2)
