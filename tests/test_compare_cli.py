"""`kvsim compare` end to end on 40 requests of the bundled Mooncake slice."""

from __future__ import annotations

import json
import re

import pytest
from plotly.offline import get_plotlyjs

from kvsim.reports.html import COMPARE_FIGURE_IDS
from clirun import kvsim

GRID = ("--eviction", "lru,priority", "--block-size", "16,32")
LABELS = ["eviction=lru block_size=16", "eviction=lru block_size=32",
          "eviction=priority block_size=16", "eviction=priority block_size=32"]
COMMON = ("--limit", "40", "--max-num-seqs", "8")


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    done = kvsim("compare", "sample:mooncake", *GRID, *COMMON, "--out", str(out),
                 "--workers", "2")
    assert done.returncode == 0, done.stderr
    return out, done.stdout


def test_the_table_has_one_row_per_grid_point_in_grid_order(grid):
    out, stdout = grid
    lines = stdout.splitlines()
    assert lines[:3] == [      # what every configuration shares (eviction, block size vary)
        "trace       sample:mooncake (--limit 40)",
        "deployment  llama-3.1-8b on 1 x a100-80gb (tp 1), bf16", ""]
    lines = lines[3:]
    assert lines[0].startswith("configuration") and "TTFT p50 / p99" in lines[0]
    assert set(lines[1]) <= {"-", " "}
    rows = lines[2:lines.index("")]
    assert [re.split(r"\s{2,}", row)[0] for row in rows] == LABELS
    assert lines[-2].startswith("preempt: preemptions · batch: mean requests per step")
    assert lines[-1].startswith("wrote ")


def test_a_grid_over_the_deployment_still_names_its_model_and_gpu():
    from kvsim.commands.compare import _header
    runs = [{"summary": {"config": {"trace": "sample:mooncake", "model": "llama-3.1-8b",
                                    "gpu": "a100-80gb", "tp": 1, "replicas": n,
                                    "dtype": "bf16", "layout": "paged", "block_size": 16,
                                    "enable_prefix_caching": True, "eviction": "lru"}}}
            for n in (1, 2)]
    lines = _header({"runs": runs}).splitlines()
    assert lines[1:5] == ["model       llama-3.1-8b", "GPU         a100-80gb", "TP          1",
                          "dtype       bf16"]       # (what the replicas share; not them)
    assert not any(line.startswith(("deployment", "replicas")) for line in lines)


def test_outputs_are_one_directory_per_configuration_plus_compare_json(grid):
    out, _ = grid
    result = json.loads((out / "compare.json").read_text())
    assert [run["label"] for run in result["runs"]] == LABELS
    assert result["dimensions"] == {"eviction": ["lru", "priority"], "block_size": [16, 32],
                                    "max_num_seqs": [8]}
    for run in result["runs"]:
        files = {p.name for p in (out / run["dir"]).iterdir()}
        assert files == {"summary.json", "requests.csv", "timeline.csv", "report.html"}
        assert run["summary"]["config"]["max_num_seqs"] == 8
        assert run["summary"]["config"]["block_size"] == run["settings"]["block_size"]
        assert run["metrics"]["bytes_moved"] == 0


@pytest.mark.parametrize("index", [1, 2])
def test_each_configuration_equals_a_separate_kvsim_run(grid, tmp_path, index):
    out, _ = grid
    run = json.loads((out / "compare.json").read_text())["runs"][index]
    single = tmp_path / "single"
    done = kvsim("run", "sample:mooncake", "--eviction", run["settings"]["eviction"],
                 "--block-size", str(run["settings"]["block_size"]), *COMMON,
                 "--out", str(single), "--quiet")
    assert done.returncode == 0, done.stderr
    expected = json.loads((single / "summary.json").read_text())
    got = json.loads((out / run["dir"] / "summary.json").read_text())
    for summary in (expected, got, run["summary"]):
        summary.pop("wall_time_s")
    assert got == expected and run["summary"] == expected
    assert (single / "requests.csv").read_bytes() == \
        (out / run["dir"] / "requests.csv").read_bytes()


def test_the_report_works_offline_and_holds_every_run(grid):
    out, _ = grid
    html = (out / "report.html").read_text(encoding="utf-8")
    page = html
    assert (out / "plotly.min.js").read_text(encoding="utf-8") == get_plotlyjs()
    assert "cdn.plot.ly" not in page
    assert not re.search(r"""<(script|link|img|iframe)[^>]+(src|href)\s*=\s*["']?(https?:)?//""",
                         page, re.I)
    assert re.findall(r'<div id="([^"]+)" class="plotly-graph-div"', html) == \
        list(COMPARE_FIGURE_IDS)
    for label in LABELS:
        assert label in html
    links = re.findall(r'<a href="([^"]+)">([^<]+)</a>', html)    # (each run's own page)
    assert sorted(label for _, label in links) == sorted(LABELS)
    assert all((out / href).is_file() and href.endswith("/report.html") for href, _ in links)


def test_json_prints_compare_json_only_and_serial_equals_parallel(grid, tmp_path):
    out, _ = grid
    done = kvsim("compare", *GRID, "sample:mooncake", *COMMON, "--out", str(tmp_path),
                 "--workers", "1", "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed == json.loads((tmp_path / "compare.json").read_text())
    parallel = json.loads((out / "compare.json").read_text())
    for a, b in zip(printed["runs"], parallel["runs"]):
        a["summary"].pop("wall_time_s"), b["summary"].pop("wall_time_s")
        assert a == b


def test_a_dimension_that_is_no_run_setting_is_one_line_and_exit_2(tmp_path):
    done = kvsim("compare", "sample:mooncake", "--eviction", "lru,lfu",
                 "--no-such-field", "a,b", "--out", str(tmp_path))
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: --no-such-field: not a run setting")
    assert not (tmp_path / "compare.json").exists()


def test_a_bad_value_is_one_line_and_exit_2(tmp_path):
    done = kvsim("compare", "sample:mooncake", "--max-num-seqs", "8,lots", "--out",
                 str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip() == \
        "kvsim: error: --max-num-seqs: expected an integer, got 'lots'"


def test_a_second_compare_into_the_same_out_keeps_the_users_folders(tmp_path):
    out = tmp_path / "results"
    first = kvsim("compare", "sample:mooncake", "--eviction", "lru,lfu", *COMMON,
                  "--out", str(out), "--quiet")
    assert first.returncode == 0, first.stderr
    earlier = [run["dir"] for run in json.loads((out / "compare.json").read_text())["runs"]]
    (out / "baseline").mkdir()
    (out / "baseline" / "summary.json").write_text("{}")     # (a user's own run)
    second = kvsim("compare", "sample:mooncake", "--block-size", "32,64", *COMMON,
                   "--out", str(out), "--quiet")
    assert second.returncode == 0, second.stderr
    assert (out / "baseline" / "summary.json").read_text() == "{}"
    assert not any((out / name).exists() for name in earlier)     # (stale runs go whole)
    run = kvsim("run", "sample:mooncake", *COMMON, "--out", str(out), "--quiet")
    assert run.returncode == 0, run.stderr          # (a run there: no compare left beside it)
    assert sorted(p.name for p in out.iterdir()) == ["baseline", "report.html",
                                                     "requests.csv", "summary.json",
                                                     "timeline.csv"]


def test_a_setting_given_twice_is_refused_not_half_dropped(tmp_path):
    done = kvsim("compare", "sample:mooncake", "--eviction", "lru", "--eviction", "lfu",
                 "--out", str(tmp_path / "o"))
    assert done.returncode == 2
    assert done.stderr == ("kvsim: error: --eviction: given twice; list every value "
                           "once: --eviction lru,lfu\n")


def test_an_unknown_model_is_refused_before_any_run_starts(tmp_path):
    """Every configuration's deployment is resolved first: no run directory, no lock (a
    worker that found the model unknown raced the others' cleanup and left a lock file)."""
    from kvsim import grid
    from kvsim.errors import ConfigError
    from kvsim.workloads import TraceOptions
    spec = grid.CompareSpec("sample:mooncake", {"eviction": ["lru", "lfu"]},
                            {"model": "nope-model"}, TraceOptions(), tmp_path / "o")
    with pytest.raises(ConfigError, match="^compare options: field 'model': unknown model"):
        grid.grid_points(spec)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("bad", [("--model", "nope"), ("--tp", "1,3")])
def test_a_compare_refused_leaves_the_earlier_result_whole(grid, tmp_path, bad):
    import shutil
    out = tmp_path / "o"
    shutil.copytree(grid[0], out)
    before = sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file())
    done = kvsim("compare", "sample:mooncake", "--eviction", "lru,lfu", *bad, *COMMON,
                 "--out", str(out))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert sorted((p.relative_to(out), p.read_bytes())
                  for p in out.rglob("*") if p.is_file()) == before


def test_a_refused_default_is_not_blamed_on_the_grid_or_the_file(tmp_path):
    """The file turns chunked prefill off; the token budget it then refuses is the default:
    neither the file's line nor "compare options" gave it."""
    config = tmp_path / "c.toml"
    config.write_text('model = "llama-3.1-8b"\nenable-chunked-prefill = false\n'
                      'max_model_len = 16384\n')
    done = kvsim("compare", "--config", str(config), "--eviction", "lru,lfu", "--out",
                 str(tmp_path / "o"))
    assert (done.returncode, done.stderr) == (2, (
        "kvsim: error: field 'max_num_batched_tokens': without chunked prefill the token "
        "budget (8,192) must hold the longest prompt: raise it to max_model_len (16,384) or "
        "lower that (vLLM refuses this too)\n"))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("line, words", [
    ('modle = "llama-2-7b"', "field 'modle': unknown setting (did you mean 'model'"),
    ('eviction = ["lru", "lfu"]', "field 'eviction': expected one of 'lru'"),
    ('model = "nope"', "field 'model': unknown model 'nope'"),
    ('tp = 3', "field 'tp': llama-3.1-8b has 32 attention heads, which do not divide over 3"),
    ('num-cpu-blocks = 100\nmodel = "gemma-3-12b"',        # (the tier's own setting named)
     "field 'num_cpu_blocks': gemma-3-12b has sliding-window or chunked-local layers"),
])
def test_a_bad_setting_in_the_config_file_is_named_at_its_line(tmp_path, line, words):
    config = tmp_path / "c.toml"
    config.write_text("# shared settings\n" + line + "\n")
    done = kvsim("compare", "--config", str(config), "--eviction", "lru,lfu", "--out",
                 str(tmp_path / "o"))
    assert done.returncode == 2
    assert done.stderr.startswith(f"kvsim: error: {config}:2: {words}")
