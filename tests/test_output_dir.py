"""An --out directory holds one command's result: stories of what a command leaves there."""

import os

import pytest

from kvsim.reports.outdir import OutputDir

FILES = ("summary.json", "requests.csv", "report.html")


def earlier_result(path):
    path.mkdir()
    for name in FILES:
        (path / name).write_text("earlier")
    (path / "notes.txt").write_text("the user's")


def names(path):
    return sorted(p.name for p in path.iterdir())


def test_a_command_that_fails_before_writing_leaves_the_earlier_result(tmp_path):
    out = tmp_path / "o"
    earlier_result(out)
    with pytest.raises(ValueError) as failed:
        with OutputDir(out):
            raise ValueError("bad input")
    assert failed.value.left == f"{out}/ is as it was (its earlier result kept)"
    assert [(out / n).read_text() for n in FILES] == ["earlier"] * 3


def test_a_command_that_fails_while_writing_leaves_no_result_at_all(tmp_path):
    out = tmp_path / "o"
    earlier_result(out)
    with pytest.raises(OSError) as failed:
        with OutputDir(out):
            (out / "summary.json").write_text("new")
            raise OSError("disk full")
    assert failed.value.left == f"{out}/ holds no result (nothing partial left)"
    assert names(out) == ["notes.txt"]


def test_a_new_result_removes_the_earlier_files_it_does_not_write_again(tmp_path):
    out = tmp_path / "o"
    earlier_result(out)
    with OutputDir(out):
        (out / "summary.json").write_text("new")
        (out / "requests.csv").write_text("new")
    assert names(out) == ["notes.txt", "requests.csv", "summary.json"]


def test_a_directory_made_for_a_command_that_fails_is_removed(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(ValueError) as failed:
        with OutputDir(out):
            raise ValueError("bad input")
    assert failed.value.left == "nothing was written" and not out.exists()


def test_a_complete_result_is_remembered_for_a_late_interrupt(tmp_path):
    from kvsim.reports import outdir
    with OutputDir(tmp_path / "o"):
        (tmp_path / "o" / "summary.json").write_text("new")
    assert outdir.completed[-1] == tmp_path / "o"


def test_a_directory_made_for_a_command_that_fails_while_writing_is_removed(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(OSError) as failed:
        with OutputDir(out):
            (out / "summary.json").write_text("new")
            raise OSError("disk full")
    assert failed.value.left == "nothing was written" and not out.exists()


def test_a_shared_plotly_file_kept_unchanged_stays_with_the_new_result(tmp_path):
    from kvsim.reports.page import PLOTLY_JS_FILE, plotly_head_script
    out = tmp_path / "o"
    for _ in range(2):          # (the second run keeps the file as it is: it was removed)
        with OutputDir(out):
            plotly_head_script("sibling", out / "report.html")
            (out / "report.html").write_text("page")
    assert names(out) == [PLOTLY_JS_FILE, "report.html"]


def earlier_compare(out, runs=("01_run", "03_old")):
    import json
    earlier_result(out)
    for run in runs:
        (out / run).mkdir()
        (out / run / "summary.json").write_text("earlier")
    (out / "compare.json").write_text(json.dumps({"runs": [{"dir": run} for run in runs]}))


def test_a_compare_puts_the_earlier_result_aside_while_it_runs(tmp_path):
    out = tmp_path / "o"
    earlier_compare(out)
    with OutputDir(out, subdirs=["01_run", "02_new"]):  # (its runs rewrite their directories
        assert names(out) == [".kvsim-earlier", ".kvsim.lock", "notes.txt"]    # one by one)
        assert names(out / ".kvsim-earlier") == ["01_run", "03_old", "compare.json",
                                                 "report.html", "requests.csv", "summary.json"]
        (out / "01_run").mkdir()
        (out / "01_run" / "summary.json").write_text("new")
    assert names(out) == ["01_run", "notes.txt"]      # (the earlier runs and files are gone)
    assert (out / "01_run" / "summary.json").read_text() == "new"


@pytest.mark.parametrize("wrote", [False, True])
def test_an_interrupted_compare_puts_the_earlier_result_back(tmp_path, wrote):
    out = tmp_path / "o"
    earlier_compare(out)
    with pytest.raises(KeyboardInterrupt) as failed:
        with OutputDir(out, subdirs=["01_run", "02_new"]):
            if wrote:           # (a run finished: its directory, one the earlier one had)
                (out / "01_run").mkdir()
                (out / "01_run" / "summary.json").write_text("new")
                (out / "02_new").mkdir()
                (out / "02_new" / "requests.csv").write_text("new")
            raise KeyboardInterrupt
    assert failed.value.left == f"{out}/ is as it was (its earlier result kept)"
    assert names(out) == ["01_run", "03_old", "compare.json", "notes.txt", "report.html",
                          "requests.csv", "summary.json"]
    assert [(out / run / "summary.json").read_text() for run in ("01_run", "03_old")] == \
        ["earlier"] * 2


def test_an_aside_left_by_a_compare_killed_hard_comes_back_to_an_empty_directory(tmp_path):
    out = tmp_path / "o"
    earlier_compare(out)
    aside = out / ".kvsim-earlier"
    aside.mkdir()
    for name in ("summary.json", "requests.csv", "report.html", "compare.json",
                 "01_run/summary.json", "03_old/summary.json"):
        (aside / name).parent.mkdir(exist_ok=True)
        os.replace(out / name, aside / name)    # (as a compare killed meanwhile left it)
    with pytest.raises(ValueError):
        with OutputDir(out):
            raise ValueError("bad input")
    assert names(out) == ["01_run", "03_old", "compare.json", "notes.txt", "report.html",
                          "requests.csv", "summary.json"]
    assert (out / "01_run" / "summary.json").read_text() == "earlier"


def test_a_failure_while_setting_aside_puts_back_what_was_moved(tmp_path, monkeypatch):
    out = tmp_path / "o"
    earlier_compare(out)
    moves = []

    def flaky(src, dst):
        moves.append(src)
        if len(moves) == 3:
            raise OSError(28, "No space left on device")
        return real(src, dst)
    real = os.replace
    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(OSError):
        with OutputDir(out, subdirs=["01_run"]):
            pass
    monkeypatch.setattr(os, "replace", real)
    assert names(out) == ["01_run", "03_old", "compare.json", "notes.txt", "report.html",
                          "requests.csv", "summary.json"]


def test_an_earlier_file_whose_place_was_taken_stays_aside_and_is_named(tmp_path):
    out = tmp_path / "o"
    earlier_compare(out)
    with pytest.raises(KeyboardInterrupt) as failed:
        with OutputDir(out, subdirs=["01_run"]):
            (out / "03_old").write_text("a file of the user's, where a run folder was")
            raise KeyboardInterrupt
    assert failed.value.left == (f"{out}/ holds no result; its earlier one could not all be "
                                 f"put back and is in {out}/.kvsim-earlier/")
    assert (out / ".kvsim-earlier" / "03_old" / "summary.json").read_text() == "earlier"
    assert (out / "compare.json").exists()


def test_an_aside_left_by_a_compare_killed_hard_goes_at_the_next_command(tmp_path):
    out = tmp_path / "o"
    earlier_result(out)
    (out / ".kvsim-earlier").mkdir()
    (out / ".kvsim-earlier" / "summary.json").write_text("older")
    with OutputDir(out):
        (out / "summary.json").write_text("new")
    assert names(out) == ["notes.txt", "summary.json"]


def test_a_compare_leaves_sub_directories_it_does_not_name_alone(tmp_path):
    out = tmp_path / "o"
    earlier_result(out)
    for name in ("01_run", "mine"):
        (out / name).mkdir()
        (out / name / "summary.json").write_text("earlier")
    with OutputDir(out, subdirs=["01_run", "02_run"]):
        (out / "02_run").mkdir()
        (out / "02_run" / "summary.json").write_text("new")
    assert not (out / "01_run").exists() and names(out / "02_run") == ["summary.json"]
    assert (out / "mine" / "summary.json").read_text() == "earlier"


def test_a_lock_file_removed_while_being_locked_is_locked_anew(tmp_path, monkeypatch):
    from kvsim.reports import outdir
    real_flock, calls = outdir.fcntl.flock, []

    def flock(fh, op):      # (the holder before leaves between this open and this lock)
        calls.append(fh.name)
        if len(calls) == 1:
            (tmp_path / outdir.LOCK_FILE).unlink()
        real_flock(fh, op)
    monkeypatch.setattr(outdir.fcntl, "flock", flock)
    fh = outdir._lock(tmp_path)
    assert len(calls) == 2 and outdir._same_file(fh, tmp_path / outdir.LOCK_FILE)
    outdir._unlock(tmp_path, fh)
    assert names(tmp_path) == []


def test_a_command_that_succeeds_leaves_no_earlier_result_of_another_kind(tmp_path):
    import json
    out = tmp_path / "o"
    earlier_result(out)                                 # (a run's, and a compare's below)
    (out / "compare.json").write_text(json.dumps({"runs": [{"dir": "01_a"}, {"dir": "../x"}]}))
    (out / "01_a").mkdir()
    (out / "01_a" / "summary.json").write_text("earlier")
    (out / "01_a" / "timeline.csv").write_text("earlier")
    (out / "mine").mkdir()
    (out / "mine" / "summary.json").write_text("the user's")
    with OutputDir(out):                                # (a plan: its own three files)
        for name in ("plan.json", "plan.csv", "report.html"):
            (out / name).write_text("new")
    assert names(out) == ["mine", "notes.txt", "plan.csv", "plan.json", "report.html"]
    assert (out / "mine" / "summary.json").read_text() == "the user's"


def test_a_run_directory_that_is_a_link_is_not_followed(tmp_path):
    import json
    out, victim = tmp_path / "o", tmp_path / "victim"
    out.mkdir()
    victim.mkdir()
    (victim / "summary.json").write_text("the user's")
    (out / "01_a").symlink_to(victim)
    (out / "compare.json").write_text(json.dumps({"runs": [{"dir": "01_a"}]}))
    with OutputDir(out):
        (out / "summary.json").write_text("new")
    assert (victim / "summary.json").read_text() == "the user's"


def test_an_interrupted_compare_leaves_no_empty_run_directories(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(KeyboardInterrupt):
        with OutputDir(out, subdirs=["01_a", "02_b"]):
            (out / "01_a").mkdir()
            (out / "01_a" / "summary.json").write_text("new")
            (out / "02_b").mkdir()
            raise KeyboardInterrupt
    assert not out.exists()


def test_a_hitrate_result_replaces_a_run_and_a_run_replaces_it(tmp_path):
    from kvsim.reports.html import write_hitrate_outputs
    out = tmp_path / "o"
    earlier_result(out)
    rows = [{"policy": "lru", "capacity_blocks": 10, "capacity_tokens": 160, "hit_tokens": 0,
             "hit_rate": 0.0}]
    written = write_hitrate_outputs({"rows": rows, "trace": "t"}, out)
    assert sorted(written) == ["json", "report"]
    assert names(out) == ["hitrate.html", "hitrate.json", "notes.txt"]
    with OutputDir(out):                                # (a run after it)
        for name in FILES:
            (out / name).write_text("new")
    assert names(out) == ["notes.txt", "report.html", "requests.csv", "summary.json"]


def test_a_validation_result_replaces_a_run_and_is_named_by_kvsim_report(tmp_path):
    pytest.importorskip("torch")
    from kvsim.errors import KvsimError
    from kvsim.real_backend.validate_report import write_outputs
    from kvsim.reports.io import read_run_outputs
    out = tmp_path / "o"
    earlier_result(out)
    write_outputs(out, {"metrics": []}, html=False)
    assert names(out) == ["notes.txt", "validation.json"]
    with pytest.raises(KvsimError, match=r"holds a kvsim validate result \(validation.json\), "
                                         "not a run's: its validation.html is the report"):
        read_run_outputs(out)


def test_a_file_named_like_another_commands_is_kvsims_only_beside_that_commands_last_file(
        tmp_path):
    """The user's plan.csv, with no plan.json beside it, is no plan: a run leaves it (it
    deleted it); a plan's plan.csv (its plan.json there) goes."""
    out = tmp_path / "o"
    out.mkdir()
    (out / "plan.csv").write_text("the user's")
    with OutputDir(out):
        (out / "summary.json").write_text("new")
    assert names(out) == ["plan.csv", "summary.json"]
    (out / "plan.json").write_text("{}")
    with OutputDir(out):
        (out / "summary.json").write_text("newer")
    assert names(out) == ["summary.json"]


def test_a_file_the_disk_cannot_hold_is_named_and_leaves_nothing_behind(tmp_path):
    """A full disk raises an error that names no file: kvsim's names the one it was
    writing (the command line prints it), and neither it nor its temporary file is left."""
    import errno
    from kvsim.output_file import replacing
    target = tmp_path / "requests.csv"
    with pytest.raises(OSError) as failed:
        with replacing(target) as fh:
            fh.write("request_id\n")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert (failed.value.errno, failed.value.filename) == (errno.ENOSPC, str(target))
    assert names(tmp_path) == []


def test_a_directory_where_the_command_writes_a_file_is_refused_before_the_work(tmp_path):
    """``summary.json`` being a folder was found only when the run was over (exit 1)."""
    from kvsim.errors import KvsimError
    out = tmp_path / "o"
    (out / "summary.json").mkdir(parents=True)
    with pytest.raises(KvsimError) as refused:
        with OutputDir(out, writes=("requests.csv", "summary.json")):
            raise AssertionError("no work starts")
    assert refused.value.one_line() == (
        f"{out}/summary.json: field 'out': is a directory, where the command writes its file "
        "of that name: move it, or give another directory")
    with OutputDir(out, writes=("report.html",)):     # (not a file this command writes)
        pass
    assert names(out) == ["summary.json"]
