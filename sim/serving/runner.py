"""Build a simulated deployment from a :class:`RunConfig` and replay requests through it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import simpy

from kvsim.cache.block_pool import MAX_POOL_BLOCKS
from kvsim.cache.contiguous import ContiguousKVManager
from kvsim.cache.hybrid import HybridKVManager
from kvsim.cache.kv_cache_manager import KVCacheManager
from kvsim.cache.multi_group import MultiGroupKVManager
from kvsim.cache.eviction import make_policy
from kvsim.cache.policies import prepare_eviction
from kvsim.cache.scheduler import Scheduler, SchedulerConfig
from kvsim.cache.offload_managers import make_offloading_manager
from kvsim.cache.offloading import OffloadingKVCacheManager
from kvsim.cache.tiered import HostTier, TieredKVCacheManager
from kvsim.errors import ConfigError
from kvsim.workloads.request import Request

from kvsim.reports.frames import recorded_trace_options
from kvsim.sim.config import RunConfig
from kvsim.sim.perf.cost_model import CostModel
from kvsim.sim.perf.kv_layout import KvLayout, kv_layout, longest_request
from kvsim.sim.perf.memory import kv_offloading_blocks, kv_pool
from kvsim.sim.perf.models import check_tensor_parallel, resolve_model
from kvsim.sim.serving.recorder import RequestLog, StepLog
from kvsim.sim.serving.arrivals import Arrivals
from kvsim.sim.serving.replica import Replica
from kvsim.sim.serving.router import make_router


@dataclass
class Deployment:
    """What a config resolves to: the pool per replica and the limits derived from it."""

    num_gpu_blocks: int
    max_model_len: int
    pool_explanation: str
    num_cpu_blocks: int = 0
    layout: KvLayout | None = None
    model_max_len: int | None = None    # the model's own context (max_position_embeddings)
    #: what set max_model_len: "given" (--max-model-len), "model" (its context), "kv_pool"
    #: (the longest request the pool holds) or "model+kv_pool" (both at once)
    max_model_len_limit: str = "model"

    @property
    def multi_group(self) -> bool:
        """True when the model needs vLLM's hybrid KV cache manager (several layer groups)."""
        return self.layout is not None and self.layout.is_hybrid


@dataclass
class RunResult:
    """Everything a finished simulation hands to :mod:`kvsim.sim.serving.results`."""

    config: RunConfig
    deployment: Deployment
    steps: StepLog
    requests: RequestLog
    replicas: list
    duration_s: float
    wall_time_s: float
    trace_options: dict | None = None   # how the trace file was read (summary's config)
    trace_rows_left_out: dict = field(default_factory=dict)   # that file's, by reason


def resolve_deployment(config: RunConfig) -> Deployment:
    """Size the KV pool (or take ``num_gpu_blocks``) and check ``max_model_len`` against it."""
    model = resolve_model(config.model)
    check_tensor_parallel(model, config.tp)
    if config.num_gpu_blocks is not None:
        blocks, text = config.num_gpu_blocks, f"{config.num_gpu_blocks} blocks (given)"
    else:
        pool = sized_pool(config, model)
        blocks, text = pool.num_gpu_blocks, pool.explanation
    layout = kv_layout(model, config.tp, config.block_size, config.dtype)
    slots = blocks * config.block_size
    if layout.is_hybrid:
        _check_multi_group(config, model.name)
        slots = longest_request(layout, blocks, config.max_num_batched_tokens, slots)
    longest = slots
    if config.layout == "contiguous" and config.allocator == "buddy":
        longest = 1 << (slots.bit_length() - 1)     # the largest buddy block: a power of two
    max_len = config.max_model_len or min(model.max_model_len, longest)
    limit = ("model+kv_pool" if max_len >= longest and max_len == model.max_model_len else
             "kv_pool" if max_len >= longest else   # (raising it would be refused)
             "model" if max_len == model.max_model_len else "given")
    if max_len > slots:
        holds = (f"{blocks:,} blocks x {config.block_size} = {slots:,} tokens" if not
                 layout.is_hybrid else f"{blocks:,} blocks, whose longest request has "
                 f"{slots:,} tokens (its attention groups share the blocks)")
        raise ConfigError(f"max_model_len {max_len:,} tokens exceeds the KV pool of {holds} "
                          f"({text}); lower it or add memory", field="max_model_len")
    if max_len > longest:
        raise ConfigError(
            f"max_model_len {max_len:,} tokens exceeds the largest region the buddy allocator "
            f"can place in the KV pool of {slots:,} tokens ({longest:,}: a power of two); "
            "lower it or add memory", field="max_model_len")
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_len:
        raise ConfigError(
            f"without chunked prefill the token budget ({config.max_num_batched_tokens:,}) "
            f"must hold the longest prompt: raise it to max_model_len ({max_len:,}) or lower "
            "that (vLLM refuses this too)", field="max_num_batched_tokens")
    host = config.num_cpu_blocks or kv_offloading_blocks(
        model, config.kv_offloading_size or 0.0, config.tp, config.block_size, config.dtype)
    if config.kv_offloading_size and not 1 <= host <= MAX_POOL_BLOCKS:
        raise ConfigError(f"{config.kv_offloading_size:g} GiB makes {host:,} CPU blocks of "
                          f"{config.block_size} tokens: give between 1 and {MAX_POOL_BLOCKS:,}",
                          field="kv_offloading_size")
    return Deployment(blocks, max_len, text, host, layout, model.max_model_len, limit)


def sized_pool(config: RunConfig, model=None):
    """The KV pool (:class:`~kvsim.sim.perf.memory.KvPool`) vLLM sizes for ``config``'s
    GPU, TP, memory share, dtypes and budgets, whatever ``num_gpu_blocks`` says."""
    return kv_pool(model or resolve_model(config.model), config.gpu, config.tp,
                   config.block_size, config.gpu_memory_utilization, config.dtype,
                   max_num_batched_tokens=config.max_num_batched_tokens,
                   max_num_seqs=config.max_num_seqs, weight_dtype=config.weight_dtype)


def _check_multi_group(config: RunConfig, name: str) -> None:
    """The hybrid manager is simulated for the paged layout with LRU and no CPU tier only."""
    offending = next((field for field, bad in (
        ("layout", config.layout != "paged"), ("eviction", config.eviction != "lru"),
        ("num_cpu_blocks" if config.num_cpu_blocks else "kv_offloading_size",
         config.has_host_tier),
        ("preemption_mode", config.preemption_mode == "swap")) if bad), None)
    if offending:
        raise ConfigError(f"{name} has sliding-window or chunked-local layers (vLLM's hybrid "
                          "KV cache manager): kvsim simulates it with --layout paged, "
                          "--eviction lru and no CPU tier", field=offending)


def default_executor(config: RunConfig) -> CostModel:
    return CostModel(config.model, config.gpu, config.tp, config.block_size,
                     profile=config.profile, dtype=config.dtype,
                     weight_dtype=config.weight_dtype)


def simulate(requests: Iterable[Request], config: RunConfig, executor=None,
             progress: Callable[[float, int], None] | None = None,
             keep_steps: bool = False, stop=None, sharing=None,
             trace_options=None, left_out: Mapping[str, int] | None = None) -> RunResult:
    """Replay ``requests`` (in arrival order; an iterator is read as the run goes) and return
    the logs of the run. ``keep_steps``: also keep every engine step (memory grows with the
    steps; ``kvsim validate`` and tests need them), not just totals and the timeline.
    ``stop``: the request log's watch (see :class:`~kvsim.sim.serving.recorder.RequestLog`);
    the run ends after the event at which its ``stopped`` turns True (the planner's
    :class:`~kvsim.sim.plan.stop.SloStop`), leaving partial logs. ``sharing``: the trace's
    :class:`~kvsim.workloads.sharing.SharedPrefixes` (the same results, with less prefix-index
    work for blocks that only their own request can hit). ``trace_options``: the
    ``TraceOptions`` the requests were read with, recorded in the summary; ``left_out``: the
    rows of that file holding no request to run (``load_trace``'s count, filled as the
    requests are read), by reason, reported in the summary."""
    config.validate()
    requests, oracle = prepare_eviction(config.eviction, requests, config.block_size)
    deployment = resolve_deployment(config)
    executor = executor or default_executor(config)
    env = simpy.Environment()
    steps, log = StepLog(keep_steps), RequestLog(stop)
    replicas = []           # (filled below: the arrivals route to the replicas, which read
    arrivals = Arrivals(env, requests, replicas, make_router(config.router), log, config,
                        deployment.max_model_len)      # the next arrival as their horizon)
    replicas += [Replica(env, i, _scheduler(config, deployment, oracle), executor, steps, log,
                         config.skip_ahead and config.layout == "paged"
                         and not deployment.multi_group, arrivals)
                 for i in range(config.replicas)]
    if all(getattr(r.kv, "skips_private_blocks", False) for r in replicas):
        arrivals.sharing = sharing  # (a manager that registers every block has no use for it)
    env.process(arrivals.process())
    start = time.perf_counter()
    _run(env, replicas, progress, stop)
    steps.finish(env.now)
    return RunResult(config, deployment, steps, log, replicas, env.now,
                     time.perf_counter() - start,
                     None if trace_options is None else recorded_trace_options(trace_options),
                     dict(left_out or {}))


def make_kv_manager(config: RunConfig, deployment: Deployment, oracle=None):
    """The KV manager of ``config.layout``: paged (vLLM's), contiguous or hybrid; a model with
    sliding-window or chunked-local layers gets vLLM's hybrid manager (one table per group)."""
    if deployment.multi_group:
        return MultiGroupKVManager(deployment.num_gpu_blocks, config.block_size,
                                   deployment.layout.groups, config.enable_prefix_caching,
                                   deployment.max_model_len, config.max_num_batched_tokens)
    if config.layout == "contiguous":
        return ContiguousKVManager(deployment.num_gpu_blocks, config.block_size,
                                   deployment.max_model_len, config.reserve,
                                   config.compaction_threshold, config.allocator)
    if config.layout == "hybrid":
        return HybridKVManager(deployment.num_gpu_blocks, config.block_size,
                               deployment.max_model_len, config.hybrid_threshold,
                               config.reserve, config.enable_prefix_caching)
    args = (deployment.num_gpu_blocks, config.block_size, config.enable_prefix_caching,
            deployment.max_model_len, make_policy(config.eviction, oracle))
    if deployment.num_cpu_blocks and config.offload_write == "native":
        offload = make_offloading_manager(deployment.num_cpu_blocks,
                                          config.offload_eviction_policy,
                                          config.offload_store_threshold)
        return OffloadingKVCacheManager(*args, offload=offload, defer_private_blocks=True)
    if deployment.num_cpu_blocks:
        host = HostTier(deployment.num_cpu_blocks, make_policy(config.eviction, oracle))
        return TieredKVCacheManager(*args, host=host, write=config.offload_write)
    return KVCacheManager(*args, defer_private_blocks=True)


def _scheduler(config: RunConfig, deployment: Deployment, oracle=None) -> Scheduler:
    kv = make_kv_manager(config, deployment, oracle)
    return Scheduler(kv, SchedulerConfig(
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=deployment.max_model_len,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        policy=config.scheduling_policy, preemption_mode=config.preemption_mode,
        enable_chunked_prefill=config.enable_chunked_prefill,
        reserve_full_sequence=config.scheduler_reserve_full_isl))


def _run(env: simpy.Environment, replicas, progress, stop=None,
         every_events: int = 512) -> None:
    """Run until no event is left or ``stop.stopped``, calling ``progress(sim_s, finished)``
    every ``every_events`` events and once at the end (the caller throttles drawing)."""
    if progress is None and stop is None:
        env.run()
        return
    progress = progress or (lambda now, finished: None)
    step, count = env.step, 0
    try:
        while stop is None or not stop.stopped:
            step()
            count += 1
            if count % every_events == 0:
                progress(env.now, sum(r.num_finished for r in replicas))
    except simpy.core.EmptySchedule:
        pass
    progress(env.now, sum(r.num_finished for r in replicas))
