"""Where a trace comes from: a file, standard input, or a bundled sample (``sample:NAME``).

Every command and the Python API name a trace the same way; :func:`resolve_trace` turns the
name into a file to read and the label results carry.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from kvsim.errors import TraceError
from kvsim.workloads.bundled import sample_path
from kvsim.workloads.request import trace_name

DEFAULT_SAMPLE = "mooncake"


def resolve_trace(trace: str | None) -> tuple[Path, str]:
    """The trace file to read and its label: ``sample:NAME`` for a bundled sample, ``-`` for
    standard input (copied to a temporary file, so it can be read more than once), else a
    path, which must be a regular file (not a FIFO, a device or a directory)."""
    if trace is None:
        return sample_path(DEFAULT_SAMPLE), f"sample:{DEFAULT_SAMPLE}"
    if not trace.strip():
        raise TraceError("is empty: give a trace file, - for standard input, or sample:NAME "
                         "(or no trace for the default sample)", field="trace")
    if trace.startswith("sample:"):
        return sample_path(trace.split(":", 1)[1]), trace
    if trace == "-":
        return _stdin_copy(), "-"
    check_regular_file(trace)
    return Path(trace), trace


#: The temporary file a trace read from stdin (``-``) was copied to, once it was.
_stdin_copies: list[str] = []


def _stdin_copy() -> Path:
    import atexit
    import shutil
    import tempfile
    with tempfile.NamedTemporaryFile("wb", prefix="kvsim-stdin-", suffix=".trace",
                                     delete=False) as fh:
        atexit.register(os.unlink, fh.name)
        shutil.copyfileobj(sys.stdin.buffer, fh)
    _stdin_copies.append(fh.name)
    return Path(fh.name)


def naming_stdin(message: str) -> str:
    """``message`` with the copy of a trace read from stdin called ``<stdin>``, as the user
    gave it."""
    for path in _stdin_copies:
        message = message.replace(path, trace_name("-"))
    return message


def check_regular_file(path: str | os.PathLike, what: str = "trace file") -> None:
    """A :class:`TraceError` unless ``path`` is an existing regular file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise TraceError("no such file", location=str(path)) from None
    except OSError as e:
        raise TraceError(f"cannot read: {e.strerror}", location=str(path)) from None
    if stat.S_ISDIR(mode):
        raise TraceError(f"is a directory, not a {what}", location=str(path))
    if not stat.S_ISREG(mode):
        raise TraceError("not a regular file (a FIFO or device?); give a file, or '-' for "
                         "standard input", location=str(path))
