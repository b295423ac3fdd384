"""Numbered text lines of a trace file, read as a stream.

Accepts a UTF-8 byte-order mark, CRLF or LF line ends, blank lines (skipped) and gzip
compression (public traces often ship as ``.gz``: read as they are). Rejects a
missing or unreadable file, an empty file, another packing (bzip2, xz, zstd, zip, gzip twice:
named, with how to unpack it) and bytes that are not UTF-8, each with a
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
#: What other packings a file starts with, and how to unpack it (kvsim reads gzip only).
OTHER_PACKINGS = {**{b"BZh" + bytes([c]): ("bzip2", "bzip2 -dc FILE > OUT")
                     for c in b"123456789"},
                  b"\xfd7zXZ\x00": ("xz", "xz -dc FILE > OUT"),
                  b"\x28\xb5\x2f\xfd": ("zstd", "zstd -dc FILE > OUT"),
                  b"PK\x03\x04": ("zip", "unzip -p FILE > OUT")}
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
            if "\r" in text:
                raise TraceError("a line break is a lone CR (classic Mac line ends): "
                                 "end lines with LF or CRLF", location=where(path, line_no))
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
            head = f.peek(8)[:8]
        _check_packing(head, path)
        if not head.startswith(GZIP_MAGIC):
            return open(path, "rb")
        with gzip.open(path, "rb") as f:
            _check_packing(_peek(f), path, inside=True)
        return gzip.open(path, "rb")     # (anew: a cut file's error then shows at its line)
    except FileNotFoundError:
        raise TraceError("no such file", location=where(path)) from None
    except IsADirectoryError:
        raise TraceError("is a directory, not a trace file", location=where(path)) from None
    except OSError as e:
        raise TraceError(f"cannot read: {e.strerror}", location=where(path)) from None


def _check_packing(head: bytes, path: Path, inside: bool = False) -> None:
    """A :class:`TraceError` naming the packing of a file that starts with ``head``, unless it
    is text or gzip (``inside``: ``head`` was unpacked from gzip, so gzip is named too)."""
    packings = {**OTHER_PACKINGS,
                **({GZIP_MAGIC: ("gzip", "gzip -dc FILE > OUT")} if inside else {})}
    for magic, (name, how) in packings.items():
        if head.startswith(magic):
            raise TraceError(f"{name}-compressed{' inside gzip' if inside else ''}; kvsim "
                             f"reads plain text or gzip: unpack it first ({how})",
                             location=where(path))


def _peek(f) -> bytes:
    """The first bytes of an opened gzip file's content (none if it is cut or corrupt: the
    reading says so, at its line)."""
    try:
        return f.peek(8)[:8]
    except (OSError, EOFError, zlib.error):
        return b""


def _decode(raw: bytes, path: Path, line_no: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = raw[e.start:e.start + 1].hex()
        raise TraceError(f"not UTF-8 text (byte 0x{bad} at column {e.start + 1})",
                         location=where(path, line_no)) from None
