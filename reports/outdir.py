"""An ``--out`` directory owned by one command while it runs.

:class:`OutputDir` checks the directory before any work starts (it may not be a file, and it
must be creatable and writable), takes an exclusive lock on it (a second kvsim process on the
same directory fails at once), removes the result files of an earlier run (a directory that
holds ``summary.json`` holds one run's files only), and, if the command ends in an error or an
interrupt, removes what it had written so that nothing partial is left looking complete.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from kvsim.errors import KvsimError

LOCK_FILE = ".kvsim.lock"


class OutputDir:
    """``with OutputDir(path, files) as out: ...``; ``files`` are the names a complete result
    consists of (and that an earlier result's are removed by)."""

    def __init__(self, path: str | os.PathLike, files: tuple[str, ...],
                 subdirs: bool = False) -> None:
        self.path = Path(path)
        self.files = files
        self.subdirs = subdirs      # results also live in sub-directories (compare, plan)
        self.left = ""              # what an aborted command left behind, in words
        self._lock = None
        self._created = False

    def __enter__(self) -> "OutputDir":
        check_writable_dir(self.path)
        self._created = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock = _lock(self.path)
        except OSError as e:
            raise KvsimError(f"cannot use it as the output directory: {e.strerror}",
                             location=str(self.path), field="out") from None
        self._clear()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is not None:
                self._clear()
        finally:
            _unlock(self.path, self._lock)
        if exc_type is None:
            return
        if self._created and not any(self.path.iterdir()):
            self.path.rmdir()
        self.left = (f"{self.path}/ holds no result (nothing partial left)"
                     if self.path.exists() else "nothing was written")
        if exc is not None:
            exc.left = self.left

    def _clear(self) -> None:
        for name in self.files:
            (self.path / name).unlink(missing_ok=True)
        for tmp in self.path.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        if self.subdirs:
            for child in self.path.iterdir():
                if child.is_dir() and (child / "summary.json").is_file():
                    (child / "summary.json").unlink()


def check_writable_dir(path: Path) -> None:
    """A :class:`KvsimError` unless ``path`` is (or can be made) a writable directory."""
    if path.exists() and not path.is_dir():
        raise KvsimError("exists and is not a directory; --out needs a directory",
                         location=str(path), field="out")
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise KvsimError(f"cannot create it: {probe} is not a directory", location=str(path),
                         field="out")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise KvsimError(f"cannot write there: {probe} is not writable", location=str(path),
                         field="out")


def _lock(path: Path):
    fh = open(path / LOCK_FILE, "a")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise KvsimError("another kvsim process is writing to this directory; wait for it or "
                         "choose another --out", location=str(path), field="out") from None
    return fh


def _unlock(path: Path, fh) -> None:
    if fh is None:
        return
    (path / LOCK_FILE).unlink(missing_ok=True)
    fh.close()
