"""The inputs of ``kvsim plan``, checked: SLO targets, the load, the candidates, the prices.

:func:`build_spec` turns what a user typed into a :class:`PlanSpec`, raising
:class:`~kvsim.errors.ConfigError` (one line, exit status 2 on the CLI) for anything wrong, so
that the workers never meet bad input. A spec is small and picklable: workers get the trace's
path and :class:`TraceOptions`, never request objects, and load the trace themselves.
"""

from __future__ import annotations

import itertools
import math
import numbers
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from kvsim.errors import ConfigError
from kvsim.workloads import TraceOptions

from kvsim.sim.perf._catalog import read_json_object
from kvsim.sim.config import CPU_OFFLOAD_GB_REFUSAL, MAX_REPLICAS, RunConfig, build
from kvsim.sim.perf.gpus import list_gpus, resolve_gpu
from kvsim.sim.perf.models import resolve_model
from kvsim.sim.plan.load import check_sustained, judged_scale, resolve_load
from kvsim.sim.serving.router import ROUTERS

#: Settings a plan can sweep, in the order candidates are enumerated.
SWEEP_DIMS = ("gpu", "tp", "block_size", "max_num_seqs", "enable_prefix_caching", "eviction",
              "dtype", "weight_dtype", "kv_offloading_size")
#: The price-table key of host memory (a CPU KV tier's ``kv_offloading_size``), USD per
#: GiB-hour.
HOST_MEMORY_KEY = "host-memory-gib"
#: Its default: about on-demand cloud DRAM (GCP's N2 custom-memory rate, ~$0.0042/GiB-hour).
DEFAULT_HOST_GIB_HOUR_USD = 0.0042
#: Latencies every evaluation reports, besides those the SLO names.
REPORTED = ("ttft_p50_s", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s")
#: The planner's router: load-aware routing keeps p99 TTFT and E2E close to monotone in the
#: replica count (round-robin can put two long prompts on one replica as replicas are added).
DEFAULT_ROUTER = "least-outstanding-tokens"
_SLO_KEY = re.compile(r"^(ttft|tpot|e2e)_p(\d+(?:\.\d+)?)_s$")


@dataclass(frozen=True)
class PlanSpec:
    """Everything a worker needs to evaluate candidate ``i`` (``candidates[i]``).

    ``trace_options.rate_scale`` is the load to plan for; ``native_rate_per_s`` is the trace's
    mean request rate at rate scale 1 (requests / time span, after the window and limit).
    ``prices`` maps GPU catalog names to USD per GPU-hour (``None``: unknown).
    ``burst``: the trace is the whole load (a burst to absorb), judged however short its
    arrivals; by default it stands for a sustained rate (:mod:`kvsim.sim.plan.load`).
    ``prune`` (default) lets the planner stop a simulation once its SLO verdict is certain and
    start each replica search from an estimate (:mod:`kvsim.sim.plan.planner`); False simulates
    every point to the end and searches from one replica, as before issue 15.
    """

    trace_path: str
    trace_label: str
    trace_options: TraceOptions
    base: RunConfig
    slo: dict
    candidates: tuple[RunConfig, ...]
    varying: tuple[str, ...]
    prices: dict
    native_rate_per_s: float | None
    num_requests: int
    max_replicas: int = 32
    rate_iterations: int = 8
    prune: bool = True
    burst: bool = False
    trace_rows_left_out: dict = field(default_factory=dict)   # the trace's, by reason

    @property
    def targets(self) -> list[tuple[str, str, float, float]]:
        """``[(slo_key, metric column, percentile, target seconds)]``."""
        return slo_targets(self.slo)

    @property
    def request_rate_per_s(self) -> float | None:
        """The planned request rate (the trace's mean rate times the rate scale)."""
        rate = self.native_rate_per_s
        return None if rate is None else rate * self.trace_options.rate_scale

    @property
    def max_judged_scale(self) -> float:
        """The highest rate scale at which the trace's arrivals last long enough to judge the
        TTFT/E2E targets (:func:`~kvsim.sim.plan.load.judged_scale`; ``inf`` without such a
        target or a rate, or for a burst)."""
        if self.burst:
            return math.inf
        return judged_scale(self.native_rate_per_s, self.num_requests, self.targets)


def slo_targets(slo: dict) -> list[tuple[str, str, float, float]]:
    """``{'ttft_p99_s': 0.5}`` → ``[('ttft_p99_s', 'ttft_s', 99.0, 0.5)]``; bad ones raise
    (:func:`checked_slo`)."""
    return [(key, f"{found.group(1)}_s", float(found.group(2)), target)
            for key, target in checked_slo(slo).items()
            for found in (_SLO_KEY.match(key),)]


def reported_keys(slo: dict) -> list[tuple[str, str, float]]:
    """``[(key, metric, pct)]`` of :data:`REPORTED` plus the SLO's own keys, no repeats."""
    keys = list(REPORTED) + [k for k in slo if k not in REPORTED]
    return [(k, m, p) for k, m, p, _ in slo_targets({k: 1.0 for k in keys})]


def build_slo(**targets: float | None) -> dict:
    """``build_slo(ttft_p99_s=0.5, tpot_p99_s=None)`` → ``{'ttft_p99_s': 0.5}``; at least one
    target (:func:`checked_slo`)."""
    slo = {k: v for k, v in targets.items() if v is not None}
    if not slo:
        raise ConfigError("give at least one SLO target (--slo-ttft-p99, --slo-tpot-p99, ...)",
                          field="slo")
    return checked_slo(slo)


def is_slo_key(key) -> bool:
    """Whether ``key`` is an SLO target's name (``ttft_p99_s``)."""
    return isinstance(key, str) and _SLO_KEY.match(key) is not None


def checked_slo(slo) -> dict:
    """SLO targets (``{'ttft_p99_s': 0.5}``; the one check of ``kvsim run``, ``compare``,
    ``plan`` and the API): keys ``ttft|tpot|e2e_pNN_s``, each target a finite number of
    seconds > 0."""
    if not isinstance(slo, dict):
        raise ConfigError(f"expected targets such as {{'ttft_p99_s': 2.0}}, got "
                          f"{type(slo).__name__}", field="slo")
    for key, value in slo.items():
        found = _SLO_KEY.match(str(key))
        if found is None:
            raise ConfigError("expected ttft|tpot|e2e_pNN_s", field=str(key))
        if not 0 < float(found.group(2)) <= 100:
            raise ConfigError("the percentile must be above 0 and at most 100", field=key)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                or not (math.isfinite(value) and value > 0):
            raise ConfigError(f"must be a number of seconds > 0, got {value!r}", field=key)
    return {key: float(value) for key, value in slo.items()}


def parse_list(text: str | Sequence | None, field: str, cast: Callable = str) -> tuple:
    """``"1,2,4"`` → ``(1, 2, 4)`` (order kept, repeats dropped); ``None`` → ``()``."""
    if text is None:
        return ()
    parts = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for part in parts:
        part = part.strip() if isinstance(part, str) else part
        try:
            value = cast(part)
        except (TypeError, ValueError):
            kind = {"int": "integers", "float": "numbers"}.get(cast.__name__, "values")
            sep = " separated by commas" if isinstance(text, str) else ""
            raise ConfigError(f"expected {kind}{sep}, got {text!r}", field=field) from None
        if value not in out:
            out.append(value)
    if not out or "" in out:
        raise ConfigError(f"empty item in {text!r}", field=field)
    return tuple(out)


def expand_candidates(base: RunConfig, dims: dict[str, tuple]) -> tuple[RunConfig, ...]:
    """Every combination of the swept settings (:data:`SWEEP_DIMS` order), one replica each;
    a dimension not in ``dims`` keeps ``base``'s value."""
    names = [d for d in SWEEP_DIMS if dims.get(d)]
    combos = itertools.product(*(dims[n] for n in names))
    configs = tuple(replace(base, replicas=1, **dict(zip(names, combo))) for combo in combos)
    refusals = [refusal(config) for config in configs]
    if all(refusals):       # (one refused among others is an infeasible row, with its reason)
        raise refusals[0]
    return configs


def refusal(config: RunConfig) -> ConfigError | None:
    """Why ``config``'s settings do not go together (:meth:`RunConfig.validate`), or None."""
    try:
        config.validate()
    except ConfigError as e:
        return e
    return None


def load_prices(path: str | None = None) -> dict[str, float | None]:
    """USD per GPU-hour by catalog name: ``gpus.json``'s ``price_per_hour_usd``, overridden
    by ``path``, a JSON object ``{"gpu": price, ...}`` (or one under a ``"prices"`` key; keys
    starting with ``_`` are comments; aliases such as ``h100`` work). The entry
    :data:`HOST_MEMORY_KEY` is host memory in USD per GiB-hour instead."""
    prices = {name: resolve_gpu(name).price_per_hour_usd for name in list_gpus()}
    prices[HOST_MEMORY_KEY] = DEFAULT_HOST_GIB_HOUR_USD
    if path is not None:
        prices.update(_read_prices(path))
    return prices


def _read_prices(path: str) -> dict[str, float]:
    data = read_json_object(path, "price table", "price_table")
    data = data.get("prices", data)
    if not isinstance(data, dict):
        raise ConfigError('expected a JSON object {"gpu": price per GPU-hour}', location=path)
    out = {}
    for key, value in data.items():
        if str(key).startswith("_"):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not 0 <= value < math.inf:
            raise ConfigError(f"price must be a number >= 0, got {value!r}", location=path,
                              field=key)
        out[key if key == HOST_MEMORY_KEY else _gpu_named(key, path)] = float(value)
    return out


def _gpu_named(key: str, path: str) -> str:
    """The catalog name of the price table's GPU ``key``; an unknown one names the table."""
    try:
        return resolve_gpu(key).name
    except ConfigError as e:
        raise ConfigError(e.message, location=path, field=key) from None


def gpu_hour_price(prices: dict, config: RunConfig) -> float | None:
    """USD per GPU-hour of ``config``: its GPU plus the host memory of its host tier
    (``kv_offloading_size`` GiB per replica, so its ``tp``-th part per GPU); None when the
    GPU's price is unknown."""
    gpu = prices.get(config.gpu)
    if gpu is None:
        return None
    host_gib = (config.kv_offloading_size or 0.0) / config.tp
    return gpu + host_gib * prices.get(HOST_MEMORY_KEY, DEFAULT_HOST_GIB_HOUR_USD)


def build_spec(trace_path, trace_label: str, opts: TraceOptions, base: RunConfig, slo: dict,
               dims: dict[str, tuple], *, target_rate: float | None = None,
               price_table: str | None = None, max_replicas: int = 32,
               rate_iterations: int = 8, prune: bool = True, burst: bool = False) -> PlanSpec:
    """Check every input and build the plan's :class:`PlanSpec` (see the module doc)."""
    model = resolve_model(base.model)
    if base.router not in ROUTERS:
        raise ConfigError(f"unknown router; known: {', '.join(sorted(ROUTERS))}", field="router")
    if not 1 <= max_replicas <= MAX_REPLICAS:
        raise ConfigError(f"--max-replicas must be from 1 to {MAX_REPLICAS}, got "
                          f"{max_replicas}", field="max_replicas")
    if rate_iterations < 0:
        raise ConfigError(f"--rate-iterations must be 0 or more, got {rate_iterations}",
                          field="rate_iterations")
    dims = {**dims, "gpu": tuple(dict.fromkeys(resolve_gpu(g).name
                                               for g in dims.get("gpu") or (base.gpu,)))}
    candidates = expand_candidates(base, dims)
    varying = tuple(d for d in SWEEP_DIMS if len({getattr(c, d) for c in candidates}) > 1)
    left_out = Counter()
    limit = base.max_model_len or model.max_model_len
    opts, native, count, decoding, too_long = resolve_load(
        str(trace_path), opts, target_rate, left_out, limit)
    if too_long and base.long_prompt == "reject":
        source = "--max-model-len" if base.max_model_len else f"{model.name}'s context"
        raise ConfigError(
            f"{too_long:,} of {count:,} prompts are not shorter than max_model_len {limit:,} "
            f"({source}): every candidate would reject them; pass --long-prompt truncate (as "
            "Vidur), a larger --max-model-len, or a trace without them", location=trace_label)
    tpot = [key for key in slo if key.startswith("tpot_")]
    if tpot and not decoding:
        raise ConfigError(f"no request of {trace_label} generates more than one token, so no "
                          "TPOT (time per output token after the first) is measured to judge: "
                          "drop the TPOT target", field=tpot[0])
    if not burst:
        check_sustained(opts, native, count, slo_targets(slo), trace_label,
                        target_rate is not None)
    return PlanSpec(str(trace_path), trace_label, opts, base, slo, candidates, varying,
                    load_prices(price_table), native, count, max_replicas, rate_iterations,
                    prune, burst, dict(left_out))


def spec_from_options(trace_path, trace_label: str, opts: TraceOptions,
                      values: dict) -> PlanSpec:
    """:func:`build_spec` from ``kvsim plan``'s option values (named as the CLI names them;
    list options are comma-separated strings). ``rate_scale`` and ``target_rate`` exclude
    each other."""
    if values.get("target_rate") is not None and values.get("rate_scale") is not None:
        raise ConfigError("give --rate-scale or --target-rate, not both", field="target_rate")
    if values.get("cpu_offload_gb") is not None:
        raise ConfigError(CPU_OFFLOAD_GB_REFUSAL, field="cpu_offload_gb")
    base = build(RunConfig, dict(
        trace=trace_label, model=values["model"], router=values.get("router") or DEFAULT_ROUTER,
        max_num_batched_tokens=values["max_num_batched_tokens"],
        gpu_memory_utilization=values["gpu_memory_utilization"],
        max_model_len=values.get("max_model_len"),
        long_prompt=values.get("long_prompt") or "reject",
        profile=values.get("profile"), seed=values.get("seed", 0)), "command line")
    base.validate("command line")
    dims = {"gpu": parse_list(values["gpu"], "gpu"), "tp": parse_list(values["tp"], "tp", int),
            "block_size": parse_list(values["block_size"], "block_size", int),
            "max_num_seqs": parse_list(values["max_num_seqs"], "max_num_seqs", int),
            "enable_prefix_caching": (bool(values["enable_prefix_caching"]),)}
    if values.get("eviction") is not None:
        dims["eviction"] = parse_list(values["eviction"], "eviction")
    for name in ("dtype", "weight_dtype"):
        if values.get(name) is not None:
            dims[name] = parse_list(values[name], name)
    if values.get("kv_offloading_size") is not None:
        dims["kv_offloading_size"] = parse_list(values["kv_offloading_size"],
                                                "kv_offloading_size", float)
    slo = build_slo(ttft_p99_s=values.get("slo_ttft_p99"), tpot_p99_s=values.get("slo_tpot_p99"),
                    ttft_p50_s=values.get("slo_ttft_p50"), e2e_p99_s=values.get("slo_e2e_p99"))
    return build_spec(trace_path, trace_label, opts, base, slo, dims,
                      target_rate=values.get("target_rate"),
                      price_table=values.get("price_table"),
                      max_replicas=values["max_replicas"],
                      rate_iterations=values["rate_iterations"],
                      prune=values.get("prune", True), burst=bool(values.get("burst")))
