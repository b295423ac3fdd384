"""A result table as named numpy columns: a run's frames without pandas.

``kvsim run`` builds, summarises, writes and draws its ``requests`` and ``timeline`` frames
(docs/frames.md) as :class:`Columns`: equal-length numpy arrays by name, in order. pandas
(about a fifth of a second to import, with pyarrow beside it) is loaded only where a DataFrame
is asked for: the Python API's results, Parquet, ``bench.json``, result files read back.

>>> t = Columns({"time_s": [0.0, 1.0, 2.0], "num_steps": [3, 0, 5]})
>>> len(t), t.columns, t["num_steps"].tolist()
(3, ['time_s', 'num_steps'], [3, 0, 5])
>>> t.rows(t["num_steps"] > 0)["time_s"].tolist()
[0.0, 2.0]
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

import numpy as np


class Columns:
    """Equal-length 1-d numpy arrays by name, in order (read ``t[name]``, ``name in t``,
    ``len(t)`` rows, ``t.columns``), as far as a DataFrame's reading goes."""

    __slots__ = ("_data", "_len")

    def __init__(self, data: Mapping[str, Any]):
        self._data = {str(name): _array(values) for name, values in data.items()}
        lengths = {len(values) for values in self._data.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths: {sorted(lengths)}")
        self._len = lengths.pop() if lengths else 0

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, name: str) -> np.ndarray:
        return self._data[name]

    def __contains__(self, name: object) -> bool:
        return name in self._data

    def get(self, name: str, default=None):
        return self._data.get(name, default)

    @property
    def columns(self) -> list[str]:
        return list(self._data)

    def rows(self, which) -> Columns:
        """The rows ``which`` selects (a boolean mask, a slice or indices), every column."""
        return Columns({name: values[which] for name, values in self._data.items()})

    def to_pandas(self):
        """The same columns as a pandas DataFrame (sharing the arrays)."""
        import pandas as pd
        return pd.DataFrame(self._data, copy=False)


def _array(values) -> np.ndarray:
    """``values`` as a numpy array, text as Python strings (``object``, as pandas keeps it)."""
    array = np.asarray(values)
    return array.astype(object) if array.dtype.kind == "U" else array


def as_frame(frame):
    """``frame`` (a pandas DataFrame, or :class:`Columns`) as a pandas DataFrame."""
    return frame.to_pandas() if isinstance(frame, Columns) else frame


def as_columns(frame) -> Columns:
    """``frame`` (:class:`Columns`, or a pandas DataFrame) as :class:`Columns` (a
    DataFrame's columns as numpy arrays)."""
    if isinstance(frame, Columns):
        return frame
    return Columns({name: frame[name].to_numpy() for name in frame.columns})


def is_missing(value: Any) -> bool:
    """Whether one value of a column is missing: None, a float NaN, or pandas' ``NA`` or
    ``NaT`` (only when pandas is loaded: else no value can be)."""
    if value is None or (value.__class__ is float and value != value):
        return True
    pd = sys.modules.get("pandas")
    return pd is not None and (value is pd.NA or value is pd.NaT)


def numbers(values: np.ndarray) -> np.ndarray:
    """``values`` as floats, NaN where one is not a number (as ``pd.to_numeric(...,
    errors="coerce")`` reads a column of text or missing values)."""
    if values.dtype.kind in "biuf":
        return values.astype(float)
    out = np.full(len(values), np.nan)
    for i, value in enumerate(values.tolist()):
        try:
            out[i] = float(value)
        except (TypeError, ValueError):
            pass
    return out
