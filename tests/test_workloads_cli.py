"""`kvsim trace-stats` and `kvsim gen` as a user runs them: exit codes, one-line errors."""

import json

import pytest

from kvsim.workloads import sample_path
from clirun import kvsim


def test_trace_stats_json_on_the_bundled_sample():
    result = kvsim("trace-stats", sample_path("mooncake"), "--limit", "100", "--rate-scale",
                   "2", "--block-size", "512", "--json")
    assert result.returncode == 0 and result.stderr == ""
    stats = json.loads(result.stdout)
    assert (stats["num_requests"], stats["time_span_s"], stats["block_size"]) == (100, 16.5, 512)


BAD_TRACES = {
    "empty": (b"", "", "empty trace"),
    "truncated": (b'{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n'
                  b'{"timestamp": 1, "input_len', ":2", "truncated line"),
    "backwards": (b'{"arrival_s": 5, "prompt_tokens": 5, "output_tokens": 1}\n'
                  b'{"arrival_s": 4, "prompt_tokens": 5, "output_tokens": 1}\n',
                  ":2: field 'arrival_s'", "backwards"),
    "undecodable": (b'{"arrival_s": 5, "prompt_tokens": 5, "output_tokens": 1}\n\xff\xfe\n',
                    ":2", "not UTF-8"),
    "absurd": (b'{"arrival_s": 5, "prompt_tokens": 50000000, "output_tokens": 1}\n',
               ":1: field 'prompt_tokens'", "absurd"),
}


@pytest.mark.parametrize("case", sorted(BAD_TRACES))
def test_bad_trace_is_one_line_on_stderr_and_exit_2(tmp_path, case):
    content, where, words = BAD_TRACES[case]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    result = kvsim("trace-stats", path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"kvsim: error: {path}{where}")
    assert words in result.stderr and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_gen_writes_the_same_file_twice_and_nothing_on_error(tmp_path):
    args = ["gen", "customer-service", "-n", "40", "--seed", "3", "--json"]
    first = kvsim(*args, "--out", tmp_path / "a.jsonl")
    second = kvsim(*args, "--out", tmp_path / "b.jsonl")
    assert first.returncode == second.returncode == 0
    assert json.loads(first.stdout)["num_requests"] == 40
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    failed = kvsim("gen", "chat", "--out", tmp_path / "c.jsonl", "--input-len", "uniform:9:1")
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1
    assert "uniform:9:1: LO is above HI" in failed.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]


def test_gen_out_dash_writes_the_trace_on_stdout_as_the_readers_take_it(tmp_path):
    done = kvsim("gen", "chat", "-n", "5", "--seed", "3", "--out", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "wrote 5 chat requests to standard output\n"
    assert not (tmp_path / "-").exists()
    kvsim("gen", "chat", "-n", "5", "--seed", "3", "--out", tmp_path / "c.jsonl")
    assert done.stdout == (tmp_path / "c.jsonl").read_text()
    refused = kvsim("gen", "chat", "-n", "5", "--out", "-", "--json", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "error: --json prints the summary on standard output" in refused.stderr


def test_a_bundled_sample_is_named_by_its_name_in_messages(tmp_path):
    from clirun import kvsim
    done = kvsim("run", "sample:azure-conv", "--start", "1e9", "--out", str(tmp_path / "o"))
    assert done.stderr == ("kvsim: error: sample:azure-conv: no request left after the time "
                           "window (--start, --end)\n")
    done = kvsim("run", "sample:mooncake", "--format", "azure", "--out", str(tmp_path / "o"))
    assert done.stderr.startswith("kvsim: error: sample:mooncake:1: field 'TIMESTAMP'")


def test_the_hitrate_table_names_its_trace():
    from clirun import kvsim
    done = kvsim("hitrate", "sample:mooncake", "--capacity", "1000", "--eviction", "lru")
    assert done.stdout.startswith("prefix hit rate of sample:mooncake: 300 requests, ")


def test_the_hitrate_table_says_when_no_request_can_hit():
    """The Azure sample gives lengths only: every rate is 0 by construction, and it says so
    (a reader took the 0.00 % for caching that does not pay)."""
    from clirun import kvsim
    done = kvsim("hitrate", "sample:azure-conv", "--capacity", "1000", "--eviction", "lru")
    assert done.stdout.splitlines()[1] == (
        "no request says what its prompt holds (token ids, prefix hash ids or a request it "
        "continues): nothing can hit, every rate is 0 by construction")
    done = kvsim("hitrate", "sample:mooncake", "--capacity", "1000", "--eviction", "lru")
    assert "by construction" not in done.stdout
