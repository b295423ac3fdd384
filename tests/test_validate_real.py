"""kvsim validate-real: kvsim's prediction against a real vLLM run (bench JSON, timed oracle)."""

import json
from pathlib import Path

import pytest
from clirun import kvsim

from kvsim.errors import KvsimError
from kvsim.realrun import METRICS, oracle_steps, read_real_run

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm_timed" / "timed_chat.vllm.json"


def errors(rows):
    return {r["metric"]: r["error"] for r in rows}


def test_kvsim_against_its_own_bench_json_has_no_error(tmp_path):
    assert kvsim("run", "sample:azure-conv", "--model", "llama-2-7b", "--limit", "30",
                 "--bench-json", "--out", tmp_path, "-q").returncode == 0
    done = kvsim("validate-real", tmp_path / "bench.json", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["kind"] == "vllm bench serve" and result["settings"]["model"] == "llama-2-7b"
    assert [r["metric"] for r in result["before"]] == [m for m, _ in METRICS]
    assert all(abs(e) < 1e-9 for e in errors(result["before"]).values())
    import kvsim as api
    assert api.validate_real(tmp_path / "bench.json")["before"] == result["before"]


def test_fit_without_engine_steps_finds_the_speed_of_the_real_gpu(tmp_path):
    # the "real" run is kvsim on an A100; validated as if it had run on an H100
    assert kvsim("run", "sample:azure-conv", "--model", "llama-2-7b", "--limit", "30",
                 "--bench-json", "--out", tmp_path, "-q").returncode == 0
    done = kvsim("validate-real", tmp_path / "bench.json", "--gpu", "h100-80gb", "--fit",
                 tmp_path / "speed.json", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    before, after = errors(result["before"]), errors(result["after"])
    assert before["TPOT p50"] < -0.3                       # an H100 is faster
    assert after["TPOT p50"] == pytest.approx(0.0, abs=0.01)
    assert abs(after["E2E p50"]) < abs(before["E2E p50"]) / 4
    assert result["fitted_terms"]["speed_factor"] > 1.3
    profile = json.loads((tmp_path / "speed.json").read_text())
    assert profile["_speed_factor"] == result["fitted_terms"]["speed_factor"]


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    profile = tmp_path_factory.mktemp("fit") / "fit.json"
    done = kvsim("validate-real", FIXTURE, "--fit", profile, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), profile


def test_the_timed_oracle_run_before_and_after_fitting(oracle):
    result, _ = oracle
    assert result["kind"] == "vllm-oracle" and result["num_requests"] == 40
    assert result["settings"]["num_gpu_blocks"] == 256 and result["settings"]["block_size"] == 32
    assert result["deployment"].endswith("tiny-llama on 1 x a100-80gb (tp 1), bf16")
    before, after = errors(result["before"]), errors(result["after"])
    # kvsim's default A100 roofline is ~40x faster than vLLM's CPU build
    assert before["TPOT p50"] < -0.9 and before["E2E p50"] < -0.9
    # fitted to the oracle's 152 measured steps
    assert after["output throughput"] == pytest.approx(-0.019, abs=0.005)
    assert after["TPOT p50"] == pytest.approx(-0.114, abs=0.01)
    assert after["E2E p50"] == pytest.approx(-0.203, abs=0.01)
    assert after["TTFT p50"] == pytest.approx(-0.418, abs=0.01)   # prefill underestimated


def test_the_fitted_profile_drives_kvsim_run(oracle, tmp_path):
    result, profile = oracle
    fitted = json.loads(profile.read_text())
    assert fitted["kind"] == "fitted" and fitted["fitted"] == result["fitted_terms"]
    done = kvsim("run", FIXTURE.with_name("timed_chat.jsonl"), "--model",
                 result["settings"]["model"], "--block-size", "32", "--num-gpu-blocks", "256",
                 "--max-num-seqs", "16", "--max-num-batched-tokens", "512", "--profile",
                 profile, "--out", tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    real = read_real_run(FIXTURE)
    ours = json.loads(done.stdout)["throughput_output_tokens_per_s"]
    theirs = real.measured["output_tokens"].sum() / real.duration_s
    assert ours / theirs - 1 == pytest.approx(result["after"][0]["error"], abs=1e-9)


def test_step_features_restart_after_preemption_and_start_at_cached_tokens():
    data = {"requests": [{"index": 0, "num_cached_tokens": 32},
                         {"index": 1, "num_cached_tokens": 0}],
            "steps": [{"scheduled": {"0": 16, "1": 8}, "preempted": [], "wall_s": 0.1},
                      {"scheduled": {"0": 1}, "preempted": [1], "wall_s": 0.2},
                      {"scheduled": {"1": 9}, "preempted": [], "wall_s": 0.3}]}
    steps = oracle_steps(data, [])
    assert steps.to_dict("list") == {
        "seqs": [2, 1, 1], "tokens": [24, 1, 9],
        "kv_tokens": [48 + 8, 49, 9], "attn_units": [16 * 81 + 8 * 9, 1 * 98, 9 * 10],
        "wall_s": [0.1, 0.2, 0.3]}


def test_bad_results_are_one_line(tmp_path):
    (tmp_path / "x.json").write_text('{"completed": 3}')
    done = kvsim("validate-real", tmp_path / "x.json")
    assert done.returncode == 2
    assert done.stderr.startswith(f"kvsim: error: {tmp_path / 'x.json'}: neither a `vllm bench")
    lonely = tmp_path / "r.vllm.json"
    lonely.write_text(FIXTURE.read_text())
    done = kvsim("validate-real", lonely)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "field 'trace': a vllm-oracle result needs its input trace" in done.stderr


def test_an_oracle_replay_missing_a_field_names_it(tmp_path):
    data = json.loads(FIXTURE.read_text())
    del data["summary"]["wall_s"]
    broken = tmp_path / "r.vllm.json"
    broken.write_text(json.dumps(data))
    with pytest.raises(KvsimError) as e:
        read_real_run(broken, FIXTURE.with_name("timed_chat.jsonl"))
    assert str(e.value) == f"{broken}: field 'wall_s': missing from the result"


def test_an_oracle_replay_with_no_request_or_too_few_blocks_names_its_field(tmp_path):
    """Before: 'field output_tokens: missing' and 'field num_gpu_blocks: ... got -2', a
    field the file does not have and a value it does not hold."""
    trace, broken = FIXTURE.with_name("timed_chat.jsonl"), tmp_path / "r.vllm.json"
    for change, line in (
            (lambda d: d.update(requests=[]), "field 'requests': holds no request"),
            (lambda d: d["summary"]["settings"].update(num_blocks=-1),
             "field 'num_blocks': must be a whole number of at least 2 "
             "(block 0 is vLLM's null block), got -1")):
        data = json.loads(FIXTURE.read_text())
        change(data)
        broken.write_text(json.dumps(data))
        with pytest.raises(KvsimError) as e:
            read_real_run(broken, trace)
        assert str(e.value) == f"{broken}: {line}"


@pytest.mark.parametrize("field, value, words", [
    ("ttft_s", -5, "is -5; expected a time in seconds >= 0"),
    ("output_tokens", -3, "is -3; expected a whole number >= 1"),
    ("num_cached_tokens", None, "is null; expected a whole number >= 0"),
    ("index", "a", 'is "a"; expected a whole number >= 0 (the request\'s line)'),
    ("e2e_s", 0.0, "is 0.0, before the first token"),
])
def test_a_bad_request_of_an_oracle_replay_is_named_with_its_field(tmp_path, field, value,
                                                                   words):
    data = json.loads(FIXTURE.read_text())
    data["requests"][3][field] = value
    broken = tmp_path / "r.vllm.json"
    broken.write_text(json.dumps(data))
    with pytest.raises(KvsimError) as e:
        read_real_run(broken, FIXTURE.with_name("timed_chat.jsonl"))
    assert str(e.value).startswith(f"{broken}: field 'requests[3].{field}': {words}")


def test_the_trace_of_an_oracle_replay_may_come_on_stdin(tmp_path):
    import subprocess
    import sys
    trace = FIXTURE.with_name("timed_chat.jsonl")
    by_stdin = subprocess.run([sys.executable, "-m", "kvsim", "validate-real", str(FIXTURE),
                               "--trace", "-", "--json"], stdin=trace.open(),
                              capture_output=True, text=True, timeout=300)
    by_path = kvsim("validate-real", FIXTURE, "--trace", trace, "--json")
    assert by_stdin.returncode == by_path.returncode == 0, by_stdin.stderr
    assert json.loads(by_stdin.stdout)["before"] == json.loads(by_path.stdout)["before"]


def test_a_replay_that_rejects_requests_prints_no_python_warning(tmp_path):
    """kvsim.run warns Python callers of rejected requests; validate-real's table is where a
    replay shows them, so its stderr stays clean (it printed a KvsimWarning with a source
    line)."""
    data = json.loads(FIXTURE.read_text())
    data["summary"]["settings"]["max_model_len"] = 300
    short = tmp_path / "short.vllm.json"
    short.write_text(json.dumps(data))
    done = kvsim("validate-real", short, "--trace", FIXTURE.with_name("timed_chat.jsonl"))
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr and done.stderr == ""
    assert kvsim("run", "sample:azure-conv", "--model", "llama-2-7b", "--limit", "30",
                 "--bench-json", "--out", tmp_path / "b", "-q").returncode == 0
    fitted = kvsim("validate-real", tmp_path / "b" / "bench.json", "--num-gpu-blocks", "40",
                   "--fit", tmp_path / "speed.json")      # (the speed fit's runs too)
    assert fitted.returncode == 0 and fitted.stderr == "", fitted.stderr


def test_the_fit_keeps_every_term_non_negative():
    import numpy as np
    from kvsim.realrun import nonnegative_lstsq
    x = np.arange(10.0)
    X = np.column_stack([np.ones(10), x, x ** 2])
    y = 2 + 3 * x - 0.01 * x ** 2               # a negative square term is not allowed
    coef = nonnegative_lstsq(X, y)
    assert coef[2] == 0.0 and (coef >= 0).all()
    assert coef[:2] == pytest.approx(np.linalg.lstsq(X[:, :2], y, rcond=None)[0])
    assert nonnegative_lstsq(X, 2 + 3 * x) == pytest.approx([2, 3, 0], abs=1e-9)


def vllm_result(tmp_path, **changes) -> Path:
    """A small `vllm bench serve --save-result --save-detailed` file: two completed requests
    and two failed ones as vLLM records them (output_len 0, ttft 0, no gaps), one with an
    error message and one without (an HTTP error with no reason)."""
    data = {"duration": 2.0, "completed": 2, "failed": 2, "input_lens": [12, 30, 7, 9],
            "output_lens": [3, 0, 2, 0], "ttfts": [0.05, 0.0, 0.04, 0.0],
            "itls": [[0.01, 0.02], [], [0.03], []], "start_times": [100.0, 100.5, 101.0, 101.2],
            "errors": ["", "Bad Request", "", ""]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**data, **changes}))
    return path


def test_failed_requests_of_a_vllm_result_are_left_out(tmp_path):
    real = read_real_run(vllm_result(tmp_path))
    assert [r.prompt_tokens for r in real.requests] == [12, 30, 7, 9]
    assert real.measured["request_id"].tolist() == [0, 2]
    assert real.measured["e2e_s"].tolist() == pytest.approx([0.08, 0.07])


@pytest.mark.parametrize("changes, message", [
    ({"input_lens": [-5, 30, 7, 9]},
     "field 'input_lens': entry 0 is -5; expected a whole number >= 1"),
    ({"input_lens": [12, 2.5, 7, 9]},
     "field 'input_lens': entry 1 is 2.5; expected a whole number >= 1"),
    ({"ttfts": [float("nan"), 0.0, 0.04, 0.0]},
     "field 'ttfts': entry 0 is NaN; expected a time in seconds >= 0"),
    ({"ttfts": [0.05, 0.0, -0.5, 0.0]},
     "field 'ttfts': entry 2 is -0.5; expected a time in seconds >= 0"),
    ({"output_lens": [0, 0, 2, 0]}, "field 'output_lens': entry 0 is 0; expected a whole number "
                                    ">= 1 (the request has no error and a first token)"),
    ({"itls": [[0.01, float("inf")], [], [0.03], []]},
     "field 'itls': entry 0 holds Infinity; expected a list of times in seconds >= 0"),
    ({"ttfts": [0.05, 0.0, 0.04]},
     "field 'ttfts': has 3 entries for 4 requests (input_lens); expected one per request"),
    ({"completed": 3}, "field 'input_lens': has 4 entries; expected one per request "
                       "(3 completed + 2 failed)"),
    ({"errors": ["", 7, "", ""]},
     "field 'errors': entry 1 is 7; expected a string (empty for a success)"),
    ({"start_times": "soon"},
     "field 'start_times': is \"soon\"; expected a list with one entry per request"),
    ({"duration": 0}, "field 'duration': is 0; expected the run's length in seconds > 0"),
])
def test_bad_per_request_lists_name_the_field_and_the_entry(tmp_path, changes, message):
    path = vllm_result(tmp_path, **changes)
    with pytest.raises(KvsimError) as e:
        read_real_run(path)
    assert str(e.value) == f"{path}: {message}"


def test_a_bad_vllm_result_is_one_line_and_writes_nothing(tmp_path):
    path = vllm_result(tmp_path, input_lens=[-5, 30, 7, 9])
    done = kvsim("validate-real", path, "--fit", tmp_path / "fit.json")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"kvsim: error: {path}: field 'input_lens': entry 0 is -5; "
                           "expected a whole number >= 1\n")
    assert not (tmp_path / "fit.json").exists()


def test_a_fit_file_that_cannot_be_written_is_refused_before_the_replay(tmp_path):
    timed = Path(__file__).parent / "fixtures" / "vllm_timed" / "timed_chat.vllm.json"
    (tmp_path / "afile").write_text("x")
    for target, why in ((tmp_path, "is a directory; give a file to write"),
                        (tmp_path / "afile" / "p.json",
                         f"cannot create it: {tmp_path}/afile is not a directory")):
        done = kvsim("validate-real", str(timed), "--fit", str(target))
        assert (done.returncode, done.stdout) == (2, "")      # (no table: nothing replayed)
        assert done.stderr == f"kvsim: error: {target}: field 'fit': {why}\n"


def test_a_bad_override_is_the_command_lines_not_an_api_call():
    done = kvsim("validate-real", FIXTURE, "--tp", "0")
    assert done.returncode == 2
    assert done.stderr == "kvsim: error: --tp: must be at least 1, got 0\n"


def test_a_result_whose_model_kvsim_does_not_know_needs_model(tmp_path):
    """`vllm bench serve --model /models/Llama-2-7b-hf` writes that path as ``model_id``:
    kvsim refuses to guess the model rather than replay another one; --model settles it."""
    path = vllm_result(tmp_path, model_id="/models/Llama-2-7b-hf")
    done = kvsim("validate-real", path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"kvsim: error: {path}: field 'model_id': '/models/Llama-2-7b-hf' is not a model kvsim "
        "knows (catalog, local Hugging Face cache or a config.json path); pass --model with "
        "the model that ran (`kvsim models` lists the catalog)\n")
    done = kvsim("validate-real", path, "--model", "llama-2-7b")
    assert done.returncode == 0 and "llama-2-7b on 1 x" in done.stdout


def test_a_python_caller_is_told_to_name_the_model_in_its_settings(tmp_path):
    import kvsim
    path = vllm_result(tmp_path, model_id="/models/Llama-2-7b-hf")
    with pytest.raises(kvsim.ConfigError, match=r'pass settings=\{"model": \.\.\.\} with'):
        kvsim.validate_real(path)
    assert kvsim.validate_real(path, settings={"model": "llama-2-7b"})["before"]


def test_a_result_without_model_id_needs_model(tmp_path):
    path = vllm_result(tmp_path)
    done = kvsim("validate-real", path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"kvsim: error: {path}: field 'model_id': missing or empty: kvsim "
                           "cannot tell which model ran; pass --model (a catalog name, a "
                           "Hugging Face id or a config.json)\n")


@pytest.mark.parametrize("traffic, starts", [
    ({"request_rate": "inf", "max_concurrency": None}, [0.0] * 4),
    ({}, [0.0] * 4),             # (a result of a vLLM too old to write either)
    ({"request_rate": 3.5, "max_concurrency": None}, None),
    ({"request_rate": "inf", "max_concurrency": 2}, None),
    ({"request_rate": "inf", "max_concurrency": None, "ramp_up_strategy": "linear"}, None),
])
def test_a_result_without_start_times_replays_only_requests_sent_at_once(
        tmp_path, traffic, starts):
    data = json.loads(vllm_result(tmp_path).read_text())
    del data["start_times"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({**data, **traffic}))
    if starts is not None:
        assert [r.arrival_s for r in read_real_run(path).requests] == starts
        return
    with pytest.raises(KvsimError) as e:
        read_real_run(path)
    rate = json.dumps(traffic["request_rate"])
    ramp = (f", ramp_up_strategy {json.dumps(traffic['ramp_up_strategy'])}"
            if "ramp_up_strategy" in traffic else "")
    assert str(e.value) == (
        f"{path}: field 'start_times': missing, and the requests were not all sent at once "
        f"(request_rate {rate}, max_concurrency {json.dumps(traffic['max_concurrency'])}"
        f"{ramp}): their arrival times are unknown, so they cannot be replayed; pass --trace "
        "with the requests and their arrival times")
