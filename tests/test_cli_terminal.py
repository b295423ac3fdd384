"""A person at a terminal: commands finish under a pseudo-terminal, Ctrl-C and SIGTERM end in
one line and 130 / 143 with nothing partial left, and two runs cannot share an --out."""

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import pytest
from clirun import kvsim

KVSIM = [sys.executable, "-m", "kvsim"]       # (the console script's entry point)


def in_terminal(*args, cwd, timeout: float = 120) -> tuple[int, str]:
    """Run kvsim with stdin, stdout and stderr on a pseudo-terminal; ``(status, screen)``."""
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(cwd)
        os.environ["COLUMNS"] = "100"
        os.execv(sys.executable, [*KVSIM, *map(str, args)])
    screen, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:      # the child closed the terminal
                break
            if not chunk:
                break
            screen += chunk
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail(f"kvsim {' '.join(map(str, args))} did not finish in {timeout} s in a "
                    f"terminal; screen ends {screen[-300:]!r}")
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), screen.decode("utf-8", "replace")


def test_run_finishes_in_a_terminal_and_shows_what_ran(tmp_path):
    status, screen = in_terminal("run", "--limit", "20", "--out", "o", cwd=tmp_path)
    assert status == 0, screen
    assert (tmp_path / "o" / "summary.json").is_file()
    assert "sample:mooncake" in screen and "llama-3.1-8b" in screen and "a100-80gb" in screen


def test_a_note_is_wrapped_at_the_terminals_width_and_is_one_line_in_a_pipe(tmp_path):
    """The sample falls behind its arrivals (20 long prompts on one A100): a terminal of 100
    columns gets the note wrapped at its words, a log gets it as one line."""
    status, screen = in_terminal("run", "--limit", "20", "--out", "o", cwd=tmp_path)
    assert status == 0, screen
    first, *rest = screen.replace("\r", "").split("kvsim: the deployment fell behind")[1].split(
        "\n")
    note = ["kvsim: the deployment fell behind" + first]
    note += rest[:next(i for i, line in enumerate(rest) if not line.startswith("  "))]
    assert len(note) >= 2 and all(len(line) <= 99 for line in note)
    assert note[-1].endswith("or lower --rate-scale")
    piped = kvsim("run", "--limit", "20", "--out", tmp_path / "p", cwd=tmp_path)
    assert len([ln for ln in piped.stderr.splitlines() if "fell behind" in ln]) == 1


@pytest.mark.parametrize("args", [
    ["trace-stats", "sample:azure-conv"],
    ["hitrate", "sample:mooncake", "--capacity", "100,1000", "--eviction", "lru,lfu"],
    ["compare", "sample:azure-conv", "--limit", "20", "--eviction", "lru,lfu", "--workers", "1",
     "--out", "cmp"],
    ["plan", "sample:azure-conv", "--limit", "40", "--burst", "--tp", "1", "--slo-ttft-p99", "5",
     "--workers", "1", "--rate-iterations", "1", "--max-replicas", "2", "--out", "pl"],
])
def test_other_commands_finish_in_a_terminal(tmp_path, args):
    status, screen = in_terminal(*args, cwd=tmp_path)
    assert status == 0, screen
    assert "Traceback" not in screen


def test_compare_shows_a_bar_of_configurations_from_the_start_in_a_terminal(tmp_path):
    status, screen = in_terminal("compare", "sample:azure-conv", "--limit", "20", "--eviction",
                                 "lru,lfu", "--workers", "1", "--out", "cmp", cwd=tmp_path)
    assert status == 0, screen
    plain = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", screen)
    assert "0/2 configurations" in plain and "2/2 configurations" in plain
    piped = kvsim("compare", "sample:azure-conv", "--limit", "20", "--eviction", "lru,lfu",
                  "--workers", "1", "--out", tmp_path / "cmp2")
    assert piped.returncode == 0 and "configurations" not in piped.stderr


def test_a_compare_refused_for_bad_input_draws_no_bar_first(tmp_path):
    """The configurations are checked before the bar is drawn: the error is the screen's only
    line (a bar of 0/? configurations stood above it)."""
    status, screen = in_terminal("compare", "sample:azure-conv", "--limit", "20",
                                 "--eviction", "lru,foo", "--out", "e3", cwd=tmp_path)
    plain = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", screen)
    assert status == 2 and "configurations" not in plain
    assert plain.strip().startswith("kvsim: error:")


def test_plan_prints_each_candidate_as_it_finishes(tmp_path):
    done = kvsim("plan", "sample:azure-conv", "--limit", "40", "--burst", "--tp", "1,2",
                 "--slo-ttft-p99",
                 "5", "--workers", "1", "--rate-iterations", "1", "--max-replicas", "2",
                 "--out", tmp_path / "pl", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("kvsim: plan: [")]
    assert [ln.split("]")[0] for ln in lines] == ["kvsim: plan: [1/2", "kvsim: plan: [2/2"]


def long_trace(path, n: int = 60_000):
    """A trace long enough to still be running seconds after it starts; each prompt names
    its content by one prefix id of its own (a trace of lengths alone gets a note)."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"arrival_s": i * 0.01, "prompt_tokens": 200 + i % 300,
                                "output_tokens": 50 + i % 200, "block_hashes": [i],
                                "hash_block_size": 512}) + "\n")
    return path


def wait_for_lock(out, proc, timeout: float = 120) -> None:
    """Wait until ``proc`` holds ``out`` (its lock file exists), then a little longer."""
    deadline = time.monotonic() + timeout
    while not (out / ".kvsim.lock").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "kvsim never took the --out lock"
        time.sleep(0.1)
    time.sleep(1.0)
    assert proc.poll() is None, proc.communicate()


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_ends_in_one_line_and_leaves_nothing_partial(tmp_path, sig, status):
    trace = long_trace(tmp_path / "long.jsonl")
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")   # an earlier run's result: left as it was
    proc = subprocess.Popen([*KVSIM, "run", str(trace), "--out", str(out), "--no-skip-ahead"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_lock(out, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status
    assert err.strip().splitlines() == [
        f"kvsim: interrupted by {sig.name}; {out}/ is as it was (its earlier result kept)"]
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]
    assert (out / "summary.json").read_text() == "{}"


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_command_line_loads_ends_in_one_line(tmp_path, sig, status):
    """The signal arrives as kvsim.cli is being imported (sent by an import hook, so at a
    known moment): one line, no traceback."""
    code = f"""
import os, sys
class Hook:
    def find_spec(self, name, path=None, target=None):
        if name == "kvsim.cli":
            os.kill(os.getpid(), {int(sig)})
sys.meta_path.insert(0, Hook())
from kvsim.__main__ import main
sys.argv = ["kvsim", "run", "--limit", "5"]
main()
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == status
    assert done.stderr == f"kvsim: interrupted by {sig.name}; nothing was written\n"
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_compare_stops_its_workers_and_leaves_nothing(tmp_path):
    """The workers ignore Ctrl-C; the parent stops them, and each cleans its run's --out
    (they were killed outright before: their lock files stayed)."""
    trace = long_trace(tmp_path / "long.jsonl")
    out = tmp_path / "cmp"
    proc = subprocess.Popen([*KVSIM, "compare", str(trace), "--eviction", "lru,lfu",
                             "--workers", "2", "--out", str(out), "--no-skip-ahead"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for point in ("01_eviction-lru", "02_eviction-lfu"):
        wait_for_lock(out / point, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.strip().splitlines() == ["kvsim: interrupted by SIGINT; nothing was written"]
    assert not out.exists()


def test_a_second_run_on_the_same_out_fails_at_once(tmp_path):
    trace = long_trace(tmp_path / "long.jsonl")
    first = subprocess.Popen([*KVSIM, "run", str(trace), "--out", str(tmp_path / "o"), "-q"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for_lock(tmp_path / "o", first)
        start = time.monotonic()
        second = kvsim("run", "--limit", "5", "--out", tmp_path / "o")
        assert second.returncode == 2
        assert "another kvsim process is writing to this directory" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        assert time.monotonic() - start < 20
    finally:
        first.kill()
        first.wait()


def test_out_naming_a_file_fails_before_simulating(tmp_path):
    (tmp_path / "f").write_text("mine")
    done = kvsim("run", "--out", tmp_path / "f")
    assert done.returncode == 2
    assert done.stderr.strip() == (f"kvsim: error: {tmp_path / 'f'}: field 'out': exists and "
                                   "is not a directory; --out needs a directory")
    assert (tmp_path / "f").read_text() == "mine"


def test_a_new_run_replaces_every_file_of_the_last_one(tmp_path):
    assert kvsim("run", "--limit", "5", "--out", tmp_path, "-q").returncode == 0
    assert kvsim("run", "--limit", "5", "--out", tmp_path, "-q", "--no-html").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.csv", "summary.json",
                                                          "timeline.csv"]


def test_a_reader_leaving_after_the_first_bytes_of_a_long_result_is_141_too(tmp_path):
    """``--json | head -c 1`` on a result longer than a pipe holds (64 KiB): the write past
    what the pipe took fails, and kvsim says so with 141 (it ended with 0 before, the JSON
    cut at 64 KiB without a sign)."""
    capacities = ",".join(str(c) for c in range(10, 3010, 10))
    proc = subprocess.Popen([*KVSIM, "hitrate", "sample:azure-conv", "--limit", "20",
                             "--capacity", capacities, "--json"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(1) == b"{"
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    assert b"Traceback" not in err


@pytest.mark.parametrize("args", [["models"], ["run", "--limit", "20", "--json"],
                                  ["plan", "sample:mooncake", "--limit", "20", "--burst",
                                   "--slo-ttft-p99", "2"]])
def test_a_reader_that_closes_stdout_ends_kvsim_quietly_with_141(tmp_path, args):
    """``kvsim ... | head -1``: no traceback, no noise, 141 as a tool that SIGPIPE ends (not 1,
    a crash); a run's files are whole (stdout is written last)."""
    proc = subprocess.Popen([*KVSIM, *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "Exception" not in err
    if args[0] == "run":
        fell_behind, wrote = err.splitlines()       # (20 long prompts queue on one A100)
        assert fell_behind.startswith("kvsim: the deployment fell behind the arrivals: ")
        assert wrote == "kvsim: wrote kvsim-out/summary.json, requests.csv, timeline.csv, " \
                        "report.html"
        assert json.loads((tmp_path / "kvsim-out" / "summary.json").read_text())


def test_an_interrupted_gen_to_stdout_says_the_trace_it_printed_is_partial(tmp_path):
    proc = subprocess.Popen([*KVSIM, "gen", "chat", "--out", "-", "-n", "1000000"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    first = proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    rest = proc.stdout.readlines()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 130
    assert json.loads(first)["arrival_s"] >= 0
    lines = 1 + len(rest)
    assert err == (f"kvsim: interrupted by SIGINT; standard output got the first {lines:,} "
                   "requests only, a partial trace\n")


def test_a_report_path_under_a_file_names_the_file_in_the_way(tmp_path):
    run = kvsim("run", "--limit", "5", "--out", tmp_path / "r", "--quiet")
    assert run.returncode == 0, run.stderr
    (tmp_path / "notes.txt").write_text("mine")
    target = tmp_path / "notes.txt" / "page.html"
    done = kvsim("report", tmp_path / "r", "--out", target)
    assert done.returncode == 2
    assert done.stderr == (f"kvsim: error: {target}: field 'out': cannot create it: "
                           f"{tmp_path / 'notes.txt'} is not a directory\n")


@pytest.mark.parametrize("error, status", [("WorkerLost", 1), ("ConfigError", 2)])
def test_a_lost_worker_exits_1_not_as_bad_input(monkeypatch, capsys, error, status):
    """A worker process killed (out of memory) is the host's doing: one line and exit 1, as a
    full disk; bad settings stay exit 2."""
    import gc
    from kvsim import cli, errors

    def app(**_):
        raise getattr(errors, error)("what happened")
    monkeypatch.setattr(cli, "app", app)
    monkeypatch.setattr(signal, "signal", lambda *_: None)     # (pytest's own handlers stay)
    monkeypatch.setattr(gc, "set_threshold", lambda *_: None)
    with pytest.raises(SystemExit) as done:
        cli.main()
    assert done.value.code == status
    assert capsys.readouterr().err == "kvsim: error: what happened\n"
