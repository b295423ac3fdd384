"""kvsim: a discrete-event simulator and capacity planner for the KV cache of LLM serving engines.

The Python API (``docs/api.md``)::

    import kvsim
    result = kvsim.run("sample:azure-conv", model="llama-2-7b", limit=50)
    result.summary["ttft_s"]["p99"], result.requests, result.timeline

``run``, ``load_trace``, ``compare``, ``plan`` and ``hitrate`` are imported on first use, so
``import kvsim`` stays light.
"""

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "run": "api", "load_trace": "api", "Result": "api", "Trace": "api",
    "compare": "api_studies", "plan": "api_studies", "hitrate": "api_studies", "Comparison": "api_studies",
    "Plan": "api_studies", "HitRates": "api_studies", "validate_real": "realrun",
    "RunConfig": "sim.config", "ConfigError": "errors", "KvsimError": "errors",
    "TraceError": "errors", "KvsimWarning": "errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    import importlib
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kvsim' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
