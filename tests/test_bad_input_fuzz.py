"""Every malformed input ends the same way: exit status 2, one line on stderr naming where the
problem is, no traceback and no result left behind.

The cases run the real entry point (``kvsim.cli.main``) in this process, so a few hundred of
them take seconds; a hypothesis fuzzer then throws generated lines at the trace parsers.
"""

import json
import signal
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim import cli
from kvsim.errors import KvsimError
from kvsim.workloads import TraceOptions, read_trace

GOOD_NATIVE = '{"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 5}'
GOOD_MOONCAKE = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}'
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZURE_ROW = "2023-11-16 18:15:46.6805900,374,44"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
BURST_ROW = "5,ChatGPT,472,18,490,Conversation log"


def run_cli(monkeypatch, capsys, *args) -> tuple[int, str]:
    """``kvsim ARGS`` in this process: ``(exit status, stderr)``."""
    monkeypatch.setattr(sys, "argv", ["kvsim", *map(str, args)])
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        cli.main()
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 1
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return status, capsys.readouterr().err


def native(**fields) -> str:
    return json.dumps({"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 5, **fields})


# (file name, content, text the one error line must contain)
TRACES = [
    ("empty.jsonl", "", "empty trace"),
    ("blank.jsonl", "\n\n  \n", "empty trace"),
    ("text.jsonl", "hello world\n", "unknown format"),
    ("trunc.jsonl", '{"prompt_tokens": 10, "output_tokens"\n', ":1"),
    ("list.jsonl", "[1, 2, 3]\n", "unknown format"),
    ("nonutf8.jsonl", b'{"prompt_tokens": 10, "output_tokens": 5, "x": "\xff"}\n', "UTF-8"),
    ("deep.jsonl", '{"a": ' + "[" * 5000 + "]" * 5000 + "}\n", "nested"),
    ("deep2.jsonl", '{"prompt_tokens": 10, "output_tokens": 5, "x": [[[[[1]]]]]}\n', "nested"),
    ("second.jsonl", GOOD_NATIVE + "\n" + "{oops\n", ":2"),
    ("back.jsonl", native(arrival_s=5.0) + "\n" + native(arrival_s=1.0) + "\n", "arrival_s"),
    ("mc_back.jsonl", GOOD_MOONCAKE + "\n" + GOOD_MOONCAKE.replace('"timestamp": 0',
                                                                   '"timestamp": -5') + "\n",
     "timestamp"),
]
NATIVE_FIELDS = [
    ("prompt_tokens", 0), ("prompt_tokens", -3), ("prompt_tokens", 1.5), ("prompt_tokens", "10"),
    ("prompt_tokens", True), ("prompt_tokens", None), ("prompt_tokens", 10**12),
    ("prompt_tokens", [10]), ("prompt_tokens", {"n": 1}), ("output_tokens", 0),
    ("output_tokens", -1), ("output_tokens", "5"), ("output_tokens", 2.5),
    ("output_tokens", 10**8), ("arrival_s", -1), ("arrival_s", "now"), ("arrival_s", 1e300),
    ("arrival_s", True), ("arrival_s", [0]), ("priority", 10**30), ("priority", -(10**30)),
    ("priority", 1.5), ("priority", "high"), ("priority", True), ("session_id", 1.5),
    ("session_id", [1]), ("template_id", {"a": 1}), ("prompt_token_ids", [[1, 2], [3, 4]]),
    ("prompt_token_ids", [1, -2, 3]), ("prompt_token_ids", []), ("prompt_token_ids", "1 2 3"),
    ("prompt_token_ids", [1, "2"]), ("prompt_token_ids", [1.5, 2]), ("prompt_token_ids", [2**70]),
    ("prompt_token_ids", [True, False]), ("block_hashes", [1]), ("block_hashes", [[1], [2]]),
    ("hash_block_size", 16),
]
MOONCAKE_FIELDS = [
    ("timestamp", -1), ("timestamp", "0"), ("timestamp", 1e300), ("input_length", 0),
    ("input_length", "600"), ("output_length", -5), ("output_length", 0.5), ("hash_ids", [1]),
    ("hash_ids", [[1], [2]]), ("hash_ids", [1, -2]), ("hash_ids", "1,2"), ("hash_ids", [1, 2.5]),
    ("hash_ids", [1, 2**70]), ("hash_ids", None),
]
AZURE_ROWS = ["2023-13-16 18:15:46.68,374,44", "2023-11-16 25:15:46.68,374,44",
              "yesterday,374,44", "2023-11-16 18:15:46.68,-1,44", "2023-11-16 18:15:46.68,x,44",
              "2023-11-16 18:15:46.68,374,-1", "2023-11-16 18:15:46.68,374", "2023-11-16 18:15:46"
              ".68,374.5,44", "2023-11-16 18:15:46.68,99999999999,44"]
BURST_ROWS = ["-5,ChatGPT,472,18,490,Conversation log", "x,ChatGPT,472,18,490,Conversation log",
              "5,ChatGPT,-472,18,490,Conversation log", "5,ChatGPT,472,abc,490,Conversation log",
              "5,ChatGPT,472.5,18,490,Conversation log", "5,ChatGPT,472,-1,490,Conversation log"]


def trace_cases():
    cases = list(TRACES)
    for i, (name, value) in enumerate(NATIVE_FIELDS):
        record = json.loads(native())
        record[name] = value
        cases.append((f"native{i}.jsonl", GOOD_NATIVE + "\n" + json.dumps(record) + "\n", ":2"))
    for i, (name, value) in enumerate(MOONCAKE_FIELDS):
        record = json.loads(GOOD_MOONCAKE)
        record[name] = value
        cases.append((f"mooncake{i}.jsonl", GOOD_MOONCAKE + "\n" + json.dumps(record) + "\n",
                      ":2"))
    for i, row in enumerate(AZURE_ROWS):
        cases.append((f"azure{i}.csv", f"{AZURE_HEADER}\n{AZURE_ROW}\n{row}\n", ":3"))
    for i, row in enumerate(BURST_ROWS):
        cases.append((f"burst{i}.csv", f"{BURST_HEADER}\n{BURST_ROW}\n{row}\n", ":3"))
    return cases


TOML = [
    ('block_size = "sixteen"', "block_size"), ("block_size = 1.5", "block_size"),
    ('tp = "4"', "tp"), ("run = 5", "run"), ('enable_prefix_caching = "no"',
                                               "enable_prefix_caching"),
    ('seed = "x"', "seed"), ("seed = -1", "seed"), ("max_model_len = 0", "max_model_len"),
    ("max_model_len = -1", "max_model_len"), ("num_gpu_blocks = 0", "num_gpu_blocks"),
    ('router = "random"', "router"), ('eviction = "fifo"', "eviction"),
    ("gpu_memory_utilization = 1.5", "gpu_memory_utilization"),
    ("gpu_memory_utilization = 0", "gpu_memory_utilization"), ("replicas = 0", "replicas"),
    ("max_num_seqs = -4", "max_num_seqs"), ("long_prefill_token_threshold = -1",
                                            "long_prefill_token_threshold"),
    ("compaction_threshold = 2.0", "compaction_threshold"), ("kv_offloading_size = -1",
                                                             "kv_offloading_size"),
    ("cpu_offload_gb = 4", "cpu_offload_gb"), ("offload_write = \"around\"", "offload_write"),
    ('offload_eviction_policy = "lfu"', "offload_eviction_policy"),
    ("offload_store_threshold = -2", "offload_store_threshold"),
    ('preemption_mode = "swap"\nnum_cpu_blocks = 8', "preemption_mode"),
    ('dtype = "fp4"', "dtype"), ("no_such_key = 1", "no_such_key"), ("tp = true", "tp"),
    ("block_size = [16]", "block_size"), ("[run]\ntp = 2\n[other]\nx = 1", "other"),
    ("trace = 5", "trace"), ("this is not toml", "TOML"), ('long_prompt = "cut"',
                                                           "long_prompt"),
    ("num_cpu_blocks = -1", "num_cpu_blocks"), ('layout = "contiguous"\nnum_cpu_blocks = 8',
                                                "layout"),
    ('preemption_mode = "swap"', "preemption_mode"),
]
MODEL_CONFIGS = [
    ({"hidden_size": 0}, "hidden_size"), ({"hidden_size": -8}, "hidden_size"),
    ({"hidden_size": "4096"}, "hidden_size"), ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"num_attention_heads": 3}, "num_key_value_heads"), ({"num_hidden_layers": 1.5},
                                                          "num_hidden_layers"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"), ({"vocab_size": None}, "vocab_size"),
    ({"max_position_embeddings": True}, "max_position_embeddings"),
    ({"model_type": "bert"}, "model_type"), ({"intermediate_size": -1}, "intermediate_size"),
    ({"head_dim": 0}, "head_dim"),
]
GOOD_MODEL = {"model_type": "llama", "hidden_size": 512, "num_attention_heads": 8,
              "num_key_value_heads": 8, "num_hidden_layers": 2, "intermediate_size": 1024,
              "vocab_size": 1000, "max_position_embeddings": 4096}
PROFILES = [
    ({"gemm": {"compute_efficiency": 0}}, "gemm.compute_efficiency"),
    ({"gemm": {"compute_efficiency": -0.5}}, "gemm.compute_efficiency"),
    ({"gemm": {"latency_s": "fast"}}, "gemm.latency_s"),
    ({"overhead": {"step_s": None}}, "overhead.step_s"),
    ({"attention": {"latency_s": True}}, "attention.latency_s"),
    ({"transfers": {"pcie_efficiency": [0.5, "x"]}}, "transfers.pcie_efficiency"),
    ([1, 2], "profile"),
]
CLI = [
    (["run", "--num-gpu-blocks", "0"], "--num-gpu-blocks: "), (["run", "--max-model-len", "-1"],
                                                           "--max-model-len: "),
    (["run", "--max-model-len", "0"], "--max-model-len: "), (["run", "--router", "random"],
                                                         "--router"),
    (["run", "--tp", "3", "--model", "llama-2-70b"], "tp"), (["run", "--tp", "x"], "--tp"),
    (["run", "--block-size", "1.5"], "--block-size"), (["run", "--eviction", "fifo"],
                                                       "--eviction"),
    (["run", "--config", "."], "config"), (["run", "--config", "missing.toml"], "config"),
    (["run", "--model", "no-such-model"], "model"), (["run", "--gpu", "tpu"], "gpu"),
    (["run", "missing.jsonl"], "no such file"), (["run", "sample:nope"], "sample"),
    (["run", "."], "directory"), (["run", "/dev/null"], "regular file"),
    (["run", "--limit", "0"], "--limit"), (["run", "--rate-scale", "0"], "--rate-scale"),
    (["run", "--rate-scale", "-2"], "--rate-scale"), (["run", "--format", "xml"], "--format"),
    (["run", "--start", "10", "--end", "5"], "end"), (["run", "--seed", "x"], "--seed"),
    (["run", "--gpu-memory-utilization", "2"], "--gpu-memory-utilization: "),
    (["run", "--slo-ttft-p99", "-1"], "--slo-ttft-p99"), (["run", "--slo-ttft-p99", "0"],
                                                          "--slo-ttft-p99"),
    (["compare", "sample:azure-conv", "--slo-tpot-p99", "nan", "--eviction", "lru,lfu"],
     "--slo-tpot-p99"), (["run", "--long-prompt", "cut"],
                                                          "--long-prompt"),
    (["compare", "sample:azure-conv", "--workers", "0", "--eviction", "lru,lfu"], "--workers"),
    (["compare", "sample:azure-conv", "--no-such", "1,2"], "no-such"),
    (["compare", "sample:azure-conv", "--tp", "1,x"], "tp"),
    (["plan", "sample:azure-conv", "--slo-ttft-p99", "-1"], "--slo-ttft-p99"),
    (["plan", "sample:azure-conv", "--slo-ttft-p99", "1", "--tp", "0"], "tp"),
    (["plan", "sample:azure-conv", "--slo-ttft-p99", "1", "--workers", "0"], "--workers"),
    (["plan", "sample:azure-conv", "--slo-ttft-p99", "1", "--router", "x"], "--router"),
    (["plan", "sample:azure-conv", "--slo-ttft-p99", "1", "--target-rate", "-5"],
     "--target-rate: must be a request rate > 0, got -5.0"),
    (["run", "--start", "nan"], "--start: must be a finite number of "
     "seconds >= 0 (from the first arrival), got nan"),
    (["run", "--start", "-5"], "--start: must be a finite number of "
     "seconds >= 0 (from the first arrival), got -5.0"),
    (["trace-stats", "sample:mooncake", "--rate-scale", "-1"],
     "--rate-scale: must be a finite number > 0, got -1.0"),
    (["plan", "sample:azure-conv", "--slo-ttft-p99", "2", "--target-rate", "500"],
     "sample:azure-conv: field '--target-rate': at 500 req/s (rate scale 140) the trace's 300 "
     "requests arrive within 0.6 s, too short for a 10% overload to show against the TTFT/E2E "
     "targets (a burst that ends in time passes): judging TTFT p99 <= 2 s as a sustained load "
     "needs 20.2 s of arrivals. Give at least 10,102 requests (a longer trace), plan for at "
     "most 14.8 req/s (rate scale 4.15), or plan these arrivals as one burst (--burst; "
     "burst=True in Python)"),
    (["hitrate", "sample:mooncake", "--capacity", "0"], "capacity"),
    (["hitrate", "sample:mooncake", "--capacity", "x"], "capacity"),
    (["trace-stats", "sample:nope"], "sample"), (["gen", "chat", "--out", "g.jsonl",
                                                  "--arrival", "x"], "--arrival"),
    (["gen", "nope", "--out", "g.jsonl"], "'PRESET': 'nope' is not one of"),
    (["run", "--gpu-memory-utilization", "nan"], "--gpu-memory-utilization: expected a "
                                                 "finite number, got nan"),
    (["hitrate", "sample:mooncake", "--capacity-tokens", "10"],
     "--capacity-tokens: capacities must be from one block of 16 tokens (--block-size)"),
    (["gen", "chat", "--input-len", "fixed:0", "--out", "g.jsonl"],
     "--input-len: "),
    (["gen", "chat", "--cv", "2", "--out", "g.jsonl"], "--cv: shapes "
                                                       "gamma arrivals only (--arrival gamma"),
    (["gen", "chat", "--arrival", "trace", "--out", "g.jsonl"],
     "--arrival-trace: trace arrivals need a trace path"),
    (["gen", "chat", "--high-priority-fraction", "2", "--out", "g.jsonl"],
     "--high-priority-fraction: must be between 0 and 1, got 2.0"),
]


def assert_one_line(status, err, expected, tmp_path):
    assert status == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kvsim: error: ") and expected in lines[0], lines[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name, content, expected", trace_cases(), ids=lambda v: str(v)[:20])
def test_bad_traces(monkeypatch, capsys, tmp_path, name, content, expected):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    status, err = run_cli(monkeypatch, capsys, "run", path, "--out", tmp_path / "o")
    assert_one_line(status, err, expected, tmp_path)
    assert str(path) in err


@pytest.mark.parametrize("text, key", TOML, ids=[t for t, _ in TOML])
def test_bad_toml(monkeypatch, capsys, tmp_path, text, key):
    (tmp_path / "run.toml").write_text(text + "\n")
    status, err = run_cli(monkeypatch, capsys, "run", "--config", tmp_path / "run.toml",
                          "--limit", "5", "--out", tmp_path / "o")
    assert_one_line(status, err, key, tmp_path)
    assert "run.toml" in err


@pytest.mark.parametrize("change, key", MODEL_CONFIGS, ids=[k for _, k in MODEL_CONFIGS])
def test_bad_model_config(monkeypatch, capsys, tmp_path, change, key):
    (tmp_path / "config.json").write_text(json.dumps({**GOOD_MODEL, **change}))
    status, err = run_cli(monkeypatch, capsys, "run", "--model", tmp_path / "config.json",
                          "--limit", "5", "--out", tmp_path / "o")
    assert_one_line(status, err, key, tmp_path)
    assert "config.json" in err


@pytest.mark.parametrize("profile, key", PROFILES, ids=[k for _, k in PROFILES])
def test_bad_profile(monkeypatch, capsys, tmp_path, profile, key):
    (tmp_path / "p.json").write_text(json.dumps(profile))
    status, err = run_cli(monkeypatch, capsys, "run", "--profile", tmp_path / "p.json",
                          "--limit", "5", "--out", tmp_path / "o")
    assert_one_line(status, err, key, tmp_path)
    assert "p.json" in err


@pytest.mark.parametrize("prices", [{"a100-80gb": -1}, {"a100-80gb": "cheap"}, [1],
                                    {"a100-80gb": True}, "not json"], ids=str)
def test_bad_price_table(monkeypatch, capsys, tmp_path, prices):
    path = tmp_path / "prices.json"
    path.write_text(prices if isinstance(prices, str) else json.dumps(prices))
    status, err = run_cli(monkeypatch, capsys, "plan", "sample:azure-conv", "--slo-ttft-p99",
                          "1", "--price-table", path, "--out", tmp_path / "o")
    assert_one_line(status, err, "prices.json", tmp_path)


@pytest.mark.parametrize("args, expected", CLI, ids=lambda v: " ".join(v) if isinstance(
    v, list) else v)
def test_bad_command_line_values(monkeypatch, capsys, tmp_path, args, expected):
    monkeypatch.chdir(tmp_path)
    out = [] if args[0] == "trace-stats" else ["--out", tmp_path / "o"]
    status, err = run_cli(monkeypatch, capsys, *args, *out)
    assert_one_line(status, err, expected, tmp_path)


def test_there_are_more_than_a_hundred_cases():
    total = (len(trace_cases()) + len(TOML) + len(MODEL_CONFIGS) + len(PROFILES) + 5
             + len(CLI))
    assert total >= 150


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=4),
    max_leaves=12)
KEYS = ["arrival_s", "prompt_tokens", "output_tokens", "prompt_token_ids", "block_hashes",
        "hash_block_size", "priority", "session_id", "timestamp", "input_length",
        "output_length", "hash_ids"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(KEYS), json_values, max_size=6),
       st.sampled_from([None, "native", "mooncake"]))
def test_parsers_never_raise_anything_but_a_trace_error(tmp_path_factory, record, fmt):
    path = tmp_path_factory.mktemp("fuzz") / "t.jsonl"
    path.write_text(json.dumps(record) + "\n")
    try:
        requests = read_trace(path, TraceOptions(fmt=fmt))
    except KvsimError as e:
        assert "\n" not in str(e)
        return
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in requests)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_a_trace_error_or_a_trace(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("bytes") / "t.trace"
    path.write_bytes(data)
    try:
        read_trace(path)
    except KvsimError as e:
        assert "\n" not in str(e)
