"""Reading and writing result files, atomically.

Every writer goes through :func:`kvsim.output_file.replacing` (a temporary file in the
target's own directory, then ``os.replace``), so a reader sees either the previous complete
file or the new complete file, never a partial one. :func:`read_run_outputs` reads a run
directory back, checked against the output contract (:mod:`kvsim.reports.frames`); writing
one, every file in its order, is :func:`kvsim.reports.run_outputs.write_run_outputs` (above
this module: it renders the HTML).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from kvsim.errors import KvsimError
from kvsim.output_file import replacing
from kvsim.reports.columns import Columns, as_frame, is_missing
from kvsim.reports.downsampling import DEFAULT_MAX_POINTS, downsample  # noqa: F401 (its old home)
from kvsim.reports.frames import (COMPARE_FILE, HITRATE_FILE, HITRATE_REPORT, INTEGER, NUMBER,
                                  NUMBER_COLUMNS, OBJECT, PHASE_COLUMNS, PLAN_FILE, REPORT_FILE,
                                  REQUEST_COLUMNS, REQUESTS_FILE, SUMMARY_FILE, SUMMARY_OPTIONAL,
                                  SUMMARY_SHAPE, TEXT, TIMELINE_COLUMNS, TIMELINE_FILE,
                                  VALIDATION_FILE, VALIDATION_REPORT, add_phase_columns)

if TYPE_CHECKING:      # (pandas is loaded where a DataFrame is read or written)
    import pandas as pd


# --- atomic writers ----------------------------------------------------------------------------

def _atomic_write(path: str | os.PathLike, write: Callable[[Any], None], *, binary: bool) -> Path:
    """Create ``path`` by calling ``write(fileobj)`` (:func:`kvsim.output_file.replacing`: on
    any exception the target is left untouched)."""
    with replacing(path, binary=binary) as fh:
        write(fh)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    return _atomic_write(path, lambda fh: fh.write(text), binary=False)


def to_jsonable(value: Any) -> Any:
    """Turn numpy scalars/arrays, tuples and paths into JSON types; NaN and ±inf become None."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [to_jsonable(v) for v in value.tolist()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if value is None or isinstance(value, str):
        return value
    if is_missing(value):
        return None
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def dumps_json(obj: Any) -> str:
    """Serialise ``obj`` deterministically: sorted keys, 2-space indent, shortest round-trip
    float repr (``repr``), non-finite numbers as ``null``, trailing newline."""
    return json.dumps(to_jsonable(obj), indent=2, sort_keys=True, allow_nan=False) + "\n"


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as JSON (see :func:`dumps_json`) to ``path`` atomically."""
    text = dumps_json(obj)  # serialise before touching the disk: a bad value writes nothing
    return write_text_atomic(path, text)


def write_csv_atomic(path: str | os.PathLike, df: pd.DataFrame | Columns, *,
                     float_format: str | None = None) -> Path:
    """Write ``df`` (a DataFrame or :class:`Columns`) as CSV (no index column) to ``path``
    atomically: the bytes of pandas' ``to_csv``, built column by column,
    :data:`CSV_CHUNK_ROWS` rows at a time, where every column is numbers, booleans or text
    (several times faster on a long run's requests, in memory that does not grow with them),
    else by pandas itself."""
    def write(fh) -> None:
        if float_format is None:
            try:
                fh.writelines(csv_chunks(df, CSV_CHUNK_ROWS))
                return
            except _NotByColumn:        # (found part-way: pandas writes the file again)
                fh.seek(0)
                fh.truncate()
        as_frame(df).to_csv(fh, index=False, float_format=float_format, lineterminator="\n")
    return _atomic_write(path, write, binary=False)


#: Rows of a frame :func:`csv_chunks` turns into text at a time.
CSV_CHUNK_ROWS = 10_000


class _NotByColumn(Exception):
    """A frame the column-by-column writer does not cover."""


def csv_text(df: pd.DataFrame | Columns) -> str | None:
    """``df.to_csv(index=False, lineterminator="\\n")``, or None for a frame it does not
    cover (a column of another type, text that is not ``str``, a single column)."""
    try:
        return "".join(csv_chunks(df))
    except _NotByColumn:
        return None


def csv_chunks(df: pd.DataFrame | Columns, rows: int | None = None):
    """The text of :func:`csv_text`, the header and then ``rows`` rows at a time; raises
    :class:`_NotByColumn` (when it is reached) for a frame it does not cover."""
    if len(df.columns) < 2:
        raise _NotByColumn
    rows = rows or CSV_CHUNK_ROWS
    yield ",".join(_quoted(str(name)) for name in df.columns) + "\n"
    for start in range(0, len(df), rows):
        part = df.rows(slice(start, start + rows)) if isinstance(df, Columns) \
            else df.iloc[start:start + rows]
        fields = [_csv_fields(part[name]) for name in df.columns]
        if any(column is None for column in fields):
            raise _NotByColumn
        yield "".join([",".join(row) + "\n" for row in zip(*fields)])


def _csv_fields(column) -> list[str] | None:
    """The CSV fields of one column (a numpy array or a pandas Series) as pandas writes them
    (``repr`` of floats, empty for missing values), or None when it is not a column of
    numbers, booleans or text."""
    kind = column.dtype.kind
    if not isinstance(column.dtype, np.dtype):      # pandas' own types: only its text
        kind = "O" if kind == "O" else "?"
    if kind == "f":
        if column.dtype != np.float64:      # numpy prints narrower floats shorter
            return None
        values = np.asarray(column)
        fields = list(map(float.__repr__, values.tolist()))
        return ["" if f == "nan" else f for f in fields] if np.isnan(values).any() else fields
    if kind in "iu":
        return list(map(int.__repr__, column.tolist()))
    if kind == "b":
        return list(map(str, column.tolist()))
    if kind != "O":
        return None
    fields = []
    for value in column.tolist():
        if is_missing(value):
            fields.append("")
        elif value.__class__ is str:
            fields.append(_quoted(value))
        else:
            return None
    return fields


def _quoted(text: str) -> str:
    """A text field as the ``csv`` module writes it (quoted when it holds a comma, a quote or
    a newline)."""
    if "," in text or '"' in text or "\n" in text:
        return '"' + text.replace('"', '""') + '"'
    return text


# --- a run's output directory --------------------------------------------------------------------

def require_parquet() -> None:
    """A one-line :class:`KvsimError` unless pyarrow (Parquet support) is installed."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise KvsimError("Parquet output needs pyarrow: pip install 'kvsim[parquet]' (or "
                         "pip install pyarrow)", field="output_format") from None


def write_parquet_atomic(path: str | os.PathLike, df: pd.DataFrame | Columns) -> Path:
    """Write ``df`` (a DataFrame or :class:`Columns`) as Parquet (pyarrow, no index) to
    ``path`` atomically."""
    require_parquet()
    df = as_frame(df)
    return _atomic_write(path, lambda fh: df.to_parquet(fh, index=False, engine="pyarrow"),
                         binary=True)


def _read_frame(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """``path`` (a .csv), or the .parquet beside it when only that exists, checked by
    :func:`_check_frame`."""
    import pandas as pd
    parquet = path.with_suffix(".parquet")
    if path.is_file() or not parquet.is_file():
        return _check_frame(_read_csv(path), columns, path)
    require_parquet()
    try:
        df = pd.read_parquet(parquet, engine="pyarrow")
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise KvsimError(f"not a readable Parquet file ({' '.join(str(e).split())})",
                         location=str(parquet)) from None
    return _check_frame(df, columns, parquet)


def _ends_a_line(path: Path) -> bool:
    """Whether ``path`` is empty or ends with a line end (as every CSV kvsim writes)."""
    with open(path, "rb") as fh:
        if fh.seek(0, os.SEEK_END) == 0:
            return True
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) in (b"\n", b"\r")


def _read_csv(path: Path) -> pd.DataFrame:
    import pandas as pd
    if not path.is_file():
        raise KvsimError("no such file: is this a kvsim run directory?", location=str(path))
    if not _ends_a_line(path):
        raise KvsimError("ends in the middle of a row: the file was cut short", location=str(path))
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise KvsimError("empty file, expected a CSV header", location=str(path)) from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
        raise KvsimError(f"not a readable CSV ({e})".replace("\n", " "),
                         location=str(path)) from None


def _check_frame(df: pd.DataFrame, columns: tuple[str, ...], source: Path) -> pd.DataFrame:
    """``df`` when it has ``columns``, and numbers in those of its contract's columns that
    hold numbers; else a KvsimError naming ``source`` and what is missing or not a number."""
    import pandas as pd
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise KvsimError(f"missing columns: {', '.join(missing)}", location=str(source))
    for column in df.columns.intersection(list(NUMBER_COLUMNS)):
        if not len(df) or pd.api.types.is_numeric_dtype(df[column]):
            continue
        numbers = pd.to_numeric(df[column], errors="coerce")
        bad = np.flatnonzero(numbers.isna() & df[column].notna())
        if len(bad):
            raise KvsimError(f"expected a number, got {_shown(df[column].iloc[bad[0]])} in "
                             f"row {bad[0] + 1}", location=str(source), field=str(column))
        df[column] = numbers        # (numbers stored as text: Parquet)
    return df


def _shown(value: Any) -> str:
    """``value`` as it reads in JSON, cut to 40 characters."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


# --- summary.json, as a report reads it ---------------------------------------------------------

_KINDS = {INTEGER: lambda v: isinstance(v, int) and not isinstance(v, bool),
          NUMBER: lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
          TEXT: lambda v: isinstance(v, str), OBJECT: lambda v: isinstance(v, dict)}


def check_summary(summary: dict, path: str | os.PathLike) -> dict:
    """``summary`` when it has :data:`SUMMARY_SHAPE`, else a KvsimError naming ``path`` and
    the first key that is missing or holds a value of another kind."""
    _check_object(summary, SUMMARY_SHAPE, "", str(path))
    return summary


def _check_object(obj: dict, shape: dict, prefix: str, where: str) -> None:
    for key, kind in shape.items():
        field, value = prefix + key, obj.get(key)
        if value is None and (field in SUMMARY_OPTIONAL or (key in obj and kind == NUMBER)):
            continue
        expected = OBJECT if isinstance(kind, dict) else kind
        if key not in obj:
            raise KvsimError(f"missing, expected {expected}", location=where, field=field)
        if not _KINDS[expected](value):
            raise KvsimError(f"expected {expected}, got {_shown(value)}", location=where,
                             field=field)
        if isinstance(kind, dict):
            _check_object(value, kind, field + ".", where)


def read_summary(path: str | os.PathLike) -> dict:
    """Read a ``summary.json``; a missing, unparsable or non-object file is a KvsimError."""
    p = Path(path)
    if not p.is_file():
        raise KvsimError("no such file: the run is incomplete or this is not a kvsim run "
                         "directory", location=str(p))
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise KvsimError(f"not valid JSON ({e})", location=str(p)) from None
    if not isinstance(data, dict):
        raise KvsimError("expected a JSON object", location=str(p))
    return data


def read_run_outputs(out_dir: str | os.PathLike) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """Read ``(summary, requests, timeline)`` back from a run directory, checked against the
    output contract as the run report reads it (:func:`check_summary`, :func:`_check_frame`):
    a KvsimError names the file missing or unreadable, the columns a frame lacks, or the
    field missing or of the wrong kind."""
    out = Path(out_dir)
    if not out.is_dir():
        raise KvsimError("not a directory; expected a kvsim run directory (kvsim run --out)"
                         if out.exists() else "no such run directory", location=str(out))
    for kind, found, page in (("kvsim compare", COMPARE_FILE, REPORT_FILE),
                              ("kvsim plan", PLAN_FILE, REPORT_FILE),
                              ("kvsim validate", VALIDATION_FILE, VALIDATION_REPORT),
                              ("kvsim hitrate", HITRATE_FILE, HITRATE_REPORT)):
        if not (out / SUMMARY_FILE).exists() and (out / found).is_file():
            raise KvsimError(f"holds a {kind} result ({found}), not a run's: its {page} is "
                             "the report" + ("; kvsim report takes one of its run "
                                             "directories" if found == COMPARE_FILE else ""),
                             location=str(out))
    summary = check_summary(read_summary(out / SUMMARY_FILE), out / SUMMARY_FILE)
    older = tuple(c for c in REQUEST_COLUMNS     # (before the phases and trace lines)
                  if c not in PHASE_COLUMNS and c != "trace_line")
    requests = _read_frame(out / REQUESTS_FILE, older)
    if "trace_line" not in requests.columns:
        requests.insert(1, "trace_line", 0)
    if not set(PHASE_COLUMNS) <= set(requests.columns):
        requests = add_phase_columns(requests)[list(REQUEST_COLUMNS)]
    if isinstance(summary.get("num_requests"), int) and len(requests) != summary["num_requests"]:
        raise KvsimError(f"holds {len(requests):,} requests; summary.json counts "
                         f"{summary['num_requests']:,} (a file cut short, or of another run)",
                         location=str(out / REQUESTS_FILE))
    timeline = _read_frame(out / TIMELINE_FILE, TIMELINE_COLUMNS)
    steps = summary.get("num_steps")
    if isinstance(steps, int) and len(timeline) and timeline["num_steps"].sum() != steps:
        raise KvsimError(f"holds {int(timeline['num_steps'].sum()):,} steps in all; "
                         f"summary.json counts {steps:,} (a file cut short, or of another run)",
                         location=str(out / TIMELINE_FILE))
    return summary, requests, timeline
