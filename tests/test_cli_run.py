"""`kvsim run` end to end, on the bundled slices of real traces."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from clirun import kvsim

from kvsim.reports.style import fmt_seconds

CONTRACT_KEYS = {
    "num_requests", "num_completed", "num_steps", "duration_s", "wall_time_s",
    "throughput_output_tokens_per_s", "request_throughput_per_s", "ttft_s", "tpot_s", "e2e_s",
    "prefix_cache", "preemptions", "swapped_out_blocks", "swapped_in_blocks", "kv",
    "fragmentation", "config"}
OUTPUTS = {"summary.json", "requests.csv", "timeline.csv", "report.html"}
#: The note of a run whose trace names no prompt's content (Azure, BurstGPT, lengths only).
UNNAMED = ("no request of the trace says what its prompt holds (token ids, prefix hash ids or "
           "a request it continues): none can hit another's cached blocks, so the prefix hit "
           "rate is 0 by construction")


def test_run_without_a_trace_runs_the_bundled_sample(tmp_path):
    done = kvsim("run", "--limit", "60", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert {p.name for p in (tmp_path / "out").iterdir()} == OUTPUTS
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert CONTRACT_KEYS <= set(summary)
    assert summary["config"]["trace"] == "sample:mooncake"
    assert summary["num_requests"] == 60 and summary["num_completed"] == 60
    assert "throughput" in done.stdout


def test_kvsim_alone_prints_its_help_as_it_is():
    done = kvsim()
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[0].startswith("Usage: ") and lines[0].endswith(" [OPTIONS] COMMAND [ARGS]...")
    assert "Commands:" in lines
    assert any(line.split()[:1] == ["run"] for line in lines)


def test_a_piped_summary_has_no_padding_spaces(tmp_path):
    done = kvsim("run", "--limit", "5", "--out", str(tmp_path))
    lines = done.stdout.splitlines()
    assert lines[0] == "kvsim run summary" and all(ln == ln.rstrip() for ln in lines)


def test_json_prints_only_the_summary(tmp_path):
    done = kvsim("run", "sample:azure-conv", "--model", "llama-2-7b", "--limit", "50",
                 "--out", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["config"]["model"] == "llama-2-7b"
    assert set(summary["fragmentation"]) == {"token_states", "reservation", "internal",
                                             "external", "free"}
    assert sum(summary["fragmentation"].values()) == pytest.approx(1.0)
    assert done.stderr == (f"kvsim: {UNNAMED}\nkvsim: wrote {tmp_path}/summary.json, "
                           "requests.csv, timeline.csv, report.html\n")  # (beside the JSON)


def test_the_summary_and_the_terminal_say_how_the_trace_was_read(tmp_path):
    args = ("run", "sample:azure-conv", "--model", "llama-2-7b", "--limit", "50", "--start",
            "5", "--rate-scale", "3", "--out", str(tmp_path))
    summary = json.loads(kvsim(*args, "--json").stdout)
    assert summary["config"]["trace_options"] == {
        "format": None, "limit": 50, "start_s": 5.0, "end_s": None, "rate_scale": 3.0,
        "sort": False, "trace_model": None}
    shown = kvsim(*args).stdout
    assert "sample:azure-conv (--limit 50, --start 5, --rate-scale 3)" in shown


def test_same_inputs_and_seed_give_the_same_summary(tmp_path):
    runs = []
    for name in ("a", "b"):
        done = kvsim("run", "--limit", "80", "--replicas", "2", "--router", "prefix-affinity",
                     "--out", str(tmp_path / name), "--quiet")
        assert done.returncode == 0, done.stderr
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        summary.pop("wall_time_s")
        runs.append(summary)
    assert runs[0] == runs[1]
    assert (tmp_path / "a" / "requests.csv").read_bytes() == \
        (tmp_path / "b" / "requests.csv").read_bytes()


def test_a_config_file_sets_options_and_flags_override_it(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('model = "llama-2-7b"\nblock_size = 32\nmax_num_seqs = 8\n')
    done = kvsim("run", "sample:azure-conv", "--config", str(config), "--max-num-seqs", "4",
                 "--limit", "20", "--out", str(tmp_path / "o"), "--json")
    assert done.returncode == 0, done.stderr
    cfg = json.loads(done.stdout)["config"]
    assert (cfg["model"], cfg["block_size"], cfg["max_num_seqs"]) == ("llama-2-7b", 32, 4)


@pytest.mark.parametrize("args, message", [
    (["--model", "no-such-model"], "--model: unknown model 'no-such-model'"),
    (["--max-model-len", "100000000"], "exceeds the KV pool"),
    (["--scheduling-policy", "random"], "'--scheduling-policy': 'random' is not one of 'fcfs', "
                                        "'priority'"),
    (["--max-num-batched-tokens", "8"], "--max-num-batched-tokens: 8 is below "
                                        "max_num_seqs (256)"),
    (["--offload-write", "back"], "--offload-write: sets up a CPU tier that is not there"),
    (["--layout", "contiguous", "--eviction", "lfu"], "--eviction: the contiguous layout "
                                                      "shares no prefixes"),
    (["--kv-offloading-size", "4", "--offload-write", "back", "--offload-eviction-policy", "arc"],
     "--offload-eviction-policy: belongs to vLLM's native CPU tier"),
    (["--kv-offloading-size", "0.0001"], "0.0001 GiB makes 0 CPU blocks of 16 tokens"),
    (["--replicas", "100000"], "--replicas: must be at most 1024"),
    (["--num-gpu-blocks", "2000000000"], "--num-gpu-blocks: must be at most 50000000"),
])
def test_bad_settings_get_one_line_and_exit_2(tmp_path, args, message):
    done = kvsim("run", *args, "--out", str(tmp_path / "o"))
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "o").exists()


def test_vllms_spellings_of_options_work_or_say_how_to_write_them(tmp_path):
    """`-tp 2` is vLLM's; `--enable-prefix-caching false` is too, but kvsim's on/off flags
    take no value: the `false` read as the trace (or an extra argument) says how to write it."""
    done = kvsim("run", "--limit", "3", "-tp", "2", "--quiet", "--json", "--out", tmp_path / "o")
    assert done.returncode == 0 and json.loads(done.stdout)["config"]["tp"] == 2
    hint = ("(--enable-prefix-caching takes no value: write --enable-prefix-caching or "
            "--no-enable-prefix-caching)\n")
    done = kvsim("run", "--enable-prefix-caching", "false", "--out", tmp_path / "p")
    assert (done.returncode, done.stderr) == (2, f"kvsim: error: false: no such file {hint}")
    done = kvsim("run", "sample:azure-conv", "--enable-prefix-caching", "false")
    assert (done.returncode, done.stderr) == (
        2, f"kvsim: error: Got unexpected extra argument(s) (false) {hint}")
    done = kvsim("run", "--enable-prefix-caching", "false", "sample:azure-conv")
    assert (done.returncode, done.stderr) == (
        2, f"kvsim: error: Got unexpected extra argument(s) (sample:azure-conv) {hint}")


@pytest.mark.parametrize("line, words", [
    ("tensor_parallel_size = 2", "field 'tensor_parallel_size': vLLM's name "
                                 "(--tensor-parallel-size); kvsim's setting is 'tp'"),
    ('out = "x"', "field 'out': what the command does with the run, not a run setting: give "
                  "--out on the command line"),
    ("slo_ttft_p99 = 2", "field 'slo_ttft_p99': what the command does with the run, not a run "
                         "setting: give --slo-ttft-p99 on the command line"),
])
def test_a_toml_key_that_is_a_command_line_option_says_what_to_write(tmp_path, line, words):
    config = tmp_path / "c.toml"
    config.write_text(line + "\n")
    done = kvsim("run", "--config", config, "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and done.stderr == f"kvsim: error: {config}:1: {words}\n"


def test_every_run_option_a_toml_file_cannot_hold_has_its_own_message():
    """The run command's options that are no setting: trace options, or listed (with what to
    give instead) in COMMAND_LINE_ONLY; a flag's other name in SETTING_ALIASES."""
    import inspect
    from kvsim.commands.run import run_command
    from kvsim.sim import config
    settings, trace = set(config.setting_names()), set(config._TRACE_OPTION_NAMES)
    names = {part.strip()[2:].replace("-", "_")
             for p in inspect.signature(run_command).parameters.values()
             for decl in getattr(p.default, "param_decls", None) or ()
             for part in decl.split("/") if part.strip().startswith("--")}
    names = {n for n in names if not (n.startswith("no_") and n[3:] in names)}
    assert names - settings - trace - set(config.COMMAND_LINE_ONLY) - {"cpu_offload_gb"} == \
        set(config.SETTING_ALIASES)


def test_a_bad_value_is_named_where_it_came_from_file_or_command_line(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("max_num_seqs = 64\n")
    alone = kvsim("run", "--config", config, "--max-num-seqs", "0", "--out", tmp_path / "o")
    assert alone.stderr == "kvsim: error: --max-num-seqs: must be at least 1, got 0\n"
    both = kvsim("run", "--config", config, "--max-num-batched-tokens", "8", "--out",
                 tmp_path / "o")      # (a check of two settings, one from each)
    assert both.stderr.startswith(f"kvsim: error: {config} with the command line: field "
                                  "'max_num_batched_tokens': 8 is below max_num_seqs (64)")


def test_a_misspelt_or_conflicting_toml_setting_is_named_where_it_is(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('modle = "llama-2-7b"\n')
    done = kvsim("run", "--config", config, "--out", str(tmp_path / "o"))
    assert done.stderr.startswith(f"kvsim: error: {config}:1: field 'modle': unknown setting "
                                  "(did you mean 'model'")
    config.write_text('model = "llama-2-7b"\nlimit = 50\n')      # how the trace is read
    done = kvsim("run", "--config", config, "--out", str(tmp_path / "o"))
    assert done.stderr == (f"kvsim: error: {config}:2: field 'limit': how the trace is read, "
                           "not a run setting: give --limit on the command line, or limit= to "
                           "kvsim.run\n")
    config.write_text("start_s = 10\n")                   # (summary.json's name for it)
    done = kvsim("run", "--config", config, "--out", str(tmp_path / "o"))
    assert "field 'start_s': how the trace is read, not a run setting: give --start on the " \
        "command line, or start= to kvsim.run" in done.stderr
    config.write_text("kv_offloading_size = 8\nnum_cpu_blocks = 100\n")
    done = kvsim("run", "--config", config, "--out", str(tmp_path / "o"))
    assert done.stderr == (f"kvsim: error: {config}:1: field 'kv_offloading_size': give the "
                           "host tier in blocks or in GiB, not both\n")
    config.write_text("max_num_seqs = 64\n\nmax-num-batched-tokens = 8\n")
    done = kvsim("run", "--config", config, "--out", str(tmp_path / "o"))
    assert done.stderr.startswith(f"kvsim: error: {config}:3: field 'max_num_batched_tokens': "
                                  "8 is below max_num_seqs (64)")
    done = kvsim("run", "--max-num-seqs", "9999", "--out", str(tmp_path / "o"))
    assert done.stderr.startswith("kvsim: error: field 'max_num_batched_tokens': 8192 is below "
                                  "max_num_seqs (9999)")     # (a default: no place to name)


def test_a_deployment_a_toml_file_makes_impossible_is_named_at_its_setting(tmp_path):
    """Model, GPU, TP and pool are checked together: the setting they refuse is shown at its
    line of the file, or as its option when the command line gave it."""
    config = tmp_path / "c.toml"
    config.write_text('[run]\nmodel = "llama-3-8b"\ntp = 3\n')
    done = kvsim("run", "--config", config, "--out", str(tmp_path / "o"))
    assert (done.returncode, done.stderr) == (2, (
        f"kvsim: error: {config}:3: field 'tp': llama-3-8b has 32 attention heads, which do "
        "not divide over 3 GPUs (vLLM refuses this)\n"))
    config.write_text('model = "llama-3-8b"\nmax-model-len = 1000000\n')
    done = kvsim("run", "--config", config, "--out", str(tmp_path / "o"))
    assert done.stderr.startswith(f"kvsim: error: {config}:2: field 'max_model_len': "
                                  "max_model_len 1,000,000 tokens exceeds the KV pool of ")
    config.write_text('model = "llama-3-8b"\n')
    done = kvsim("run", "--config", config, "--tp", "3", "--out", str(tmp_path / "o"))
    assert done.stderr.startswith("kvsim: error: --tp: llama-3-8b has 32 attention heads")
    assert not (tmp_path / "o").exists()


def test_a_table_in_a_config_file_that_is_not_run_is_named_as_a_table(tmp_path):
    """[other] is not a misspelt setting ("did you mean 'router'?" it said): kvsim reads the
    top level or [run]; a setting given a table is that setting's error."""
    config = tmp_path / "c.toml"
    for text, header in (('[other]\ngpu = "h100-80gb"\n', "[other]"),
                         ("[[other]]\nx = 1\n", "[other]"),
                         ("[run]\nseed = 1\n[run.other]\nx = 1\n", "[run.other]")):
        config.write_text(text)
        done = kvsim("run", "--config", config, "--out", str(tmp_path / "o"))
        assert done.stderr == (f"kvsim: error: {config}: field 'other': a table {header} is "
                               "not read: kvsim reads the settings at the top level or in "
                               "[run]\n")
    config.write_text('gpuu = {name = "h100-80gb"}\n')     # (a misspelt key, not a table)
    done = kvsim("run", "--config", config, "--out", str(tmp_path / "o"))
    assert done.stderr.startswith(f"kvsim: error: {config}:1: field 'gpuu': unknown setting "
                                  "(did you mean 'gpu'?)")
    config.write_text('gpu = {name = "h100-80gb"}\n')
    done = kvsim("run", "--config", config, "--out", str(tmp_path / "o"))
    assert done.stderr == (f"kvsim: error: {config}:1: field 'gpu': expected a string, got "
                           "{'name': 'h100-80gb'}\n")


def test_a_setting_given_twice_in_a_config_file_is_refused(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("max-num-seqs = 3\nmax_num_seqs = 4\n")
    done = kvsim("run", "--config", str(config), "--out", str(tmp_path / "o"))
    assert done.returncode == 2
    assert done.stderr == (f"kvsim: error: {config}:2: field 'max_num_seqs': given twice (spelt "
                           "with '-' and with '_')\n")


def test_a_bad_value_in_a_config_file_names_its_line(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('\ufeffmodel = "llama-2-7b"\nmax-num-seqs = "many"\n', encoding="utf-8")
    done = kvsim("run", "--config", str(config), "--out", str(tmp_path / "o"))
    assert done.stderr == (f"kvsim: error: {config}:2: field 'max_num_seqs': expected an "
                           "integer, got 'many'\n")          # (and a BOM is fine)
    config.write_text('trace = "nope.jsonl"\n')
    done = kvsim("run", "--config", str(config), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (f"kvsim: error: {config}:1: field 'trace': {tmp_path}/nope.jsonl: "
                           "no such file\n")     # (read from the TOML file's folder)
    config.write_text('max_num_seqs = 8\ngpu = "rtx4090"\n')
    done = kvsim("run", "--config", str(config), "--out", str(tmp_path / "o"))
    assert done.stderr.startswith(f"kvsim: error: {config}:2: field 'gpu': unknown GPU "
                                  "'rtx4090'")


def test_a_relative_trace_in_a_config_file_is_read_from_the_files_folder(tmp_path):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "t.jsonl").write_text(
        '{"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 5}\n')
    (tmp_path / "exp" / "m.json").write_text((Path(__file__).parents[1] / "sim" / "perf" /
                                               "catalog" / "tiny-llama.json").read_text())
    (tmp_path / "exp" / "run.toml").write_text('trace = "t.jsonl"\nmodel = "m.json"\n')
    done = kvsim("run", "--config", "exp/run.toml", "--out", "o", "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["config"]["trace"] == "exp/t.jsonl" and summary["num_completed"] == 1
    assert summary["config"]["model"] == "exp/m.json"      # (a file there: read from there)
    (tmp_path / "exp" / "run.toml").write_text('model = "gone/config.json"\n')
    done = kvsim("run", "--config", "exp/run.toml", "--out", "o", "-q", cwd=tmp_path)
    assert done.stderr == ("kvsim: error: exp/gone/config.json: field 'model': no such model "
                           "config file\n")     # (named where it was looked for)
    (tmp_path / "exp" / "run.toml").write_text('trace = ""\n')
    done = kvsim("run", "--config", "exp/run.toml", "--out", "o", "-q", cwd=tmp_path)
    assert done.stderr == ("kvsim: error: exp/run.toml:1: field 'trace': is empty: give a trace "
                           "file, - for standard input, or sample:NAME (or no trace for the "
                           "default sample)\n")


def test_an_empty_trace_argument_is_refused_not_the_default_sample(tmp_path):
    for command in (("run", ""), ("trace-stats", ""), ("hitrate", "", "--capacity", "10"),
                    ("compare", "", "--max-num-seqs", "4,8")):
        done = kvsim(*command, "--out", str(tmp_path / "o")) if command[0] != "trace-stats" \
            else kvsim(*command)
        assert (done.returncode, done.stdout) == (2, ""), command
        assert done.stderr == ("kvsim: error: field 'trace': is empty: give a trace file, - "
                               "for standard input, or sample:NAME (or no trace for the "
                               "default sample)\n")


def test_a_bad_trace_line_writes_nothing(tmp_path):
    trace = tmp_path / "t.jsonl"
    good = '{"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 5}\n'
    trace.write_text(good * 3 + '{"arrival_s": 1.0, "prompt_tokens": -4, "output_tokens": 5}\n')
    done = kvsim("run", str(trace), "--out", str(tmp_path / "o"))
    assert done.returncode == 2
    assert f"{trace}:4" in done.stderr and "prompt_tokens" in done.stderr
    assert not (tmp_path / "o" / "summary.json").exists()


def test_a_run_refused_for_bad_input_leaves_an_earlier_result_as_it_was(tmp_path):
    out = tmp_path / "o"
    assert kvsim("run", "--limit", "5", "--out", str(out), "-q").returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    done = kvsim("run", "--limit", "5", "--model", "no-such-model", "--out", str(out))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_new_result_replaces_the_earlier_one_whole(tmp_path):
    out = tmp_path / "o"
    assert kvsim("run", "--limit", "5", "--out", str(out), "-q").returncode == 0
    assert kvsim("run", "--limit", "6", "--out", str(out), "-q", "--no-html").returncode == 0
    assert sorted(p.name for p in out.iterdir()) == ["requests.csv", "summary.json",
                                                    "timeline.csv"]   # no older report.html


@pytest.mark.parametrize("args, short", [(["run", "--limit", "5"], "-q"),
                                         (["gen", "chat", "-n", "5"], "-n")])
def test_an_empty_out_is_refused(args, short):
    done = kvsim(*args, "--out", "")
    assert done.returncode == 2
    assert done.stderr == "kvsim: error: Invalid value for '--out': an empty path; give a file " \
                          "or directory\n"
    done = kvsim(*args, "--out", "--seed", "3")      # (the next option taken as the path)
    assert done.returncode == 2
    assert done.stderr == "kvsim: error: Invalid value for '--out': '--seed' is an option, " \
                          "not a path: give the path first (./--seed for a path of that name)\n"
    done = kvsim(*args, "--out", short)         # (a short option of the command, too)
    assert (done.returncode, done.stderr) == (
        2, f"kvsim: error: Invalid value for '--out': '{short}' is an option, not a path: give "
           f"the path first (./{short} for a path of that name)\n")


def test_gen_refuses_a_directory_and_writes_through_a_device(tmp_path):
    done = kvsim("gen", "chat", "-n", "5", "--out", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr == f"kvsim: error: {tmp_path}: field 'out': is a directory; give a file " \
                          "to write\n"
    assert kvsim("gen", "chat", "-n", "5", "--out", "/dev/null").returncode == 0
    assert Path("/dev/null").is_char_device()
    target, link = tmp_path / "trace.jsonl", tmp_path / "latest.jsonl"
    target.write_text("")
    link.symlink_to(target)            # (as /dev/stdout is: it was replaced by a file)
    assert kvsim("gen", "chat", "-n", "5", "--out", str(link)).returncode == 0
    assert link.is_symlink() and len(target.read_text().splitlines()) == 5
    nested = tmp_path / "new" / "folder" / "trace.jsonl"     # (made, as every --out's is)
    assert kvsim("gen", "chat", "-n", "5", "--out", str(nested)).returncode == 0
    assert len(nested.read_text().splitlines()) == 5


@pytest.mark.parametrize("args, message", [
    (["run", "--max-num-seqs", "abc"], "Invalid value for '--max-num-seqs'"),
    (["run", "--no-such-option"], "No such option: --no-such-option"),
    (["trace-stats"], "Missing argument 'TRACE'"),
    (["no-such-command"], "No such command 'no-such-command'"),
])
def test_usage_errors_are_one_line_with_exit_2(args, message):
    done = kvsim(*args)
    assert done.returncode == 2
    assert done.stderr.startswith("kvsim: error: ") and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_example_config_runs_as_the_readme_shows(tmp_path):
    example = Path(__file__).resolve().parents[1] / "docs" / "example-run.toml"
    done = kvsim("run", "--config", example, "--replicas", "2", "--router", "prefix-affinity",
                 "--limit", "30", "--out", tmp_path / "o", "--json")
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)["config"]
    assert (config["trace"], config["model"], config["replicas"], config["router"]) == (
        "sample:azure-conv", "llama-3.1-8b", 2, "prefix-affinity")


def test_rows_left_out_of_a_csv_trace_are_announced_and_counted(tmp_path):
    """A BurstGPT file's failed rows and rows without a prompt run no request: the run says
    so before it starts, its summary counts them by reason (quiet or not: the same summary),
    and the terminal summary shows them."""
    trace = tmp_path / "burst.csv"
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "5,ChatGPT,472,18,490,Conversation log\n"
                     "45,ChatGPT,1087,0,1087,Conversation log\n"
                     "118,GPT-4,417,276,693,Conversation log\n"
                     "130,ChatGPT,0,12,12,API log\n")
    done = kvsim("run", trace, "--out", tmp_path / "r", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(
        "kvsim: 2 rows of the trace hold no request to run and are left out: failed (BurstGPT "
        "Response tokens 0): 1, no prompt (0 prompt tokens): 1\n"
        f"kvsim: {UNNAMED}\nkvsim: wrote ")
    summary = json.loads(done.stdout)
    assert (summary["num_requests"], summary["trace_rows_left_out"]) == (
        2, {"empty_prompt": 1, "failed": 1})
    quiet = kvsim("run", trace, "--out", tmp_path / "q", "--quiet")
    assert quiet.stderr == ""
    written = json.loads((tmp_path / "q" / "summary.json").read_text())
    assert written["trace_rows_left_out"] == summary["trace_rows_left_out"]
    shown = kvsim("run", trace, "--out", tmp_path / "s").stdout
    assert " left out " in shown and "2 trace rows without a request to run" in shown


def test_long_prompts_are_announced_counted_and_can_be_truncated(tmp_path):
    done = kvsim("run", "--model", "llama-3-70b", "--gpu", "h100-80gb", "--tp", "4",
                 "--limit", "40", "--out", tmp_path / "r", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    rejected = summary["num_rejected"]
    assert rejected > 0 and summary["num_completed"] == 40 - rejected
    assert done.stderr.startswith(f"kvsim: {rejected} of 40 requests have prompts of 8,192 "
                                  "tokens or more")
    rows = (tmp_path / "r" / "requests.csv").read_text().splitlines()
    assert sum(",rejected," in row for row in rows[1:]) == rejected
    cut = kvsim("run", "--model", "llama-3-70b", "--gpu", "h100-80gb", "--tp", "4",
                "--limit", "40", "--long-prompt", "truncate", "--out", tmp_path / "t", "--json")
    summary = json.loads(cut.stdout)
    assert summary["num_rejected"] == 0 and summary["num_truncated"] >= rejected
    assert summary["num_completed"] == 40
    assert cut.stderr.startswith(f"kvsim: {rejected} of 40 requests have prompts of 8,192 ")
    assert (f"; truncating the {summary['num_truncated']} whose prompt and output together "
            "pass it (--long-prompt truncate)\n") in cut.stderr      # (the count it reports)


def test_a_truncated_request_runs_and_counts_as_the_shorter_request(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_tokens": 20000, "output_tokens": 100}\n')
    done = kvsim("run", str(trace), "--model", "llama-3-70b", "--gpu", "h100-80gb", "--tp", "4",
                 "--long-prompt", "truncate", "--out", tmp_path / "t", "--json")
    summary = json.loads(done.stdout)
    assert summary["num_truncated"] == 1 and summary["kv"]["max_model_len"] == 8192
    # Vidur's cut: 20,100 - 8,192 = 11,908 over, taken in proportion: 8,151 + 40 tokens
    row = (tmp_path / "t" / "requests.csv").read_text().splitlines()[1].split(",")
    assert row[3:7] == ["8151", "40", "40", "stop"] and row[1] == "1"    # (its trace line)
    assert summary["throughput_input_tokens_per_s"] * summary["duration_s"] == \
        pytest.approx(8151)       # the prompt that ran (it counted 20,000)


def test_a_bad_line_read_from_stdin_is_named_as_stdin(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kvsim.cli", "run", "-", "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=300,
                          input='{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": "x"}\n')
    assert done.returncode == 2
    assert done.stderr == ("kvsim: error: <stdin>:1: field 'output_tokens': expected an "
                           "integer, got a string ('x')\n")


def test_a_run_of_a_trace_read_from_stdin_calls_it_stdin(tmp_path):
    """The summary keeps what was given ('-'); the terminal and the report say <stdin>, as
    the errors do."""
    done = subprocess.run([sys.executable, "-m", "kvsim.cli", "run", "-", "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=300,
                          input='{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 3}\n')
    assert done.returncode == 0, done.stderr
    assert [line.split() for line in done.stdout.splitlines() if " trace " in line] == [
        ["trace", "<stdin>"]]
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["config"]["trace"] == "-"
    assert "Trace <b>&lt;stdin&gt;</b>" in (tmp_path / "o" / "report.html").read_text()


def test_tier_options_without_a_tier_refuse_one_run_but_not_a_grid_spanning_tiers():
    from kvsim.errors import ConfigError
    from kvsim.sim.config import RunConfig
    config = RunConfig(offload_write="back")
    config.validate()               # (a compare point without a tier: as before)
    with pytest.raises(ConfigError, match="sets up a CPU tier that is not there"):
        config.check_unused_options()


@pytest.mark.parametrize("option, layout, message", [
    (("--reserve", "pow2"), "paged", "applies to --layout contiguous or hybrid only (the paged "
                                     "layout does not use it)"),
    (("--hybrid-threshold", "100"), "contiguous", "applies to --layout hybrid only (the "
                                                  "contiguous layout does not use it)"),
])
def test_a_layout_option_the_layout_does_not_use_is_refused(tmp_path, option, layout, message):
    done = kvsim("run", "--limit", "3", *option, "--layout", layout, "--out",
                 str(tmp_path / "o"))
    assert done.returncode == 2
    assert done.stderr == f"kvsim: error: {option[0]}: {message}\n"


def test_a_max_model_len_above_the_models_context_is_noted_as_vllm_refuses_it(tmp_path):
    args = ("run", "sample:mooncake", "--model", "llama-3-70b", "--gpu", "h100-80gb", "--tp",
            "4", "--limit", "10", "--out", str(tmp_path))
    done = kvsim(*args, "--max-model-len", "131072")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == (
        "kvsim: --max-model-len 131,072 is above llama-3-70b's context of 8,192 tokens: vLLM "
        "refuses that unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1; kvsim runs it, its costs "
        "extrapolated past the lengths the model was made for")
    assert "context of" not in kvsim(*args, "--max-model-len", "8192").stderr


def test_quiet_still_warns_of_rejected_requests(tmp_path):
    done = kvsim("run", "sample:mooncake", "--model", "llama-3-70b", "--gpu", "h100-80gb",
                 "--tp", "4", "--limit", "50", "--quiet", "--out", str(tmp_path / "o"))
    assert (done.returncode, done.stdout) == (0, "")
    assert done.stderr == ("kvsim: rejected 24 of 50 requests: prompt of max_model_len 8,192 "
                           "tokens or more (that is the model's own context: pass "
                           "--long-prompt truncate, choose a model with a longer one, or "
                           "raise --max-model-len past it, which vLLM allows with "
                           "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)\n")


def test_a_fitted_profile_run_says_where_its_step_times_come_from(tmp_path):
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({
        "kind": "fitted", "device": "cpu", "device_name": "a test CPU",
        "settings": {"dtype": "fp32", "block_size": 32},
        "model_shape": {"num_layers": 2}}))
    from kvsim.run_notes import profile_note
    from kvsim.sim.config import RunConfig
    data = json.loads(profile.read_text())
    assert profile_note(RunConfig(profile=str(profile)), data) == (
        f"step times: fitted on a test CPU ({profile}); --gpu a100-80gb sizes the KV pool "
        "only; measured with dtype fp32 (this run: bf16), block size 32 (this run: 16)")


def test_the_truncate_note_counts_prompt_and_output_past_the_length_when_no_prompt_is():
    from types import SimpleNamespace
    from kvsim.run_notes import TraceScan, long_prompt_note
    from kvsim.sim.config import RunConfig
    scan = TraceScan(num_requests=300, span_s=60.0, num_long=0, longest_prompt=4000,
                     num_overflowing=11)
    note = long_prompt_note(scan, RunConfig(long_prompt="truncate"),
                            SimpleNamespace(max_model_len=4150))
    assert note == ("11 of 300 requests have prompt and output together past max_model_len "
                    "4,150: truncating them (--long-prompt truncate)")


def test_a_long_run_without_the_compiled_parts_says_so_once(monkeypatch):
    from kvsim import run_notes
    from kvsim.cache import bulk, intmap, recency
    long, short = (run_notes.TraceScan(num_requests=n, span_s=60.0, num_long=0,
                                       longest_prompt=100) for n in (12_031, 300))
    for module, name in ((intmap, "IntMap"), (bulk, "_c"), (recency, "RecencyList")):
        monkeypatch.setattr(module, name, None)
    monkeypatch.setattr(intmap, "PURE_PYTHON", False)
    assert run_notes.uncompiled_note(long).startswith("the cache's C parts were not built")
    assert run_notes.uncompiled_note(short) is None          # a short run loses little
    monkeypatch.setattr(intmap, "PURE_PYTHON", True)         # asked for on purpose
    assert run_notes.uncompiled_note(long) is None
    monkeypatch.setattr(intmap, "PURE_PYTHON", False)
    monkeypatch.setattr(recency, "RecencyList", object)     # one of them built
    assert run_notes.uncompiled_note(long) is None


def test_format_names_take_any_case(tmp_path):
    done = kvsim("run", "sample:azure-conv", "--format", "AZURE", "--limit", "3", "-q",
                 "--no-html", "--out", str(tmp_path / "o"))
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["config"]["trace_options"]["format"] == "azure"


def test_a_deployment_that_falls_behind_its_arrivals_says_so_and_a_long_burst_does_not(
        tmp_path):
    """Forty 4,000-token prompts arriving over 3.9 s queue for seconds on one L4: the note
    says so; ten prompts of 100 tokens generating 2,000 each take long, but queue for
    nothing (their latencies are the deployment's, not a queue's)."""
    def trace(name, n, gap, prompt, output):
        path = tmp_path / name
        path.write_text("".join(json.dumps({"arrival_s": i * gap, "prompt_tokens": prompt,
                                            "output_tokens": output}) + "\n"
                                for i in range(n)))
        return path
    args = ("--gpu", "l4", "--out", tmp_path / "o")      # (not --quiet: no notes then)
    done = kvsim("run", trace("busy.jsonl", 40, 0.1, 4000, 10), *args)
    assert done.returncode == 0, done.stderr
    note, line = done.stderr.splitlines()        # (the summary is on stdout)
    assert note == f"kvsim: {UNNAMED}"
    queued = float(pd.read_csv(tmp_path / "o" / "requests.csv")["queue_s"].median())
    assert line == ("kvsim: the deployment fell behind the arrivals: 40 requests arrived over "
                    f"3.90 s (10.3 req/s) and waited {fmt_seconds(queued)} on median before "
                    "their first step, so their latencies measure the queue; give it more "
                    "--replicas, --tp or a larger --gpu, or lower --rate-scale")
    done = kvsim("run", trace("long.jsonl", 10, 0.1, 100, 2000), *args)
    assert (done.returncode, done.stderr) == (0, f"kvsim: {UNNAMED}\n")
    assert kvsim("run", tmp_path / "busy.jsonl", *args, "--quiet").stderr == ""


def test_a_pool_larger_than_the_gpus_hold_gets_a_note(tmp_path):
    """--num-gpu-blocks is taken as given (as vLLM's override), but 10 million blocks of
    Llama-3.1-8B are some 1.2 TiB: the run says that no A100-80GB holds them."""
    done = kvsim("run", "--limit", "3", "--num-gpu-blocks", "10000000", "--out", tmp_path / "o")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == (
        "kvsim: --num-gpu-blocks 10,000,000 is more than 1 x a100-80gb holds for the KV cache "
        "(28,679 blocks at --gpu-memory-utilization 0.9): the run is of a pool no such "
        "deployment has")
    done = kvsim("run", "--limit", "3", "--num-gpu-blocks", "28679", "--out", tmp_path / "p")
    assert "no such deployment" not in done.stderr
