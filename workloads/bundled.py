"""The bundled sample traces (``sample:NAME``), and their names in messages."""

from __future__ import annotations

import os
from pathlib import Path

from kvsim.errors import TraceError

SAMPLES = {
    "mooncake": "mooncake_conversation_300.jsonl",
    "azure-conv": "azure_conv_300.csv",
}
"""Bundled trace slices (see ``workloads/samples/README.md`` for source and license)."""
SAMPLES_DIR = Path(__file__).resolve().parent / "samples"


def sample_path(name: str) -> Path:
    """Path of a bundled sample trace: ``"mooncake"`` (300 Mooncake conversation requests) or
    ``"azure-conv"`` (300 rows of the Azure 2023 conversation trace)."""
    if name not in SAMPLES:
        raise TraceError(f"unknown sample {name!r}; expected one of {', '.join(SAMPLES)}",
                         field="sample")
    return SAMPLES_DIR / SAMPLES[name]


def shown(path: str | os.PathLike) -> str:
    """``path`` as a message names it: a bundled sample by its ``sample:NAME`` (its place in
    the installed package means nothing to a user)."""
    found = Path(path)
    if found.parent == SAMPLES_DIR:
        name = next((n for n, file in SAMPLES.items() if file == found.name), None)
        if name is not None:
            return f"sample:{name}"
    return str(path)
