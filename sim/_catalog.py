"""Reading the packaged JSON data files (``catalog/`` and ``profiles/``)."""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def load_catalog(filename: str) -> dict:
    """The parsed ``catalog/<filename>`` (cached; callers must not mutate it)."""
    return json.loads((_HERE / "catalog" / filename).read_text())


def profile_path(gpu_name: str) -> Path:
    """Where the default calibration profile of catalog GPU ``gpu_name`` lives."""
    return _HERE / "profiles" / f"{gpu_name}.json"


def close_matches(word: str, index: dict[str, str]) -> str:
    """``" (did you mean 'a', 'b'?)"``: the catalog names whose name or alias (the keys of
    ``index``, mapped to catalog names) is close to ``word``; ``""`` when none is."""
    found = difflib.get_close_matches(word, list(index), n=6, cutoff=0.5)
    names = list(dict.fromkeys(index[f] for f in found))[:3]
    return f" (did you mean {', '.join(repr(n) for n in names)}?)" if names else ""
