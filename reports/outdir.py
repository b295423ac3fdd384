"""An ``--out`` directory owned by one command while it runs.

:class:`OutputDir` checks the directory before any work starts (it may not be a file, and it
must be creatable and writable) and takes an exclusive lock on it (a second kvsim process on the
same directory fails at once). A directory holds one command's result at a time:

- a command that succeeds removes every earlier kvsim result it did not write again: result
  files of any command (:data:`~kvsim.reports.frames.RESULT_FILES`) whose command's last file
  is there (:data:`~kvsim.reports.frames.RESULT_GROUPS`), and the run directories of
  an earlier compare (those its ``compare.json`` names), so a run into a compare's directory
  leaves no stale runs beside it, nor a compare stale run files;
- a command that ends in an error or an interrupt before writing leaves the directory as it
  found it (an earlier result stays whole); a compare's runs write their own directories one
  by one as they finish (``subdirs``), so a compare moves the earlier result aside when it
  starts (into :data:`EARLIER_DIR`) and puts it back if it does not finish;
- one that ends so after it began writing removes every result file, its own and the earlier
  ones, so that nothing partial is left looking complete.

Files and folders of the user's own (any other name) are left alone.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path
from stat import S_ISREG
from typing import Iterable

from kvsim.errors import KvsimError
from kvsim.output_file import blocked, refuse_overwriting
from kvsim.reports.frames import COMPARE_FILE, RESULT_FILES, RESULT_GROUPS, RUN_FILES

LOCK_FILE = ".kvsim.lock"
#: Where a compare keeps the earlier result while it runs (emptied when it ends either way).
EARLIER_DIR = ".kvsim-earlier"
#: The directories that received a complete result in this process (an interrupt that comes
#: after says so rather than "no result was written").
completed: list[Path] = []


class OutputDir:
    """``with OutputDir(path) as out: ...``; ``subdirs``: the run directories the command
    writes there (a compare); ``option``: what the user gave ``path`` as, for the errors
    (``--out``, or a Python argument such as ``out_dir``)."""

    def __init__(self, path: str | os.PathLike, subdirs: Iterable[str] = (),
                 option: str = "--out", reads=(), writes=()) -> None:
        self.given = os.fspath(path)
        self.option = option
        self.reads = [r for r in reads if r is not None]    # the command's input files
        self.writes = tuple(writes)         # the names of the files it writes there
        self.path = Path(path)
        self.subdirs = sorted(set(subdirs))  # results also live in these (a compare's runs)
        self._owned = list(self.subdirs)     # and those of the compare found there
        self.left = ""              # what an aborted command left behind, in words
        self._lock = None
        self._created = False
        self._before: dict[Path, tuple] = {}    # the result files found, by their stat
        self._aside: list[Path] = []            # those a compare moved to EARLIER_DIR
        self._stranded: list[Path] = []         # those of them that could not go back

    def __enter__(self) -> "OutputDir":
        if not self.given.strip():
            raise KvsimError(f"is empty; {self.option} needs a directory",
                             location=self.option)
        check_writable_dir(self.path, self.option)
        self._check_inputs()
        self._created = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock = _lock(self.path, self.option)
        except OSError as e:
            raise KvsimError(f"cannot use it as the output directory: {e.strerror}",
                             location=str(self.path), field=_field(self.option)) from None
        for tmp in self.path.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        self._owned = sorted({*self.subdirs, *earlier_run_dirs(self.path)})
        self._recover_aside()       # (then again: a compare.json put back names its runs)
        self._owned = sorted({*self.subdirs, *earlier_run_dirs(self.path)})
        self._before = self._earlier()
        if self.subdirs:    # (its runs rewrite their own directories one by one: an earlier
            try:            # result would mix with them if this one died)
                self._set_aside()
            except BaseException:
                self._put_back()
                if not self._stranded:
                    shutil.rmtree(self.path / EARLIER_DIR, ignore_errors=True)
                _unlock(self.path, self._lock)
                raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        began = False
        try:
            if exc_type is None:
                self._remove(p for p, stat in self._before.items() if _stat(p) == stat)
                self._prune(set(self._owned) - set(self.subdirs))
                completed.append(self.path)
            else:
                began = self._results() != self._before     # (then nothing partial stays)
                self._remove(self._results() if began else ())
                self._prune(self._owned)      # (those left empty: a compare's new ones too)
                for tmp in self.path.glob(".*.tmp"):
                    tmp.unlink(missing_ok=True)
                self._put_back()
            if not self._stranded:
                shutil.rmtree(self.path / EARLIER_DIR, ignore_errors=True)
        finally:
            _unlock(self.path, self._lock)
        if exc_type is None:
            return
        if self._created and not any(self.path.iterdir()):
            self.path.rmdir()
        self.left = self._left(began)
        if exc is not None:
            exc.left = self.left

    def _check_inputs(self) -> None:
        """Refuse a directory where a file the command writes (``writes``; its run
        directories' :data:`RUN_FILES`) is a directory (found only at the end, after the
        work), or where the command would write or remove one of its own input files (a trace
        named ``requests.csv`` in ``--out``, or an earlier result's file)."""
        field = _field(self.option)
        for name in self.writes:
            if (self.path / name).is_dir():
                raise KvsimError("is a directory, where the command writes its file of that "
                                 "name: move it, or give another directory",
                                 location=str(self.path / name), field=field)
        if not self.reads or not self.path.is_dir():
            return
        self._owned = sorted({*self.subdirs, *earlier_run_dirs(self.path)})
        touched = [self.path / name for name in self.writes]
        touched += [self.path / run / name for run in self.subdirs for name in RUN_FILES]
        for path in [*touched, *self._earlier()]:
            refuse_overwriting(path, self.reads, field)

    def _left(self, began: bool) -> str:
        """What the aborted command left, in words."""
        if not self.path.exists():
            return "nothing was written"
        if self._stranded:
            return (f"{self.path}/ holds no result; its earlier one could not all be put back "
                    f"and is in {self.path / EARLIER_DIR}/")
        if began and not self._aside:
            return f"{self.path}/ holds no result (nothing partial left)"
        if self._before or self._aside:
            return f"{self.path}/ is as it was (its earlier result kept)"
        return "nothing was written"

    def _results(self) -> dict[Path, tuple]:
        """The result files there now, each with its stat (a rewritten file's differs): those
        of any command, and a run's in each run directory of a compare."""
        paths = [self.path / name for name in RESULT_FILES]
        paths += [self.path / run / name for run in self._owned for name in RUN_FILES
                  if not (self.path / run).is_symlink()]    # (its files lie elsewhere)
        return {p: stat for p in paths if (stat := _stat(p)) is not None}

    def _earlier(self) -> dict[Path, tuple]:
        """:meth:`_results` of an earlier kvsim command: a file named as another command's is
        kept when that command's last file is not there (the user's own ``plan.csv`` beside
        no ``plan.json`` is no plan)."""
        names = {name for last, files in RESULT_GROUPS if (self.path / last).is_file()
                 for name in files}
        return {p: stat for p, stat in self._results().items()
                if p.parent != self.path or p.name in names}

    def _set_aside(self) -> None:
        """Move the earlier result into :data:`EARLIER_DIR` (same file system: renames)."""
        for path in self._before:
            aside = self.path / EARLIER_DIR / path.relative_to(self.path)
            aside.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, aside)
            self._aside.append(path)
        self._before = {}
        self._prune(self._owned)

    def _put_back(self) -> None:
        """Return the earlier result :meth:`_set_aside` moved (this command left nothing);
        a file that cannot go back (its place taken, a disk error) stays aside, noted in
        ``_stranded``, and the others still go back."""
        for path in self._aside:
            try:
                if path.exists():
                    raise FileExistsError(path)
                path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.path / EARLIER_DIR / path.relative_to(self.path), path)
            except OSError:
                self._stranded.append(path)

    def _recover_aside(self) -> None:
        """A result a compare killed hard (SIGKILL, out of memory) left aside goes back when
        the directory holds no result, else (a newer one is there) it goes."""
        earlier = self.path / EARLIER_DIR
        if not earlier.is_dir():
            return
        if not self._results():
            for aside in sorted(p for p in earlier.rglob("*") if p.is_file()):
                path = self.path / aside.relative_to(earlier)
                path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(aside, path)
        shutil.rmtree(earlier, ignore_errors=True)

    def _prune(self, runs) -> None:
        """Remove those of the run directories ``runs`` left empty."""
        for run in runs:
            if not (self.path / run).is_symlink():
                try:
                    (self.path / run).rmdir()
                except OSError:
                    pass        # (gone already, or holding the user's own files)

    @staticmethod
    def _remove(paths) -> None:
        for path in list(paths):
            path.unlink(missing_ok=True)


def earlier_run_dirs(path: Path) -> list[str]:
    """The run directories the compare result in ``path`` names (its ``compare.json``; none if
    there is none or it cannot be read), each a plain name inside ``path``."""
    try:
        runs = json.loads((path / COMPARE_FILE).read_text())["runs"]
        names = [run["dir"] for run in runs]
    except (OSError, ValueError, TypeError, KeyError):
        return []
    return [n for n in names if isinstance(n, str) and n not in ("", ".", "..")
            and Path(n).name == n]


def _stat(path: Path) -> tuple | None:
    """``path``'s identity and last change (None if it is not a file)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size) if S_ISREG(st.st_mode) else None


def check_writable_dir(path: Path, option: str = "--out") -> None:
    """A :class:`KvsimError` unless ``path`` (given as ``option``) is (or can be made) a
    writable directory."""
    if path.exists() and not path.is_dir():
        raise KvsimError(f"exists and is not a directory; {option} needs a directory",
                         location=str(path), field=_field(option))
    why = blocked(path)
    if why:
        raise KvsimError(why, location=str(path), field=_field(option))


def _field(option: str) -> str:
    """The field an error names for ``option``: ``out`` for ``--out``, else the argument."""
    return option.removeprefix("--").replace("-", "_")


def _lock(path: Path, option: str = "--out"):
    """An exclusive lock on ``path``'s lock file, held open. The file is locked, then checked to
    be the one the name still points at (the holder before may have removed it meanwhile)."""
    for _ in range(100):
        fh = open(path / LOCK_FILE, "a")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise KvsimError("another kvsim process is writing to this directory; wait for it "
                             f"or choose another {option}", location=str(path),
                             field=_field(option)) from None
        if _same_file(fh, path / LOCK_FILE):
            return fh
        fh.close()          # (removed by the holder that just left: lock the new one)
    raise KvsimError("cannot lock it: its lock file keeps changing", location=str(path),
                     field=_field(option))


def _same_file(fh, path: Path) -> bool:
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    mine = os.fstat(fh.fileno())
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _unlock(path: Path, fh) -> None:
    """Remove the lock file, then give the lock up (a process that opened the file before and
    locks it now finds it removed: :func:`_lock` then tries again, on a new file)."""
    if fh is None:
        return
    (path / LOCK_FILE).unlink(missing_ok=True)
    fh.close()
