"""What a run ran, in words for its summaries (terminal, compare header, validation): the trace
and how it was read, the deployment, and how its KV cache was run."""

from __future__ import annotations

from kvsim.reports.frames import TRACE_OPTIONS
from kvsim.reports.style import fmt_num, fmt_pct, is_number
from kvsim.workloads.request import trace_name


def trace_text(cfg: dict) -> str:
    """``sample:azure-conv`` and how it was read, where not whole and as written:
    ``sample:azure-conv (--limit 50, --start 5, --rate-scale 3)``."""
    given = [(TRACE_OPTIONS[name][1] if name in TRACE_OPTIONS else name, value)
             for name, value in (cfg.get("trace_options") or {}).items()
             if value not in (None, False) and not (name == "rate_scale" and value == 1)]
    shown = ", ".join(name if value is True else f"{name} {_as_given(value)}"
                      for name, value in given)
    return trace_name(cfg.get("trace", "?")) + (f" ({shown})" if shown else "")


def _as_given(value) -> str:
    """``3`` for 3.0, ``0.1234567`` for itself: a float as short as gives it back exactly."""
    if isinstance(value, float) and value == float(f"{value:g}"):
        return f"{value:g}"
    return repr(value) if isinstance(value, float) else str(value)


def deployment_text(cfg: dict, checkpoint: str | None = None, name: str | None = None) -> str:
    """``llama-3.1-8b on 1 x a100-80gb (tp 1), bf16``: every GPU counted (``on 8 x
    a100-80gb (2 replicas of tp 4, round-robin router)``), ``KV bf16, int4 weights`` when the
    weights are stored otherwise than the KV cache as ``--weight-dtype`` says, or ``KV bf16,
    4-bit quantized weights`` as the ``checkpoint`` stores them (by size: AWQ, GPTQ, MXFP4, NVFP4
    are all priced as kvsim's int4). ``name``: the model the given one resolved to
    (``llama-3-8b (given as llama3-8b)``)."""
    replicas, tp = cfg.get("replicas", 1), cfg.get("tp", 1)
    gpus = replicas * tp if is_number(replicas) and is_number(tp) else "?"
    router = f", {cfg['router']} router" if cfg.get("router") else ""
    shape = f"{replicas} replicas of tp {tp}{router}" if replicas != 1 else f"tp {tp}"
    given = cfg.get("model", "?")
    model = given if name in (None, given) else f"{name} (given as {given})"
    text = f"{model} on {gpus} x {cfg.get('gpu', '?')} ({shape}), "
    weights = cfg.get("weight_dtype") or checkpoint
    if weights and weights != cfg.get("dtype"):
        quantized = _QUANTIZED.get(weights) if not cfg.get("weight_dtype") else None
        return text + f"KV {cfg.get('dtype', '?')}, {quantized or weights} weights"
    return text + str(cfg.get("dtype", "?"))


#: A checkpoint's quantized weights by size (the method is not kept: MXFP4 is not int4).
_QUANTIZED = {"int4": "4-bit quantized", "int8": "8-bit quantized", "fp8": "fp8 quantized"}


def cache_text(cfg: dict) -> str:
    """How the KV cache was run: ``paged, 16-token blocks, prefix caching with lru
    eviction``; a contiguous or hybrid layout with its reserve, allocator and compaction, a
    swap or priority policy where chosen."""
    layout = cfg.get("layout", "paged")
    parts = [f"{layout}, {fmt_num(cfg.get('block_size'))}-token blocks"]
    if layout != "paged":
        parts.append(f"{cfg.get('reserve')} reserve, {cfg.get('allocator')} allocator")
        if layout == "hybrid":
            parts.append(f"paged past {fmt_num(cfg.get('hybrid_threshold'))} tokens")
        if cfg.get("compaction_threshold") is not None:
            parts.append(f"compaction past {fmt_pct(cfg['compaction_threshold'])} "
                         "unusable free slots")
    if layout == "contiguous":
        parts.append("no prefix sharing")           # (regions are a request's own)
    elif cfg.get("enable_prefix_caching", True):
        parts.append(f"prefix caching with {cfg.get('eviction', 'lru')} eviction"
                     + (" for the paged requests" if layout == "hybrid" else ""))
    else:
        parts.append("no prefix caching")
    if cfg.get("preemption_mode", "recompute") != "recompute":
        parts.append(f"{cfg['preemption_mode']} preemption")
    if cfg.get("scheduling_policy", "fcfs") != "fcfs":
        parts.append(f"{cfg['scheduling_policy']} scheduling")
    return ", ".join(parts)
