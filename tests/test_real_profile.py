"""`kvsim profile`: the grid spans the operating range, the fit recovers known coefficients,
and the written profile drives the cost model (also through `kvsim run --profile`)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

from kvsim.cache.step_plan import COMPACT, SWAP_OUT, BlockTransfer, ScheduledRequest, StepPlan  # noqa: E402,E501
from kvsim.errors import ConfigError  # noqa: E402
from kvsim.real_backend.models import resolve_backend_model  # noqa: E402
from kvsim.real_backend.profiling import (  # noqa: E402
    Limits, default_grid, fit_errors, fit_profile, predict,
)
from kvsim.sim.cost_model import CostModel  # noqa: E402
from kvsim.sim.profile import FITTED_TERMS, MODEL_SHAPE_KEYS  # noqa: E402

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


def test_fitted_profile_refuses_another_model():
    with pytest.raises(ConfigError, match="fitted profile"):
        CostModel("llama-2-7b", "a100-80gb", profile=fitted_profile(step_s=0.01))


def kvsim(*args):
    return subprocess.run([sys.executable, "-m", "kvsim.cli", *args], capture_output=True,
                          text=True, timeout=300)


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
    from kvsim.real_backend.profiling import nnls_small
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    coef = nnls_small(x, np.array([3.0, 2.0, 1.0]))   # slope -1 unconstrained
    assert coef[1] == 0.0 and coef[0] == pytest.approx(2.0)
