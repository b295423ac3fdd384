"""What no number of replicas can beat: each request's latency in an *empty* system.

The planner uses these floors to say why a configuration can never meet an SLO, before it
searches. For every request of the trace, alone on one replica (the cost model of the
configuration, nothing else running):

- its prompt is prefilled in chunks of ``max_num_batched_tokens`` on top of the longest prefix
  that *could* be cached (with prefix caching on: the leading full blocks that an earlier
  request's prompt already holds, or that a request it continues generated, at most
  ``(prompt - 1) // block_size`` blocks, as vLLM never serves a whole prompt from cache); the
  first token comes with the last chunk, so
  ``ttft_floor`` is the sum of those steps' durations;
- every further output token is one decode step of a batch of one: ``tpot_floor`` is their
  mean, ``e2e_floor = ttft_floor + their sum``.

In the cost model a step never gets shorter when more requests share it or when a prefill is
cut into more chunks, and a cache never holds more than every earlier prompt and the replies
continued since, so a simulated
request is never faster than its floor and a percentile of the simulated latencies is never
below the same percentile of the floors. Requests whose prompt does not fit ``max_model_len``
are left out (the simulator rejects them).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from kvsim.cache.step_plan import ScheduledRequest, StepPlan
from kvsim.workloads.request import Request

from kvsim.sim.config import RunConfig
from kvsim.sim.perf.gpus import resolve_gpu
from kvsim.sim.perf.models import resolve_model
from kvsim.sim.serving.runner import default_executor

METRIC_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}


def suggested_block_size(model: str, gpu: str, dtype: str = "bf16", tp: int = 1) -> dict:
    """The design article's block size: the tokens whose K and V of one layer fill the GPU's
    L2 cache, ``L2_cache_size / (2 * hidden_size * dtype_size)`` for multi-head attention.
    With grouped-query attention, tensor parallelism or MLA a token's K and V of one layer
    on one GPU are narrower than ``hidden_size``: their real width (vLLM's page size per
    token) is used.

    Returns the inputs, the exact quotient (``tokens``) and the largest power of two not above
    it (``power_of_two``), since block sizes are usually powers of two.
    """
    spec, card = resolve_model(model), resolve_gpu(gpu)
    per_token = spec.kv_bytes_per_token_per_layer_per_gpu(tp, dtype)
    tokens = card.l2_cache_bytes / per_token
    power = 1 << max(0, int(np.floor(np.log2(tokens)))) if tokens >= 1 else 1
    return {"gpu": card.name, "tp": tp, "l2_cache_bytes": card.l2_cache_bytes,
            "kv_bytes_per_token_per_layer": per_token, "tokens": tokens,
            "power_of_two": power}


def cacheable_prefix_tokens(requests: list[Request], block_size: int,
                            greedy: bool = False) -> np.ndarray:
    """Per request: the most prompt tokens a prefix cache could serve (see the module doc).
    A request that a later one continues also leaves the blocks it generated (all but the
    last token's, never computed; ``greedy``: the run's sampling mode names them)."""
    continued = {id(r.continues) for r in requests if r.continues is not None}
    seen: set[int] = set()
    out = np.zeros(len(requests), dtype=np.int64)
    for i, request in enumerate(requests):
        hashes = request.block_hashes(block_size)
        limit = (request.prompt_tokens - 1) // block_size
        hits = 0
        while hits < min(limit, len(hashes)) and int(hashes[hits]) in seen:
            hits += 1
        out[i] = hits * block_size
        if id(request) in continued:
            hashes = request.block_hashes(block_size, request.total_tokens - 1, greedy)
        seen.update(int(h) for h in hashes)
    return out


def _prefill_seconds(cost, prompt: int, cached: int, chunk: int) -> float:
    """Seconds to prefill ``prompt - cached`` tokens alone, ``chunk`` tokens per step."""
    done, total = cached, 0.0
    while done < prompt:
        q = min(chunk, prompt - done)
        total += cost.step_duration(StepPlan(scheduled=[ScheduledRequest(0, q, done)]))
        done += q
    return total


def latency_floors(requests: Iterable[Request], config: RunConfig,
                   max_model_len: int) -> dict[str, np.ndarray]:
    """Per admitted request: ``ttft_s``, ``tpot_s`` (NaN for one output token), ``e2e_s``
    floors, plus the ``prompt_tokens`` and ``cached_tokens`` they assume."""
    kept = [r for r in requests if r.prompt_tokens < max_model_len]
    cost = default_executor(config)
    cached = (cacheable_prefix_tokens(kept, config.block_size, config.sampling == "greedy")
              if config.enable_prefix_caching else np.zeros(len(kept), dtype=np.int64))
    ttft, tpot, e2e = (np.zeros(len(kept)) for _ in range(3))
    for i, r in enumerate(kept):
        ttft[i] = _prefill_seconds(cost, r.prompt_tokens, int(cached[i]),
                                   config.max_num_batched_tokens)
        decode = cost.decode_durations(1, r.prompt_tokens, r.output_tokens - 1)
        tpot[i] = decode.mean() if len(decode) else np.nan
        e2e[i] = ttft[i] + decode.sum()
    prompts = np.array([r.prompt_tokens for r in kept], dtype=np.int64)
    return {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "prompt_tokens": prompts,
            "cached_tokens": cached}


def floor_percentiles(floors: dict[str, np.ndarray], targets) -> dict[str, float | None]:
    """``{slo_key: percentile of the floors}`` for ``targets`` ``[(key, metric, pct, s)]``."""
    out = {}
    for key, metric, pct, _ in targets:
        values = floors[metric][~np.isnan(floors[metric])]
        out[key] = float(np.percentile(values, pct)) if len(values) else None
    return out


def impossible_reason(floors: dict[str, np.ndarray], targets) -> str | None:
    """Why no replica count can meet ``targets``, or ``None`` when the floors allow it."""
    reached = floor_percentiles(floors, targets)
    for key, metric, pct, target in targets:
        if reached[key] is not None and reached[key] > target:
            return _explain(floors, metric, pct, target, reached[key])
    return None


def _explain(floors, metric: str, pct: float, target: float, floor: float) -> str:
    name = METRIC_NAMES[metric.removesuffix("_s")]
    text = (f"{name} p{pct:g} can never meet {fmt_latency(target)}: even in an empty system "
            f"it is {fmt_latency(floor)}")
    if metric == "ttft_s":
        i = int(np.nanargmax(floors["ttft_s"]))
        text += (f" (each request's prefill alone; the slowest, "
                 f"{int(floors['prompt_tokens'][i]):,} prompt tokens of which "
                 f"{int(floors['cached_tokens'][i]):,} cacheable, takes "
                 f"{fmt_latency(float(floors['ttft_s'][i]))})")
    elif metric == "tpot_s":
        text += " (one decode step with a batch of one)"
    return text


def fmt_latency(seconds: float | None) -> str:
    """Seconds as ``12.3 ms`` below a second (``1 µs`` below a millisecond: it showed
    ``0.0 ms``), else ``1.23 s`` (``n/a`` for None)."""
    if seconds is None:
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"
