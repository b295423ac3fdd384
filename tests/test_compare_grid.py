"""kvsim.grid's grid parsing and kvsim.reports.grid_table, without running simulations."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsim import grid as compare
from kvsim.errors import ConfigError
from kvsim.reports.grid_table import bytes_moved, render_compare_table, table_metrics
from kvsim.workloads import TraceOptions


def test_values_are_converted_with_the_field_types():
    trace, dims = compare.parse_grid_args([
        "t.jsonl", "--block-size", "16,32", "--gpu-memory-utilization=0.8,0.9",
        "--enable-prefix-caching", "true,false", "--num-gpu-blocks", "none,500",
        "--eviction", "lru, hybrid,lru"])
    assert trace == "t.jsonl"
    assert dims == {"block_size": [16, 32], "gpu_memory_utilization": [0.8, 0.9],
                    "enable_prefix_caching": [True, False], "num_gpu_blocks": [None, 500],
                    "eviction": ["lru", "hybrid"]}


def test_bool_flags_and_the_trace_anywhere():
    trace, dims = compare.parse_grid_args(["--no-enable-prefix-caching", "--skip-ahead",
                                           "--seed", "1,2", "sample:mooncake"])
    assert trace == "sample:mooncake"
    assert dims == {"enable_prefix_caching": [False], "skip_ahead": [True], "seed": [1, 2]}


def test_vllms_spellings_of_tp_vary_it_too():
    for option in ("-tp", "--tensor-parallel-size"):
        assert compare.parse_grid_args(["t.jsonl", option, "1,2"]) == ("t.jsonl", {"tp": [1, 2]})
    assert compare.parse_grid_args(["-tp=4"]) == (None, {"tp": [4]})


@pytest.mark.parametrize("args, message", [
    (["--layout-of-doom", "a,b"], "field '--layout-of-doom': not a run setting"),
    (["--trace", "a,b"], "field '--trace': the trace is the first argument"),
    (["--evicton", "lru,lfu"], r"field '--evicton': not a run setting that can vary \(did you "
                               r"mean '--eviction'\?\); those are --model, --gpu, --tp, "),
    (["--tp", "1,two"], "field 'tp': expected an integer, got 'two'"),
    (["--enable-prefix-caching", "maybe"], "expected true or false, got 'maybe'"),
    (["--tp"], "field 'tp': needs a value"),
    (["--tp", ","], "field 'tp': needs at least one value"),
    (["--eviction", "lru,,lfu"], "field 'eviction': empty item in 'lru,,lfu'"),
    (["a.jsonl", "b.jsonl"], "one trace only"),
])
def test_bad_grid_arguments_are_config_errors(args, message):
    with pytest.raises(ConfigError, match=message):
        compare.parse_grid_args(args)


def test_a_new_run_config_field_is_a_dimension_without_code_changes(monkeypatch):
    types = {**compare.field_types(), "layout": str, "reserve": str | None}
    monkeypatch.setattr(compare, "field_types", lambda: types)
    _, dims = compare.parse_grid_args(["--layout", "paged,contiguous", "--reserve", "none,max"])
    assert dims == {"layout": ["paged", "contiguous"], "reserve": [None, "max"]}


def spec(dims, tmp_path, base=None):
    return compare.CompareSpec("sample:mooncake", dims, base or {}, TraceOptions(limit=5),
                               tmp_path)


def test_grid_order_is_first_dimension_slowest_with_labels_and_dirs(tmp_path):
    points = compare.grid_points(spec({"eviction": ["lru", "lfu"], "max_num_seqs": [8],
                                       "enable_prefix_caching": [True, False]}, tmp_path))
    assert [p.label for p in points] == [
        "eviction=lru enable_prefix_caching=true", "eviction=lru enable_prefix_caching=false",
        "eviction=lfu enable_prefix_caching=true", "eviction=lfu enable_prefix_caching=false"]
    assert [p.job.out_dir.name for p in points] == [
        "01_eviction-lru_enable-prefix-caching-true", "02_eviction-lru_enable-prefix-caching-false",
        "03_eviction-lfu_enable-prefix-caching-true", "04_eviction-lfu_enable-prefix-caching-false"]
    assert all(p.job.config.max_num_seqs == 8 for p in points)
    assert all(p.job.config.trace == "sample:mooncake" for p in points)


def test_a_setting_left_unset_reads_none_as_typed(tmp_path):
    points = compare.grid_points(spec({"max_model_len": [None, 4096]}, tmp_path))
    assert [p.label for p in points] == ["max_model_len=none", "max_model_len=4096"]
    assert points[0].job.out_dir.name == "01_max-model-len-none"


def test_shared_settings_come_from_the_config_file_and_dimensions_override_them(tmp_path):
    points = compare.grid_points(spec({"seed": [3], "block_size": [32]}, tmp_path,
                                      base={"block_size": 64, "model": "llama-2-7b"}))
    (point,) = points
    assert point.label == "base" and point.job.out_dir == Path(tmp_path) / "01_base"
    assert (point.job.config.block_size, point.job.config.model) == (32, "llama-2-7b")
    assert point.job.trace_options.seed == 3 and point.job.trace_options.limit == 5


def test_an_invalid_grid_point_fails_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="eviction"):
        compare.grid_points(spec({"eviction": ["lru", "nope"]}, tmp_path))


SUMMARY = {
    "throughput_output_tokens_per_s": 1234.5, "ttft_s": {"p50": 0.05, "p99": 0.5},
    "tpot_s": {"p50": 0.02, "p99": 0.04}, "prefix_cache": {"hit_rate": 0.5},
    "preemptions": 3, "kv": {"mean_batch_size": 12.25, "block_size": 16},
    "fragmentation": {"token_states": 0.9, "internal": 0.02, "external": 0.0},
    "config": {"swap_space_bytes": 10**9},
}


def test_bytes_moved_adds_the_transfer_byte_counters_present():
    assert bytes_moved(SUMMARY) == 0
    moved = {**SUMMARY, "swap_out_bytes": 100, "swap_in_bytes": 50,
             "tiering": {"offload_bytes": 7, "promote_bytes": 3, "bytes_per_block": 99},
             "compaction": {"compaction_bytes_moved": 40}, "preemptions": True}
    assert bytes_moved(moved) == 200


def test_the_table_has_a_header_a_rule_and_one_line_per_run_in_order():
    text = render_compare_table(["b second", "a first"], [SUMMARY, {}])
    lines = text.splitlines()
    assert len(lines) == 4 and lines[0].startswith("configuration")
    assert lines[2].startswith("b second") and lines[3].startswith("a first")
    assert "1,234.5" in lines[2] and "50.0 ms / 500.0 ms" in lines[2]
    assert "90%/2%/0%" in lines[2] and "12.2" in lines[2] and "0 B" in lines[2]
    assert table_metrics({})["throughput_output_tokens_per_s"] is None


def test_a_table_wider_than_the_terminal_comes_in_blocks_led_by_the_configuration():
    labels = ["eviction=lru block_size=16", "eviction=lfu block_size=16"]
    whole = render_compare_table(labels, [SUMMARY, {}])
    blocks = render_compare_table(labels, [SUMMARY, {}], width=80).split("\n\n")
    assert len(whole.splitlines()[0]) > 80 and len(blocks) > 1
    for block in blocks:
        lines = block.splitlines()
        assert max(map(len, lines)) <= 80 and lines[0].startswith("configuration")
        assert [line.split("  ")[0] for line in lines[2:]] == labels
    headers = " ".join(block.splitlines()[0] for block in blocks)
    assert all(h in headers for h in ("out tok/s", "TPOT p50 / p99", "moved", "rejected"))


def test_an_option_no_configuration_uses_is_refused_one_some_use_is_kept(tmp_path):
    from kvsim.errors import ConfigError
    with pytest.raises(ConfigError, match="applies to --layout contiguous or hybrid only"):
        compare.grid_points(spec({"max_num_seqs": [4, 8], "reserve": ["pow2"]}, tmp_path))
    points = compare.grid_points(spec({"layout": ["paged", "contiguous"],
                                       "reserve": ["pow2"]}, tmp_path))
    assert [p.job.config.layout for p in points] == ["paged", "contiguous"]


def test_a_latency_column_shows_every_run_in_one_unit():
    """The unit is the one the column's largest value needs (here minutes, for 126 s), not
    each row's own: `13.85 s / 107.09 s` above `0.241 min / 2.1 min` reads as a drop."""
    fast = {**SUMMARY, "ttft_s": {"p50": 13.85, "p99": 107.09}}
    slow = {**SUMMARY, "ttft_s": {"p50": 14.46, "p99": 126.0}}
    lines = render_compare_table(["fast", "slow"], [fast, slow]).splitlines()
    assert "0.231 min / 1.8 min" in lines[2] and "0.241 min / 2.1 min" in lines[3]
    assert all("50.0 ms / 500.0 ms" not in line for line in lines)   # (TPOT: its own unit)
    assert "20.0 ms / 40.0 ms" in lines[2] and "20.0 ms / 40.0 ms" in lines[3]
