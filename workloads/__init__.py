"""Trace formats, validation, synthetic generators and trace statistics.

Knows files and distributions, nothing about caches. The simulator's entry points::

    from kvsim.workloads import load_trace, TraceOptions, sample_path
    for request in load_trace(sample_path("mooncake"), TraceOptions(limit=100)):
        ...
"""

from .loader import detect_format, load_trace, read_trace, sample_path
from .options import FORMATS, TraceOptions
from .request import Request

__all__ = ["FORMATS", "Request", "TraceOptions", "detect_format", "load_trace", "read_trace",
           "sample_path"]
