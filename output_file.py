"""Writing one output file so that it appears whole or not at all.

:func:`replacing` is the one way kvsim writes a file: into a temporary file beside the
target, renamed over it once complete (so a reader never sees half a file, and an error or an
interrupt leaves the target as it was). A target that exists and is not a regular file (a
device such as ``/dev/null``, a named pipe) or is a link (``/dev/stdout``) is written
directly instead: renaming over it would replace the device or the link with a file. A target that is a directory, or an empty path, is bad
input: a :class:`~kvsim.errors.KvsimError`.
"""

from __future__ import annotations

import os
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from kvsim.errors import KvsimError


@contextmanager
def replacing(path: str | os.PathLike, binary: bool = False) -> Iterator[IO]:
    """``with replacing(path) as fh: fh.write(...)``: ``path`` is replaced by what was written
    once the block ends without an exception (text: UTF-8, newlines as written); missing
    parent directories are created, as for every ``--out``."""
    target = _checked(path)
    mode, kwargs = ("wb", {}) if binary else ("w", {"encoding": "utf-8", "newline": ""})
    if _is_special(target):
        with open(target, mode, **kwargs) as fh:
            yield fh
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # mode honours umask
    except OSError as e:
        why = blocked(target.parent)    # (a file where a folder must be: say which)
        raise KvsimError(why or f"cannot write there: {e.strerror}", location=str(target),
                         field="out") from None
    try:
        with os.fdopen(fd, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except OSError as e:        # (a full disk names no file: say which one was being written)
        tmp.unlink(missing_ok=True)
        if e.filename is None:
            raise OSError(e.errno, e.strerror, str(target)) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_output_file(path: str | os.PathLike, field: str = "out", reads=()) -> Path:
    """``path`` as a :class:`Path`, checked before a long command starts (``field``: its
    option): refused when it is empty, names a directory, is one of the files the command
    ``reads`` (None entries skipped), or lies under a file or a directory that cannot be
    written to."""
    target = _checked(path, field)
    refuse_overwriting(target, reads, field)
    why = blocked(target.parent)
    if why:
        raise KvsimError(why, location=str(target), field=field)
    return target


def refuse_overwriting(target: Path, reads, field: str = "out") -> None:
    """A :class:`~kvsim.errors.KvsimError` when ``target`` is the same file as one of
    ``reads`` (the command's inputs; None entries skipped): writing it would destroy what the
    command reads, often a recording that cannot be made again."""
    for source in reads:
        if source is not None and _same_file(target, source):
            raise KvsimError("this command reads that file, and writing there would replace "
                             "it: give another path", location=str(target), field=field)


def _same_file(a: Path, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):      # (one of them missing: not the same file)
        return False


def blocked(folder: Path) -> str | None:
    """Why nothing can be written in ``folder`` (made first where missing), or None: the
    nearest existing ancestor is a file, or not writable."""
    probe = folder
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"cannot create it: {probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"cannot write there: {probe} is not writable"
    return None


def _checked(path: str | os.PathLike, field: str = "out") -> Path:
    """``path`` as a :class:`Path`, refused when it is empty or names a directory."""
    if not os.fspath(path).strip():
        raise KvsimError("an empty path; give a file to write", field=field)
    target = Path(path)
    if target.is_dir():
        raise KvsimError("is a directory; give a file to write", location=str(target),
                         field=field)
    return target


def _is_special(target: Path) -> bool:
    """Whether ``target`` exists and is not a regular file (a device, a pipe, a socket), or is
    a link (``/dev/stdout``: renaming over it would replace the link)."""
    try:
        return target.is_symlink() or not stat.S_ISREG(target.stat().st_mode)
    except OSError:
        return False
