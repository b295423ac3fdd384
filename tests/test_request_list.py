"""Requests given to kvsim.run as a Python list get a trace file's checks, one line each."""

import numpy as np
import pytest

import kvsim
from kvsim.errors import TraceError
from kvsim.workloads import Request


def req(request_id=0, arrival_s=0.0, prompt_tokens=100, output_tokens=10, **more):
    return Request(request_id=request_id, arrival_s=arrival_s, prompt_tokens=prompt_tokens,
                   output_tokens=output_tokens, **more)


#: (the requests are built in the test: a Request made at collection would outlive the
#: session, and test_sim_step_log checks that a finished run leaves none behind)
CASES = [
    (lambda: [req(0, 1.0), req(1, 0.0)], "requests[1]: field 'arrival_s': time goes backwards "
                                         "(0 after 1); sort the list by arrival_s"),
    (lambda: [req(arrival_s=-5.0)], "requests[0]: field 'arrival_s': must not be negative, got "
                                    "-5.0"),
    (lambda: [req(arrival_s=float("nan"))], "requests[0]: field 'arrival_s': must be a finite "
                                            "number"),
    (lambda: [req(prompt_tokens=0)], "requests[0]: field 'prompt_tokens': must be a positive "
                                     "number of tokens, got 0"),
    (lambda: [req(0), req(0, 0.1)], "requests[1]: field 'request_id': 0 is also the id of "
                                    "requests[0]"),
    (lambda: [req("a")], "requests[0]: field 'request_id': expected an integer, got a string "
                         "('a')"),
    (lambda: [{"prompt_tokens": 10, "output_tokens": 5}], "requests[0]: expected a "
                                                          "kvsim.workloads.Request, got dict"),
    (lambda: [req(prefix_hashes=np.arange(3), hash_block_size=16)],
     "requests[0]: field 'prefix_hashes': 3 ids for 100 prompt tokens; expected "
     "ceil(100/16) = 7"),
    (lambda: 5, "requests: expected a trace file, sample:NAME or a list of Request objects, got "
                "int"),
    (lambda: [], "requests: no requests: the list is empty"),
]


@pytest.mark.parametrize("trace, message", CASES)
def test_a_bad_request_list_is_one_line_naming_the_entry_and_field(trace, message):
    with pytest.raises(TraceError) as err:
        kvsim.run(trace())
    assert str(err.value).startswith(message)


def test_numpy_numbers_in_a_request_are_taken_as_pythons():
    request = req(np.int64(7), np.float64(0.5), np.int64(100), np.int32(10))
    result = kvsim.run([request])
    assert result.summary["num_completed"] == 1
    assert type(request.prompt_tokens) is int and type(request.request_id) is int


@pytest.mark.parametrize("slo, message", [
    ({"ttft_p98_s": 1, "ttft_p99_s": -1}, "field 'ttft_p99_s': must be a number of seconds > 0"),
    ({"ttfx_p99_s": 1}, "field 'ttfx_p99_s': expected ttft|tpot|e2e_pNN_s"),
    ({"tpot_p99_s": float("nan")}, "field 'tpot_p99_s': must be a number of seconds > 0"),
    ({"ttft_p150_s": 1}, "field 'ttft_p150_s': the percentile must be above 0 and at most 100"),
    ({"ttft_p98_s": 1}, "field 'ttft_p98_s': a target's percentile must be one a run's "
                        "summary holds"),
])
def test_slo_targets_given_to_the_api_are_checked_as_plans_are(slo, message):
    from kvsim.errors import ConfigError
    with pytest.raises(ConfigError, match=message.replace("|", r"\|")) as err:
        kvsim.run([req()], slo=slo)
    assert err.value.location == "kvsim.run"
    assert kvsim.run([req()], slo={"ttft_p90_s": np.float32(1)}).summary["slo"] == \
        {"ttft_p90_s": 1.0}


def test_continues_is_a_request_before_this_one_and_never_a_loop():
    parent = req(0)
    loop_a, loop_b = req(5), req(6)
    loop_a.continues, loop_b.continues = loop_b, loop_a
    for trace, message in (
            ([req(0, continues=5)], "requests[0]: field 'continues': must be a Request before "
                                    "this one"),
            ([parent, req(1, 1.0, prompt_tokens=20, continues=parent)],
             "requests[1]: field 'prompt_tokens': 20 is shorter than the request it continues: "
             "its prompt + output is 110 tokens"),
            ([req(0, prompt_tokens=300, continues=loop_a)],
             "requests[0]: field 'continues': leads back to a request already in its chain"),
            ([req(0, output_tokens=2, output_token_ids=np.array([1, 2, 3]))],
             "requests[0]: field 'output_token_ids': 3 ids for output_tokens 2")):
        with pytest.raises(TraceError) as err:
            kvsim.run(trace)
        assert str(err.value).startswith(message)
    outside = req(7)           # (a parent left out of the list: as a filtered trace's)
    assert kvsim.run([req(0, prompt_tokens=200, continues=outside)]).summary[
        "num_completed"] == 1


def test_the_api_refuses_an_option_the_run_would_ignore():
    from kvsim.errors import ConfigError
    with pytest.raises(ConfigError, match="field 'reserve': applies to --layout contiguous"):
        kvsim.run([req()], reserve="pow2")


def test_a_toml_config_names_the_trace_as_kvsim_run_config_reads_it(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"arrival_s": 0, "prompt_tokens": 10, '
                                      '"output_tokens": 5}\n' * 3)
    (tmp_path / "run.toml").write_text('trace = "t.jsonl"\nmax_num_seqs = 8\n')
    result = kvsim.run(config=tmp_path / "run.toml")
    assert result.summary["num_requests"] == 3
    assert result.summary["config"]["trace"] == str(tmp_path / "t.jsonl")
