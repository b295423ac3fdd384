"""Model configs from the local Hugging Face cache, offline.

``huggingface_hub`` downloads a repository's files into ``HUB/models--ORG--NAME/snapshots/REV/``
and writes the commit of each branch to ``HUB/models--ORG--NAME/refs/BRANCH``. ``HUB`` is
``$HF_HUB_CACHE``, else ``$HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub`` (huggingface_hub's own order). This module reads that layout
directly: no network, and no need for huggingface_hub itself.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

#: ``org/name`` (Hugging Face repository ids: letters, digits, ``-_.``).
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache this process would use."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def is_repo_id(text: str) -> bool:
    """Whether ``text`` looks like a Hugging Face repository id (``org/name``)."""
    return bool(_REPO_ID.match(text))


def cached_config(repo_id: str, cache: Path | None = None) -> Path | None:
    """``config.json`` of ``repo_id`` in the local cache: the snapshot ``refs/main`` points
    to, else the newest snapshot holding one; ``None`` when it has not been downloaded."""
    repo = (cache or hub_cache_dir()) / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        pinned = snapshots / ref.read_text(encoding="utf-8").strip() / "config.json"
        if pinned.is_file():
            return pinned
    found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None
