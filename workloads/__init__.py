"""Trace formats, validation, synthetic generators and trace statistics.

Knows files and distributions, nothing about caches. The simulator's entry points::

    from kvsim.workloads import load_trace, TraceOptions, sample_path
    for request in load_trace(sample_path("mooncake"), TraceOptions(limit=100)):
        ...

The bottom of the house lives here too: :mod:`kvsim.workloads.identity` (block ids) and
:mod:`kvsim.workloads.request` (:class:`Request`), the two modules :mod:`kvsim.cache` may
import. The names below are therefore loaded on first use (PEP 562), so importing the identity
module does not load the trace parsers.
"""

from importlib import import_module

_EXPORTS = {
    "FORMATS": "options", "TraceOptions": "options", "Request": "request",
    "detect_format": "loader", "load_trace": "loader", "read_trace": "loader",
    "sample_path": "bundled",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
