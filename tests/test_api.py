"""The Python API (docs/api.md): same numbers as the command line, checked up front, no files
unless asked."""

import copy
import json
import pickle
import re
import subprocess
import sys
from pathlib import Path
from unittest.mock import ANY

import numpy as np
import pandas as pd
import pytest
from clirun import kvsim as kvsim_cli

import kvsim
from kvsim.workloads import Request

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"
AZURE = dict(model="llama-2-7b", limit=30, max_num_seqs=16)
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm_timed" / "timed_chat.vllm.json"


def test_the_worked_example_in_docs_api_md_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], str(DOC), "exec"), {"__name__": "docs_api"})
    out = capsys.readouterr().out
    assert "kvsim.run: field 'max_num_seq': unknown setting (did you mean 'max_num_seqs'" in out
    assert list(tmp_path.iterdir()) == []                 # wrote only in its temp directory


def test_import_kvsim_imports_no_simulator():
    code = ("import sys, kvsim; heavy = [m for m in ('pandas', 'numpy', 'simpy', 'plotly', "
            "'pydantic') if m in sys.modules]; print(heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stderr


def test_a_run_leaves_the_callers_random_state_and_loads_no_terminal_or_plot_library():
    """A seeded ``random`` stays as the caller left it (rich draws from it when imported);
    nothing to print or plot is loaded until asked for."""
    code = ("import random, sys, kvsim; random.seed(1); before = random.getstate(); "
            "kvsim.run('sample:azure-conv', limit=5); "
            "print(random.getstate() == before, [m for m in ('rich', 'plotly') "
            "if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "True []", done.stderr


@pytest.fixture(scope="module")
def result():
    return kvsim.run("sample:azure-conv", **AZURE)


def test_run_equals_kvsim_run(result, tmp_path):
    done = kvsim_cli("run", "sample:azure-conv", "--model", "llama-2-7b", "--limit", "30",
                     "--max-num-seqs", "16", "--out", tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    cli = json.loads(done.stdout)
    ours = json.loads(json.dumps(result.summary, default=float))
    for summary in (cli, ours):
        summary.pop("wall_time_s")
    assert ours == cli
    csv = pd.read_csv(tmp_path / "requests.csv")
    pd.testing.assert_frame_equal(result.requests.drop(columns="finish_reason"),
                                  csv.drop(columns="finish_reason"), check_dtype=False)


def test_result_frames(result):
    assert len(result.requests) == 30 and result.steps is None
    assert result.timeline["num_steps"].sum() == result.summary["num_steps"]
    assert len(result.timeline) <= 2000 and result.config.max_num_seqs == 16
    assert repr(result).startswith("<kvsim.Result sample:azure-conv on llama-2-7b: 30/30")


def test_keep_steps_returns_every_engine_step(result):
    kept = kvsim.run("sample:azure-conv", keep_steps=True, **AZURE)
    assert len(kept.steps) == kept.summary["num_steps"] == result.summary["num_steps"]
    assert kept.steps["output_tokens"].sum() == kept.requests["generated_tokens"].sum()
    assert {k: v for k, v in kept.summary.items() if k != "wall_time_s"} == \
        {k: v for k, v in result.summary.items() if k != "wall_time_s"}


@pytest.mark.parametrize("settings, message", [
    (dict(max_num_seq=3), "kvsim.run: field 'max_num_seq': unknown setting (did you mean "),
    (dict(block_size="16"), "kvsim.run: field 'block_size': expected an integer, got '16'"),
    (dict(gpu_memory_utilization=1.5), "kvsim.run: field 'gpu_memory_utilization': must be "
     "at most 1.0, got 1.5"),
    (dict(model="nope"), "kvsim.run: field 'model': unknown model 'nope'"),
    (dict(tp=3), "kvsim.run: field 'tp': llama-3.1-8b has 32 attention heads, which do not "
     "divide over 3 GPUs (vLLM refuses this)"),
    (dict(limit=0), "kvsim.run: field 'limit': must be a positive integer, got 0"),
    (dict(start=float("nan")), "kvsim.run: field 'start': must be a finite number of "
     "seconds >= 0 (from the first arrival), got nan"),
    (dict(start=-1), "kvsim.run: field 'start': must be a finite number of seconds >= 0"),
    (dict(trace_model=5), "kvsim.run: field 'trace_model': expected a model name, got 5"),
    (dict(config=5), "kvsim.run: field 'config': expected a file name or path, got 5"),
])
def test_bad_settings_fail_before_any_work_in_one_line(settings, message, monkeypatch):
    import kvsim.sim.serving.runner as runner
    monkeypatch.setattr(runner, "simulate", lambda *a, **k: pytest.fail("simulated"))
    with pytest.raises(ValueError) as info:
        kvsim.run("sample:azure-conv", **settings)
    assert isinstance(info.value, kvsim.KvsimError)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_numpy_numbers_and_arrays_are_taken_as_python_ones(monkeypatch):
    np = pytest.importorskip("numpy")
    seen = []
    import kvsim.sim.serving.runner as runner
    monkeypatch.setattr(runner, "simulate", lambda requests, config, **k: seen.append(
        (config, k["trace_options"])) or pytest.skip("checked"))
    with pytest.raises(pytest.skip.Exception):
        kvsim.run("sample:azure-conv", max_num_seqs=np.int64(64), seed=np.int32(3),
                  enable_prefix_caching=np.False_, rate_scale=np.float32(2.0),
                  start=np.int64(1), limit=np.int64(20))
    config, options = seen[0]
    assert (config.max_num_seqs, config.seed, config.enable_prefix_caching) == (64, 3, False)
    assert (options.rate_scale, options.start_s, options.limit) == (2.0, 1.0, 20)
    assert type(options.start_s) is float        # (summary.json: 1.0 as the CLI writes it)
    from kvsim.api import plain
    assert plain(np.array(16)) == 16 and type(plain(np.array(16))) is int       # 0-d
    assert plain(pd.Series([16, 32])) == [16, 32] and plain(pd.Index([1, 2])) == [1, 2]
    assert plain((np.float32(1.5), range(2))) == (1.5, [0, 1]) and plain("16") == "16"


@pytest.mark.parametrize("call, message", [
    (lambda: kvsim.compare("sample:azure-conv", eviction=["lru", "lfu"], workers="2"),
     "kvsim.compare: field 'workers': expected an integer >= 1, got '2'"),
    (lambda: kvsim.compare("sample:azure-conv", eviction=["lru", "lfu"], workers=True),
     "kvsim.compare: field 'workers': expected an integer >= 1, got True"),
    (lambda: kvsim.plan("sample:azure-conv", slo={"ttft_p99_s": 2}, max_replicas="4"),
     "kvsim.plan: field 'max_replicas': expected an integer >= 1, got '4'"),
    (lambda: kvsim.plan("sample:azure-conv", slo={"ttft_p99_s": 2}, rate_iterations="x"),
     "kvsim.plan: field 'rate_iterations': expected an integer >= 0, got 'x'"),
    (lambda: kvsim.plan("sample:azure-conv", slo={"ttft_p99_s": 2}, target_rate="5"),
     "kvsim.plan: field 'target_rate': expected a number > 0, got '5'"),
    (lambda: kvsim.load_trace(5),
     "kvsim.load_trace: field 'trace': expected a file name or path, got 5"),
    (lambda: kvsim.plan("sample:azure-conv", slo={"ttft_p99_s": -1}),
     "kvsim.plan: field 'ttft_p99_s': must be a number of seconds > 0, got -1"),
    (lambda: kvsim.compare("sample:azure-conv", block_size=[16, "x"]),
     "kvsim.compare: field 'block_size': expected an integer, got 'x'"),
    (lambda: kvsim.hitrate("sample:azure-conv"),
     "kvsim.hitrate: field 'capacity': give exactly one of capacity (blocks) and "
     "capacity_tokens")])
def test_arguments_of_the_wrong_type_are_named_not_tracebacks(call, message):
    with pytest.raises(kvsim.ConfigError) as info:
        call()
    assert str(info.value) == message


def test_load_trace_and_run_a_filtered_list(tmp_path):
    trace = kvsim.load_trace("sample:azure-conv", limit=30)
    assert repr(trace) == "<kvsim.Trace sample:azure-conv: 30 requests>"
    frame = trace.to_frame()
    assert list(frame.columns) == ["request_id", "trace_line", "arrival_s", "prompt_tokens",
                                   "output_tokens", "priority"]
    assert frame["trace_line"].tolist()[:3] == [2, 3, 4]       # (line 1: the CSV's header)
    short = [r for r in trace if r.prompt_tokens < 1000]
    r = kvsim.run(short, model="llama-2-7b")
    assert r.requests["trace_line"].tolist() == [x.trace_line for x in short]
    assert r.summary["num_requests"] == len(short) == (frame["prompt_tokens"] < 1000).sum()
    assert r.summary["config"]["trace"] == "python"
    with pytest.raises(kvsim.ConfigError, match="field 'limit': trace options apply to a trace"):
        kvsim.run(short, limit=3)


def test_write_and_report_write_only_when_asked(result, tmp_path):
    written = result.write(tmp_path / "run", html=False)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "requests.csv", "summary.json", "timeline.csv"]
    assert set(written) == {"requests", "timeline", "summary"}
    assert result.report(tmp_path / "r.html").stat().st_size > 10_000
    bench = result.bench(detailed=False)
    assert "ttfts" not in bench and bench["completed"] == 30


def test_flags_take_true_or_false_and_slo_percentiles_the_summary_holds(result, tmp_path):
    with pytest.raises(kvsim.ConfigError, match="field 'keep_steps': expected True or False"):
        kvsim.run("sample:azure-conv", limit=5, keep_steps="yes")
    with pytest.raises(kvsim.TraceError, match="field 'sort': expected True or False, got 'x"):
        kvsim.run("sample:azure-conv", limit=5, sort="x")
    with pytest.raises(kvsim.ConfigError, match="^Result.write: field 'html': expected True"):
        result.write(tmp_path / "w", html="no")
    assert not (tmp_path / "w").exists()
    with pytest.raises(kvsim.ConfigError, match="field 'ttft_p98_s': a target's percentile "
                                                r"must be one a run's summary holds \(p50, "):
        kvsim.run("sample:azure-conv", limit=5, slo={"ttft_p98_s": 1.0})
    with pytest.raises(kvsim.ConfigError, match="^kvsim.plan: field 'burst': expected True"):
        kvsim.plan("sample:azure-conv", slo={"ttft_p99_s": 5}, burst="yes")


def test_write_errors_name_the_python_argument_not_the_cli_option(result, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    with pytest.raises(kvsim.KvsimError) as e:
        result.write(a_file)
    assert str(e.value) == (f"{a_file}: field 'out_dir': exists and is not a directory; "
                            "out_dir needs a directory")
    with pytest.raises(kvsim.KvsimError, match="^out_dir: is empty; out_dir needs a dir"):
        result.write("")
    assert a_file.read_text() == "mine"


def test_rejected_requests_are_a_warning_in_python_names():
    """The command line says so before the run; a Python caller gets a KvsimWarning after it,
    with the advice in the settings' Python names. A run rejecting nothing warns of nothing."""
    with pytest.warns(kvsim.KvsimWarning) as caught:
        r = kvsim.run("sample:mooncake", model="llama-2-7b", limit=20)
    assert r.summary["num_rejected"] == 17
    assert [str(w.message) for w in caught] == [
        "kvsim.run: rejected 17 of 20 requests: prompt of max_model_len 4,096 tokens or more "
        "(that is the model's own context: pass long_prompt=\"truncate\", choose a model with "
        "a longer one, or raise max_model_len past it, which vLLM allows with "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"]
    assert caught[0].filename == __file__


def test_a_comparison_warns_of_each_configuration_that_rejected_requests():
    with pytest.warns(kvsim.KvsimWarning) as caught:
        kvsim.compare("sample:mooncake", model="llama-2-7b", limit=20,
                      eviction=["lru", "lfu"])
    assert [str(w.message)[:52] for w in caught] == [
        "kvsim.compare (eviction=lru): rejected 17 of 20 requ",
        "kvsim.compare (eviction=lfu): rejected 17 of 20 requ"]
    assert caught[0].filename == __file__


def test_truncating_leaves_the_callers_requests_as_they_were(tmp_path):
    """long_prompt="truncate" cuts requests as they arrive: a list given in Python is copied
    first (it cut the caller's objects, so the next run of the same list saw them cut), and
    the run equals the file's, continued turns included."""
    assert kvsim_cli("gen", "chat", "-n", "60", "--seed", "1", "--out",
                     tmp_path / "chat.jsonl").returncode == 0
    trace = kvsim.load_trace(tmp_path / "chat.jsonl")
    lengths = [(r.prompt_tokens, r.output_tokens) for r in trace]
    cut = kvsim.run(trace, model="llama-2-7b", max_model_len=1024, long_prompt="truncate")
    assert cut.summary["num_truncated"] > 0 and sum(r.continues is not None for r in trace)
    assert [(r.prompt_tokens, r.output_tokens) for r in trace] == lengths
    from_file = kvsim.run(tmp_path / "chat.jsonl", model="llama-2-7b", max_model_len=1024,
                          long_prompt="truncate")
    assert cut.requests.equals(from_file.requests)


def test_a_bad_output_format_leaves_the_earlier_result_whole(result, tmp_path):
    result.write(tmp_path / "run", html=False)
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    for bad in ("json", "CSV"):
        with pytest.raises(kvsim.ConfigError, match="^Result.write: field 'output_format': "
                                                    f"expected one of csv, parquet, got '{bad}'"):
            result.write(tmp_path / "run", output_format=bad)
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before


def test_a_toml_config_sits_under_the_keywords(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('model = "llama-2-7b"\nmax_num_seqs = 8\nblock_size = 32\n')
    r = kvsim.run("sample:azure-conv", config=toml, limit=10, max_num_seqs=4)
    assert (r.config.model, r.config.max_num_seqs, r.config.block_size) == (
        "llama-2-7b", 4, 32)


def test_compare_equals_kvsim_compare_and_flags_identical_runs(tmp_path):
    grid = kvsim.compare("sample:azure-conv", model="llama-2-7b", limit=20,
                         eviction=["lru", "lfu"], max_num_seqs=[4, 64])
    assert grid.labels == ["eviction=lru max_num_seqs=4", "eviction=lru max_num_seqs=64",
                           "eviction=lfu max_num_seqs=4", "eviction=lfu max_num_seqs=64"]
    assert grid.table["identical_to"].tolist() == [
        "", "", "eviction=lru max_num_seqs=4", "eviction=lru max_num_seqs=64"]
    written = grid.write(tmp_path / "api")
    done = kvsim_cli("compare", "sample:azure-conv", "--model", "llama-2-7b", "--limit", "20",
                     "--eviction", "lru,lfu", "--max-num-seqs", "4,64", "--out",
                     tmp_path / "cli", "--json")
    assert done.returncode == 0, done.stderr
    cli = json.loads(done.stdout)
    for ours, theirs in zip(written["runs"], cli["runs"]):
        assert ours["dir"] == theirs["dir"] and ours["identical_to"] == theirs["identical_to"]
        assert ours["metrics"] == theirs["metrics"]


def test_the_trace_a_config_names_is_read_whatever_the_config_is(tmp_path):
    """A TOML file, a dict and a Result's RunConfig each name their trace, as
    ``kvsim run --config`` reads it; compare reads it too. A run of requests given in Python
    has no file to name: reusing its config says so."""
    toml = tmp_path / "run.toml"
    toml.write_text('trace = "sample:azure-conv"\nmodel = "llama-2-7b"\n')
    first = kvsim.run("sample:azure-conv", model="llama-2-7b", limit=8)
    for config in (toml, {"trace": "sample:azure-conv", "model": "llama-2-7b"}, first.config):
        assert kvsim.run(config=config, limit=8).summary == first.summary | {
            "wall_time_s": ANY}
    grid = kvsim.compare(config=first.config, limit=8, eviction=["lru", "lfu"])
    assert grid.runs[0].summary == first.summary | {"wall_time_s": ANY}
    python = kvsim.run(kvsim.load_trace("sample:azure-conv", limit=8)[:4], model="llama-2-7b")
    with pytest.raises(kvsim.ConfigError, match="^kvsim.run: field 'trace': the config's trace "
                                                "stands for requests given in Python"):
        kvsim.run(config=python.config)


def test_a_trace_edited_in_python_is_requests_not_its_file():
    """``kvsim.run`` simulates the edited list (labelled python); compare and plan, which read
    the trace again in every run, refuse it rather than read what the file holds."""
    trace = kvsim.load_trace("sample:azure-conv", limit=12)
    assert trace.is_as_read and kvsim.run(trace).config.trace == "sample:azure-conv"
    hashed = kvsim.load_trace("sample:mooncake", limit=12)      # (requests holding arrays)
    copied = pickle.loads(pickle.dumps(hashed))
    assert copied.is_as_read and copy.deepcopy(hashed).is_as_read      # (copies: not edits)
    trace[0].output_tokens += 1         # a field set anew is an edit too
    assert not trace.is_as_read
    trace[0].output_tokens -= 1
    assert trace.is_as_read
    del trace[5:]
    assert not trace.is_as_read
    r = kvsim.run(trace)
    assert (r.config.trace, r.summary["num_requests"]) == ("python", 5)
    with pytest.raises(kvsim.ConfigError, match="^kvsim.compare: field 'trace': the Trace was "
                                                "changed after kvsim.load_trace read it"):
        kvsim.compare(trace, eviction=["lru", "lfu"])
    with pytest.raises(kvsim.ConfigError, match="^kvsim.plan: field 'trace': the Trace was"):
        kvsim.plan(trace, slo={"ttft_p99_s": 2}, burst=True)


def test_compare_checks_every_configuration_first(monkeypatch):
    with pytest.raises(kvsim.ConfigError, match="field 'evicton': unknown setting"):
        kvsim.compare("sample:azure-conv", evicton=["lru", "lfu"])
    with pytest.raises(kvsim.ConfigError, match="field 'layout': a host tier needs"):
        kvsim.compare("sample:azure-conv", layout=["paged", "contiguous"],
                      num_cpu_blocks=100)


@pytest.mark.parametrize("call, message", [
    (lambda r: r.bench(detailed="no"),
     "^Result.bench: field 'detailed': expected True or False, got 'no'"),
    (lambda r: kvsim.plan("sample:azure-conv", slo={"ttft_p99_s": 2}, price_table=5),
     "^kvsim.plan: field 'price_table': "),
    (lambda r: kvsim.hitrate("sample:azure-conv", capacity=1000.0, limit=5),
     "field 'capacity'"),
    (lambda r: kvsim.validate_real(FIXTURE, settings=[1]),
     "^kvsim.validate_real: field 'settings': expected a dict of settings, got list"),
    (lambda r: kvsim.validate_real(FIXTURE, fit=5), "^kvsim.validate_real: field 'fit': "),
    (lambda r: kvsim.validate_real(FIXTURE, trace=5), "^kvsim.validate_real: field 'trace': "),
], ids=["bench-detailed", "plan-price-table", "hitrate-capacity", "validate-settings",
        "validate-fit", "validate-trace"])
def test_a_bad_argument_is_a_config_error_naming_it(result, call, message):
    with pytest.raises(kvsim.ConfigError, match=message):
        call(result)


def test_reprs_are_short_and_say_what_they_hold(result):
    first = Request(0, 0.0, 10, 5)
    turn = Request(1, 1.5, 20, 5, prefix_hashes=np.arange(3), hash_block_size=16,
                   session_id="s", continues=first)
    assert repr(turn) == ("Request(request_id=1, arrival_s=1.5, prompt_tokens=20, "
                          "output_tokens=5, session_id='s', prefix_hashes=<3 ids per 16 "
                          "tokens>, continues=<request 0>)")
    assert re.fullmatch(r"<kvsim.Result sample:azure-conv on llama-2-7b: 30/30 requests, "
                        r"[\d.]+ output tok/s, TTFT p50 [\d.]+ ms>", repr(result))
    curves = kvsim.hitrate("sample:mooncake", capacity=[100, 1000], eviction=["lru", "lfu"],
                           limit=20)
    assert repr(curves) == ("<kvsim.HitRates sample:mooncake: 2 policies (lru, lfu) x 2 "
                            "capacities>")


def test_hitrate_checks_requests_given_in_python_as_run_does():
    trace = kvsim.load_trace("sample:azure-conv", limit=10)
    with pytest.raises(kvsim.ConfigError, match="^kvsim.hitrate: field 'limit': trace "
                                                "options apply to a trace file"):
        kvsim.hitrate(trace, capacity=[100], limit=3)
    with pytest.raises(kvsim.TraceError, match="^requests: no requests: the list is empty"):
        kvsim.hitrate([], capacity=[100])
    with pytest.raises(kvsim.TraceError, match="^requests\\[0\\]: expected a kvsim.workloads"
                                               ".Request, got int"):
        kvsim.hitrate([1, 2], capacity=[100])
    twice = [Request(0, 0.0, 32, 4), Request(0, 0.5, 32, 4)]
    with pytest.raises(kvsim.TraceError, match="^requests\\[1\\]: field 'request_id': 0 is "
                                               "also the id of requests\\[0\\]"):
        kvsim.hitrate(twice, capacity=[100])
    assert kvsim.hitrate(iter(trace), capacity=[100]).result == kvsim.hitrate(
        trace, capacity=[100]).result | {"trace": "python"}


def test_hitrate_equals_kvsim_hitrate():
    ours = kvsim.hitrate("sample:mooncake", capacity=[100, 1000], eviction=["lru", "lfu"],
                         limit=100)
    done = kvsim_cli("hitrate", "sample:mooncake", "--capacity", "100,1000", "--eviction",
                     "lru,lfu", "--limit", "100", "--json")
    assert done.returncode == 0, done.stderr
    assert ours.result == json.loads(done.stdout)
    assert list(ours.table["policy"]) == ["lru", "lru", "lfu", "lfu"]
    every = kvsim.hitrate("sample:mooncake", capacity=300, limit=40, lookahead_s=5)
    done = kvsim_cli("hitrate", "sample:mooncake", "--capacity", "300", "--limit", "40",
                     "--lookahead-s", "5", "--json")
    assert every.result == json.loads(done.stdout)
    assert list(every.table["policy"]) == ["lru", "lfu", "priority", "hybrid", "arc", "s3fifo",
                                           "lookahead", "belady"]
    with pytest.raises(kvsim.ConfigError, match="^kvsim.hitrate: field 'model': not a "):
        kvsim.hitrate("sample:mooncake", capacity=300, model="llama-2-7b")


def test_hitrate_write_is_the_cli_files_and_refuses_a_file(tmp_path):
    rates = kvsim.hitrate("sample:mooncake", capacity=[100], limit=20)
    written = rates.write(tmp_path / "new" / "dir")
    assert sorted(written) == ["json", "report"]
    assert json.loads(written["json"].read_text()) == rates.result
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    with pytest.raises(kvsim.KvsimError, match="field 'out_dir': exists and is not a dir"):
        rates.write(a_file)


def test_plan_ranks_candidates_and_checks_its_targets(tmp_path):
    p = kvsim.plan("sample:azure-conv", slo={"ttft_p99_s": 5}, limit=30, model="llama-2-7b",
                   gpu=["a100-80gb", "h100-80gb"], max_replicas=2, rate_iterations=1,
                   burst=True)
    assert p.recommended is not None and list(p.table["rank"]) == [1, 2]
    assert sorted(p.write(tmp_path)) == ["csv", "plan", "report"]
    with pytest.raises(kvsim.ConfigError, match="field 'ttft_p95_s': SLO targets are some of"):
        kvsim.plan("sample:azure-conv", slo={"ttft_p95_s": 5})
    with pytest.raises(kvsim.ConfigError, match=r"field 'gpus': not a plan setting \(did you "
                                                r"mean 'gpu'\?\)"):
        kvsim.plan("sample:azure-conv", slo={"ttft_p99_s": 5}, gpus=["h200"])


def test_a_keyword_setting_overrides_the_config_files_dashed_spelling(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('model = "llama-2-7b"\nmax-num-seqs = 128\n')
    result = kvsim.run("sample:azure-conv", config=str(config), max_num_seqs=64, limit=5)
    assert result.summary["config"]["max_num_seqs"] == 64   # (it was 'given twice')


@pytest.mark.parametrize("keyword, words", [
    ({"out": "x"}, "field 'out': what the command does with the run, not a run setting: write "
                   "the result with Result.write(out_dir)"),
    ({"slo_ttft_p99": 1.0}, "field 'slo_ttft_p99': what the command does with the run, not a "
                            "run setting: give slo={'ttft_p99_s': ...}"),
])
def test_a_command_line_option_given_to_run_says_what_python_does_instead(keyword, words):
    with pytest.raises(kvsim.ConfigError) as info:
        kvsim.run(limit=5, **keyword)
    assert str(info.value) == f"kvsim.run: {words}"


def test_a_trace_read_in_python_keeps_the_rows_its_file_left_out(tmp_path):
    """kvsim.load_trace counts a CSV's rows holding no request; kvsim.run of that Trace, as
    read, reports them as a run of the file does; an edited list is the caller's own."""
    path = tmp_path / "burst.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n"
                    "45,ChatGPT,1087,0,1087,Conversation log\n"
                    "118,GPT-4,417,276,693,Conversation log\n")
    trace = kvsim.load_trace(path)
    assert (len(trace), trace.rows_left_out) == (2, {"failed": 1})
    assert kvsim.run(trace).summary["trace_rows_left_out"] == {"failed": 1}
    assert kvsim.run(path).summary["trace_rows_left_out"] == {"failed": 1}
    trace.pop()
    assert kvsim.run(trace).summary["trace_rows_left_out"] == {}
