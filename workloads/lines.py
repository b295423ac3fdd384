"""Numbered text lines of a trace file, read as a stream.

Accepts a UTF-8 byte-order mark, CRLF or LF line ends, blank lines (skipped) and gzip
compression (public traces often ship as ``.gz``: read as they are). Rejects a
missing or unreadable file, an empty file and bytes that are not UTF-8, each with a
:class:`~kvsim.errors.TraceError` that names the file and line.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import Iterator

from kvsim.errors import TraceError
from kvsim.workloads.bundled import shown

BOM = b"\xef\xbb\xbf"
GZIP_MAGIC = b"\x1f\x8b"
MAX_LINE_BYTES = 64 << 20
"""Longest line read (64 MiB: a prompt of ~8M token ids); a longer one is taken for corrupt
data (``/dev/zero``, a binary file) instead of being read into memory whole."""


def where(path, line_no: int | None = None) -> str:
    """``file:line`` (or just ``file``) as errors print it (a bundled sample by its name)."""
    return shown(path) if line_no is None else f"{shown(path)}:{line_no}"


def numbered_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` for every non-blank line, 1-based, line end stripped.

    Raises :class:`TraceError` for a missing file, an empty file (no non-blank line) or a line
    that is not valid UTF-8. The file is read lazily, one line at a time.
    """
    path = Path(path)
    empty, line_no = True, 0
    with _open(path) as f:
        for line_no, raw in enumerate(_raw_lines(f, path), start=1):
            if line_no == 1 and raw.startswith(BOM):
                raw = raw[len(BOM):]
            text = _decode(raw, path, line_no).rstrip("\r\n")
            if text.strip():
                empty = False
                yield line_no, text
    if empty:
        raise TraceError("empty trace: the file has no lines" if line_no == 0 else
                         "empty trace: every line of the file is blank", location=where(path))


def _raw_lines(f, path: Path) -> Iterator[bytes]:
    """The file's lines as bytes, each at most :data:`MAX_LINE_BYTES`; read errors (a failing
    disk, a vanished network file) become one :class:`TraceError`."""
    line_no = 0
    while True:
        line_no += 1
        try:
            raw = f.readline(MAX_LINE_BYTES + 1)
        except (OSError, EOFError, zlib.error) as e:    # (a failing disk, a cut gzip file)
            raise TraceError(f"read error: {getattr(e, 'strerror', None) or e}",
                             location=where(path, line_no)) from None
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise TraceError(f"line longer than {MAX_LINE_BYTES:,} bytes; not a trace file?",
                             location=where(path, line_no))
        yield raw


def _open(path: Path):
    """The file's bytes; a gzip file's (found by its magic number) uncompressed."""
    try:
        with open(path, "rb") as f:
            packed = f.peek(2)[:2] == GZIP_MAGIC
        return gzip.open(path, "rb") if packed else open(path, "rb")
    except FileNotFoundError:
        raise TraceError("no such file", location=where(path)) from None
    except IsADirectoryError:
        raise TraceError("is a directory, not a trace file", location=where(path)) from None
    except OSError as e:
        raise TraceError(f"cannot read: {e.strerror}", location=where(path)) from None


def _decode(raw: bytes, path: Path, line_no: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = raw[e.start:e.start + 1].hex()
        raise TraceError(f"not UTF-8 text (byte 0x{bad} at column {e.start + 1})",
                         location=where(path, line_no)) from None
