"""The notes a run prints for the person at the terminal (on stderr, one line each), from one
pass over the trace before the run (:class:`TraceScan`) and from its result: prompts longer
than the deployment takes, a ``--max-model-len`` past the model's context, where step times
come from, a cache running without its compiled parts, and a deployment that fell behind its
arrivals."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from kvsim.reports.style import fmt_seconds, long_prompt_advice
from kvsim.sim.config import RunConfig
from kvsim.workloads import load_trace


@dataclass(frozen=True)
class TraceScan:
    """One pass over the trace before the run: its size, time span and too-long prompts."""

    num_requests: int
    span_s: float
    num_long: int
    longest_prompt: int
    num_overflowing: int = 0    # prompt and output together longer than max_model_len
    left_out: Counter = field(default_factory=Counter)  # rows holding no request, by reason
    num_named: int = 0          # requests that say what their prompt holds (names_content)


def scan_trace(job, max_model_len: int) -> TraceScan:
    """Count the job's (a :class:`~kvsim.pipeline.RunJob`) requests, their span and those whose
    prompt is ``max_model_len`` tokens or more (vLLM rejects those)."""
    count = span = long = longest = over = named = 0
    left_out = Counter()
    for request in load_trace(job.trace_path, job.trace_options, left_out):
        count, span = count + 1, request.arrival_s
        longest = max(longest, request.prompt_tokens)
        long += request.prompt_tokens >= max_model_len
        over += request.prompt_tokens + request.output_tokens > max_model_len
        named += request.names_content
    return TraceScan(count, span, long, longest, over, left_out, named)


def unnamed_content_note(scan: TraceScan, config: RunConfig) -> str | None:
    """Why the prefix hit rate will be 0, when no request of the trace says what its prompt
    holds and the run looks prefixes up; else None."""
    if (not scan.num_requests or scan.num_named or not config.enable_prefix_caching
            or config.layout == "contiguous"):
        return None
    return ("no request of the trace says what its prompt holds (token ids, prefix hash ids "
            "or a request it continues): none can hit another's cached blocks, so the prefix "
            "hit rate is 0 by construction")


#: A run whose median request waited this share of the arrivals' span (and a second at
#: least) fell behind them: with arrivals steady at twice what it serves, the queue grows
#: to half the span, a quarter on median (:func:`fell_behind`).
BEHIND_SHARE = 0.25


def median_queue_s(requests) -> float | None:
    """The completed requests' median wait between arrival and first scheduling."""
    queued = np.asarray(requests["queue_s"], dtype=float)
    queued = queued[~np.isnan(queued)]
    return float(np.median(queued)) if len(queued) else None


def fell_behind(scan: TraceScan | None, queued: float | None) -> bool:
    """Whether requests arriving over time (not all at once) queued, on median, for more
    than :data:`BEHIND_SHARE` of their arrivals' span and more than a second: the queue grew
    as they came, and latencies measure it more than the deployment."""
    return (scan is not None and scan.span_s > 0 and queued is not None
            and queued > max(1.0, BEHIND_SHARE * scan.span_s))


def fell_behind_note(scan: TraceScan, queued: float) -> str:
    """One line: how long requests queued against how they arrived, and what to do."""
    return (f"the deployment fell behind the arrivals: {scan.num_requests:,} requests arrived "
            f"over {fmt_seconds(scan.span_s)} ({scan.num_requests / scan.span_s:.3g} req/s) "
            f"and waited {fmt_seconds(queued)} on median before their first step, so their "
            "latencies measure the queue; give it more --replicas, --tp or a larger --gpu, or "
            "lower --rate-scale")


def long_prompt_note(scan: TraceScan, config: RunConfig, deployment) -> str:
    """One line saying how many prompts do not fit the deployment's ``max_model_len``, what
    happens to them and what to do about it."""
    max_model_len = deployment.max_model_len
    share = f"{scan.num_long:,} of {scan.num_requests:,} requests"
    fit = (f"have prompts of {max_model_len:,} tokens or more (max_model_len; the longest "
           f"has {scan.longest_prompt:,})")
    if config.long_prompt == "truncate" and not scan.num_long:
        return (f"{scan.num_overflowing:,} of {scan.num_requests:,} requests have prompt and "
                f"output together past max_model_len {max_model_len:,}: truncating them "
                "(--long-prompt truncate)")
    if config.long_prompt == "truncate":
        return (f"{share} {fit}; truncating the {scan.num_overflowing:,} whose prompt and "
                "output together pass it (--long-prompt truncate)")
    advice = long_prompt_advice(deployment.max_model_len_limit,
                                config.num_gpu_blocks is not None)
    return f"{share} {fit} and will be rejected; {advice}"


def uncompiled_note(scan: TraceScan) -> str | None:
    """One line, for a trace long enough to feel it, when the install built none of the
    cache's C files and ``KVSIM_PURE_PYTHON`` does not ask for that; else None."""
    from kvsim.cache import bulk, intmap, recency
    built = intmap.IntMap is not None or bulk._c is not None or recency.RecencyList is not None
    if built or intmap.PURE_PYTHON or scan.num_requests < UNCOMPILED_NOTE_REQUESTS:
        return None
    return ("the cache's C parts were not built (no C compiler at install): it runs in "
            "Python, the same results about 10-45 % slower on long traces; `pip install -e .` "
            "with a C compiler builds them")


#: Fewest requests for which :func:`uncompiled_note` speaks (a short run loses little).
UNCOMPILED_NOTE_REQUESTS = 1000


def oversized_pool_note(config: RunConfig) -> str | None:
    """One line when ``--num-gpu-blocks`` gives more blocks than the deployment's GPUs hold
    (vLLM's --num-gpu-blocks-override is not checked either); else None."""
    from kvsim.errors import ConfigError
    from kvsim.sim.serving.runner import sized_pool
    if config.num_gpu_blocks is None:
        return None
    try:
        sized = sized_pool(config).num_gpu_blocks
    except ConfigError:         # (the weights alone do not fit: the pool is all given)
        return None
    if config.num_gpu_blocks <= sized:
        return None
    return (f"--num-gpu-blocks {config.num_gpu_blocks:,} is more than {config.tp} x "
            f"{config.gpu} hold{'s' * (config.tp == 1)} for the KV cache ({sized:,} blocks at "
            f"--gpu-memory-utilization {config.gpu_memory_utilization:g}): the run is of a "
            "pool no such deployment has")


def beyond_context_note(config: RunConfig, deployment) -> str:
    """One line: ``--max-model-len`` is above the model's own context, as vLLM allows only on
    request."""
    return (f"--max-model-len {deployment.max_model_len:,} is above {config.model}'s context "
            f"of {deployment.model_max_len:,} tokens: vLLM refuses that unless "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1; kvsim runs it, its costs extrapolated past the "
            "lengths the model was made for")


def profile_note(config: RunConfig, data: dict) -> str:
    """One line: where the step times come from with ``--profile`` (``data``: the profile as
    loaded), and what of the run differs from what the profile was measured with (a fitted
    profile's device, dtype and block size; ``--gpu`` then sizes the memory only)."""
    if data.get("kind") != "fitted":
        return f"step times: the cost model with {config.profile}'s efficiencies"
    measured = data.get("settings") or {}
    differ = [f"{name} {measured[key]} (this run: {value})" for name, key, value in (
        ("dtype", "dtype", config.dtype), ("block size", "block_size", config.block_size))
        if key in measured and measured[key] != value]
    return (f"step times: fitted on {data.get('device_name') or data.get('device', '?')} "
            f"({config.profile}); --gpu {config.gpu} sizes the KV pool only"
            + (f"; measured with {', '.join(differ)}" if differ else ""))
