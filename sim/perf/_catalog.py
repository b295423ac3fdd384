"""Reading JSON data: the packaged files (``catalog/`` and ``profiles/``) and the user's (a
model ``config.json``, a calibration profile, a price table)."""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from pathlib import Path

from kvsim.errors import ConfigError

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


def read_json_object(path: str | Path, what: str, field: str) -> dict:
    """The JSON object in the user's file ``path`` (a ``what``); anything else (no file, an
    unreadable or non-JSON one, JSON nested too deep, not an object) is one
    :class:`ConfigError` line naming the file and ``field``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"no such {what} file", location=str(path), field=field) from None
    except (OSError, ValueError, RecursionError) as exc:
        text = getattr(exc, "strerror", None) or " ".join(str(exc).split())
        raise ConfigError(f"cannot read the {what}: {text}", location=str(path),
                          field=field) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a JSON object", location=str(path), field=field)
    return data
