"""bench/sim_speed.py pairs each run of a variant with a run of its baseline just before it."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "sim_speed.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("sim_speed", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_variant_runs_right_after_its_baseline_and_each_pair_gives_one_ratio(tmp_path,
                                                                               monkeypatch):
    bench = load_bench()
    walls = iter([10.0, 15.0, 20.0, 26.0])          # baseline, variant, baseline, variant
    ran = []

    def fake_measure(argv, env, out):
        ran.append((argv[-1], out.name))
        return bench.Measure(next(walls), 1.0, 100.0, "ok")
    monkeypatch.setattr(bench, "measure", fake_measure)
    case = bench.Case("mooncake-lfu", ["run", "lfu"], None, baseline="mooncake")
    versions = {"old": ([], {}), "new": ([], {})}
    best, pairs, cpu, walls = bench.measure_case(case, versions, ["run", "lru"], 2, tmp_path)
    assert ran == [("lru", "mooncake-lfu-baseline-0"), ("lfu", "mooncake-lfu-new-0"),
                   ("lru", "mooncake-lfu-baseline-1"), ("lfu", "mooncake-lfu-new-1")]
    assert pairs == [1.5, 1.3] and cpu == 4.0 and walls == [15.0, 26.0]
    assert best["new"].wall_s == 15.0 and best["old"] is None


def test_the_lru_noise_case_pairs_lru_with_itself():
    bench = load_bench()
    found = {c.name: c for c in bench.cases(Path("/shared"), Path("/work"), False)}
    assert found["mooncake-lru"].baseline == "mooncake"
    assert found["mooncake-lru"].new[-2:] == ["--eviction", "lru"]


def test_side_by_side_runs_a_variant_beside_its_baseline_and_compares_cpu_seconds(tmp_path,
                                                                                monkeypatch):
    bench = load_bench()
    cpus = iter([(10.0, 13.0), (20.0, 24.0)])       # (baseline, variant) per repeat
    ran = []

    def fake_pair(first, second, env, out_first, out_second, second_env):
        ran.append((first[-1], second[-1], out_first.name, out_second.name))
        assert "KVSIM_X" not in env and second_env["KVSIM_X"] == "1"     # the case's own
        base, variant = next(cpus)
        return bench.Measure(base + 1, base, 100.0, "ok"), bench.Measure(variant + 1, variant,
                                                                          100.0, "ok")
    monkeypatch.setattr(bench, "measure_pair", fake_pair)
    case = bench.Case("mooncake-lfu", ["run", "lfu"], None, baseline="mooncake",
                      env={"KVSIM_X": "1"})
    versions = {"old": ([], {}), "new": ([], {})}
    best, pairs, cpu, walls = bench.measure_case(case, versions, ["run", "lru"], 2, tmp_path,
                                                 side_by_side=True)
    assert ran == [("lru", "lfu", "mooncake-lfu-baseline-0", "mooncake-lfu-new-0"),
                   ("lru", "lfu", "mooncake-lfu-baseline-1", "mooncake-lfu-new-1")]
    assert pairs == [1.3, 1.2] and cpu == 67.0 and best["new"].wall_s == 14.0
    assert walls == [14.0, 25.0]


def test_a_case_both_versions_run_gives_old_over_new_per_repeat_and_every_new_time(
        tmp_path, monkeypatch, capsys):
    """Vidur's case: old and new alternate; each repeat gives old / new wall seconds, and the
    table lists every pair and every new time (point 5 is about each run, not the fastest)."""
    bench = load_bench()
    walls = iter([12.0, 4.0, 13.0, 4.2])            # old, new, old, new
    monkeypatch.setattr(bench, "measure", lambda argv, env, out: bench.Measure(
        next(walls), 1.0, 100.0, "ok"))
    case = bench.Case("vidur", ["run"], ["run"], target=">= 5x")
    versions = {"old": ([], {}), "new": ([], {})}
    best, pairs, cpu, news = bench.measure_case(case, versions, None, 2, tmp_path)
    assert pairs == [3.0, 3.095] and news == [4.0, 4.2] and cpu == 4.0
    assert best["old"].wall_s == 12.0 and best["new"].wall_s == 4.0
    bench.print_table([(case, best, pairs, news)], "b45c6b7")
    assert "vidur: each pair 3.00 3.10; new s 4.00 4.20" in capsys.readouterr().out


def test_a_missing_trace_or_unknown_case_is_one_line_and_status_2_before_anything_runs(
        tmp_path, capsys):
    bench = load_bench()
    found = bench.cases(tmp_path, tmp_path, False)
    for only, line in ((["mooncake-arc"], "sim_speed.py: no trace "
                        f"{tmp_path}/traces/mooncake/conversation_trace.jsonl: --shared DIR must "
                        "hold the public traces (docs/performance.md, 'Measuring', says which)"),
                       (["vidu"], "sim_speed.py: no case 'vidu' (cases: vidur, mooncake, ")):
        with pytest.raises(SystemExit) as stop:
            bench.check_cases(found, only)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(line) and err.count("\n") == 1
    assert [c.name for c in bench.check_cases(found, ["million", "million-gen"])] == [
        "million-gen", "million"]       # (generated: no trace to find)
