"""Every setting of a simulated run, named as vLLM names them where it has a name.

:class:`RunConfig` is the one schema of a run's settings: the command line, a TOML file and a
Python caller all build it, and it checks types, choices and ranges when it is built (a
pydantic dataclass in strict mode: ``"4"`` is not an integer, ``1.5`` is not a block size,
``"no"`` is not a boolean). Choices (``Literal`` types) are also the CLI's choices.
"""

from __future__ import annotations

import math
from dataclasses import asdict, fields
from pathlib import Path
from typing import Annotated, Literal, Optional, get_args, get_origin

from pydantic import ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass

from kvsim.cache.block_pool import MAX_POOL_BLOCKS
from kvsim.cache.contiguous import ALLOCATORS, RESERVE_POLICIES
from kvsim.cache.offload_managers import OFFLOAD_POLICIES
from kvsim.cache.policies import POLICY_NAMES
from kvsim.cache.scheduler import PREEMPTION_MODES
from kvsim.cache.tiered import WRITE_POLICIES
from kvsim.errors import ConfigError
from kvsim.workloads.identity import SAMPLING_MODES
from kvsim.reports.frames import TRACE_OPTIONS

from kvsim.sim.perf._catalog import close_matches
from kvsim.sim.perf.gpus import gpu_name
from kvsim.sim.perf.models import DTYPE_BYTES, WEIGHT_DTYPE_BYTES
from kvsim.sim.serving.router import ROUTERS

LAYOUTS = ("paged", "contiguous", "hybrid")
#: What to do with a request whose prompt does not fit ``max_model_len``: ``reject`` it (vLLM
#: answers such a request with an error) or ``truncate`` it as Vidur does (prompt and output
#: shortened in proportion until they fit).
LONG_PROMPT_ACTIONS = ("reject", "truncate")
#: How blocks reach the host tier: ``native`` is vLLM v1's offloading connector (every block
#: stored once computed, :mod:`kvsim.cache.offloading`); ``back`` and ``through`` are kvsim
#: extensions vLLM v1 does not have (:mod:`kvsim.cache.tiered`).
OFFLOAD_WRITES = ("native",) + WRITE_POLICIES
#: The one-line answer to vLLM's weight-offload flag, which kvsim does not model.
CPU_OFFLOAD_GB_REFUSAL = ("--cpu-offload-gb is vLLM's weight offload, which kvsim does not "
                          "model; a CPU tier for the KV cache is --kv-offloading-size GIB "
                          "(or --num-cpu-blocks N)")
KV_DTYPES = tuple(sorted(DTYPE_BYTES))
WEIGHT_DTYPES = tuple(sorted(WEIGHT_DTYPE_BYTES))

Count = Annotated[int, Field(ge=1, le=2**31 - 1)]
#: Most replicas a run may have: each holds its own KV pool (about 1 MB even idle).
MAX_REPLICAS = 1024
PoolBlocks = Annotated[int, Field(ge=1, le=MAX_POOL_BLOCKS)]
NonNegative = Annotated[int, Field(ge=0, le=2**31 - 1)]
# The choices, also used as the CLI's option types (``--help`` lists them, shells complete them).
RouterName = Literal[tuple(ROUTERS)]
SchedulingPolicy = Literal["fcfs", "priority"]
KvDtype = Literal[KV_DTYPES]
WeightDtype = Literal[WEIGHT_DTYPES]
EvictionPolicy = Literal[POLICY_NAMES]
Layout = Literal[LAYOUTS]
ReservePolicy = Literal[RESERVE_POLICIES]
AllocatorName = Literal[ALLOCATORS]
OffloadWrite = Literal[OFFLOAD_WRITES]
OffloadEvictionPolicy = Literal[OFFLOAD_POLICIES]
PreemptionMode = Literal[PREEMPTION_MODES]
LongPrompt = Literal[LONG_PROMPT_ACTIONS]
Sampling = Literal[SAMPLING_MODES]


#: Largest block size (tokens) any command takes.
MAX_BLOCK_SIZE = 1 << 20


@dataclass(frozen=True, config=ConfigDict(strict=True, extra="forbid"))
class RunConfig:
    """Settings of one ``kvsim run`` (all of them end up in ``summary.json``'s ``config``)."""

    trace: str = "sample:mooncake"
    model: Annotated[str, Field(min_length=1)] = "llama-3.1-8b"
    gpu: Annotated[str, Field(min_length=1)] = "a100-80gb"
    tp: Annotated[int, Field(ge=1, le=1024)] = 1
    replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)] = 1     # (each its own pool)
    router: RouterName = "round-robin"
    block_size: Annotated[int, Field(ge=1, le=MAX_BLOCK_SIZE)] = 16
    num_gpu_blocks: Optional[PoolBlocks] = None
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    max_num_seqs: Count = 256
    max_num_batched_tokens: Count = 8192
    max_model_len: Optional[Count] = None
    long_prefill_token_threshold: NonNegative = 0
    enable_prefix_caching: bool = True
    scheduling_policy: SchedulingPolicy = "fcfs"
    enable_chunked_prefill: bool = True
    scheduler_reserve_full_isl: bool = True   # admit only when the whole sequence fits
    sampling: Sampling = "random"             # ids of unrecorded generated tokens
    dtype: KvDtype = "bf16"              # KV cache, and weights unless weight_dtype
    weight_dtype: Optional[WeightDtype] = None   # default: dtype
    profile: Optional[str] = None
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    skip_ahead: bool = True
    eviction: EvictionPolicy = "lru"
    layout: Layout = "paged"
    reserve: ReservePolicy = "max"
    allocator: AllocatorName = "first-fit"     # contiguous regions: first-fit or buddy
    hybrid_threshold: Count = 256
    compaction_threshold: Optional[Annotated[float, Field(ge=0, lt=1)]] = None
    num_cpu_blocks: Optional[Annotated[int, Field(ge=0, le=MAX_POOL_BLOCKS)]] = None  # per
    # replica, the host tier in blocks ...
    # ... or GiB of host memory per replica, all tensor-parallel ranks together (vLLM's)
    kv_offloading_size: Optional[Annotated[float, Field(ge=0, le=1e6)]] = None
    offload_write: OffloadWrite = "native"  # vLLM's connector; back / through: kvsim's
    offload_eviction_policy: OffloadEvictionPolicy = "lru"   # native: the CPU's eviction
    offload_store_threshold: Annotated[int, Field(ge=0, le=1_000_000)] = 0   # native: reuse gate
    preemption_mode: PreemptionMode = "recompute"
    long_prompt: LongPrompt = "reject"

    def __post_init__(self) -> None:
        # a GPU alias (h100, A100-SXM4-80GB) is kept by its catalog name: one GPU, one name in
        # summaries, labels and grids (an unknown one is refused where the pool is sized)
        known = gpu_name(self.gpu)
        if known is not None and known != self.gpu:
            object.__setattr__(self, "gpu", known)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict, source: str = "config", check: bool = True) -> "RunConfig":
        """Build from a mapping (a TOML file, CLI options); any bad key or value is a
        :class:`ConfigError` naming ``source`` and the key. ``check`` also runs the checks
        that involve several settings (:meth:`validate`)."""
        known = setting_names()
        clean = {}
        for key, value in values.items():
            name = str(key).replace("-", "_")
            if name == "cpu_offload_gb":
                raise ConfigError(CPU_OFFLOAD_GB_REFUSAL, location=source, field=str(key))
            flag = _TRACE_OPTION_NAMES.get(name)
            if name not in known and flag is not None:
                raise ConfigError(f"how the trace is read, not a run setting: give {flag} on "
                                  f"the command line, or {flag[2:].replace('-', '_')}= to "
                                  "kvsim.run", location=source, field=str(key))
            if name not in known:
                _refuse_other_name(name, source, str(key))
                hint = close_matches(name, {k: k for k in known})
                raise ConfigError(f"unknown setting{hint}; known: {', '.join(sorted(known))}",
                                  location=source, field=str(key))
            clean[name] = value
        config = build(cls, clean, source)
        if check:
            config.validate(source)
        return config

    def validate(self, source: str | None = None) -> None:
        """Checks that involve more than one setting (each value was checked when built)."""
        try:
            if self.max_num_batched_tokens < self.max_num_seqs:
                raise ConfigError(f"{self.max_num_batched_tokens} is below max_num_seqs "
                                  f"({self.max_num_seqs}): each running request needs a token "
                                  "of it per step (vLLM refuses this too)",
                                  field="max_num_batched_tokens")
            self._validate_layout()
            self._validate_tiering()
            if self.profile is not None and not Path(self.profile).is_file():
                raise ConfigError("is a directory, not a profile file"
                                  if Path(self.profile).is_dir() else "no such profile file",
                                  location=str(self.profile),
                                  field="profile")
        except ConfigError as e:
            raise located(e, source) from None

    def _validate_layout(self) -> None:
        if self.compaction_threshold is not None and self.layout != "contiguous":
            raise ConfigError("compaction needs --layout contiguous", field="compaction_threshold")
        if self.allocator == "buddy" and self.compaction_threshold is not None:
            raise ConfigError("the buddy allocator does not compact", field="compaction_threshold")
        if self.allocator == "buddy" and self.layout != "contiguous":
            raise ConfigError("--allocator buddy needs --layout contiguous", field="allocator")
        if self.layout == "hybrid" and self.eviction != "lru":
            raise ConfigError("the hybrid layout pages with lru eviction only", field="eviction")

    @property
    def has_host_tier(self) -> bool:
        return bool(self.num_cpu_blocks) or bool(self.kv_offloading_size)

    def _validate_tiering(self) -> None:
        if self.num_cpu_blocks and self.kv_offloading_size:
            raise ConfigError("give the host tier in blocks or in GiB, not both",
                              field="kv_offloading_size")
        if self.has_host_tier and self.layout != "paged":
            raise ConfigError("a host tier needs --layout paged", field="layout")
        if self.preemption_mode == "swap" and not self.has_host_tier:
            raise ConfigError("swap preemption needs a host tier (--num-cpu-blocks or "
                              "--kv-offloading-size)", field="preemption_mode")
        if self.preemption_mode == "swap" and self.offload_write == "native":
            raise ConfigError("swap preemption is a kvsim extension (vLLM v1 has none): it "
                              "needs --offload-write back or through", field="preemption_mode")

    def check_unused_options(self, source: str | None = None) -> None:
        """A layout's options need that layout, a CPU tier's options need the tier, and the
        native tier's need it native: one run's settings that set them otherwise are a mistake
        (they were ignored silently). Not part of :meth:`validate`: a compare grid that spans
        layouts or tiers sets them for every point."""
        for name, default, layouts in (("reserve", "max", ("contiguous", "hybrid")),
                                       ("hybrid_threshold", 256, ("hybrid",))):
            if getattr(self, name) != default and self.layout not in layouts:
                raise located(ConfigError(
                    f"applies to --layout {' or '.join(layouts)} only (the {self.layout} "
                    "layout does not use it)", field=name), source)
        if self.eviction != "lru" and self.layout == "contiguous":
            raise located(ConfigError("the contiguous layout shares no prefixes, so no "
                                      "eviction policy chooses anything: use --layout paged",
                                      field="eviction"), source)
        for name, default in (("offload_write", "native"), ("offload_eviction_policy", "lru"),
                              ("offload_store_threshold", 0)):
            if getattr(self, name) != default and not self.has_host_tier:
                raise located(ConfigError("sets up a CPU tier that is not there: give "
                                          "--kv-offloading-size or --num-cpu-blocks",
                                          field=name), source)
        for name, default in (("offload_eviction_policy", "lru"), ("offload_store_threshold", 0)):
            if getattr(self, name) != default and self.offload_write != "native":
                raise located(ConfigError("belongs to vLLM's native CPU tier; --offload-write "
                                          f"{self.offload_write} does not use it", field=name),
                              source)


#: Names a trace option goes by (summary.json's, the TraceOptions field's, the flag's) and
#: its command-line option: how the trace is read, not a run setting.
_TRACE_OPTION_NAMES = {name: flag for key, (field, flag) in TRACE_OPTIONS.items()
                       for name in (key, field, flag[2:].replace("-", "_"))} | {"fmt": "--format"}


#: Options of the commands that are no run setting (what a command does with the run): the
#: option to give instead, and what a Python caller does instead; settings a file or a call
#: names as vLLM's flags do.
COMMAND_LINE_ONLY = {"out": "--out", "json": "--json", "quiet": "--quiet",
                     "html": "--html / --no-html", "output_format": "--output-format",
                     "bench_json": "--bench-json", "slo_ttft_p99": "--slo-ttft-p99",
                     "slo_tpot_p99": "--slo-tpot-p99", "config": "--config"}
_IN_PYTHON = {"out": "write the result with Result.write(out_dir)",
              "html": "Result.write takes html=", "output_format": "Result.write takes "
              "output_format=", "bench_json": "Result.write takes bench=",
              "slo_ttft_p99": "give slo={'ttft_p99_s': ...}",
              "slo_tpot_p99": "give slo={'tpot_p99_s': ...}"}
SETTING_ALIASES = {"tensor_parallel_size": "tp"}


def _refuse_other_name(name: str, source: str, key: str) -> None:
    """A :class:`ConfigError` for a key that is a command-line option or another name of a
    setting, saying what to write instead, to a file or command line or to a Python caller
    (``source`` ``kvsim.*``); nothing for any other unknown key."""
    if name in COMMAND_LINE_ONLY:
        instead = (_IN_PYTHON.get(name, "a command-line option only")
                   if source.startswith("kvsim.") else
                   f"give {COMMAND_LINE_ONLY[name]} on the command line")
        raise ConfigError(f"what the command does with the run, not a run setting: "
                          f"{instead}", location=source, field=key)
    if name in SETTING_ALIASES:
        raise ConfigError(f"vLLM's name (--{name.replace('_', '-')}); kvsim's setting is "
                          f"{SETTING_ALIASES[name]!r}", location=source, field=key)


def _checked_init(init):
    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except ValidationError as e:
            raise validation_error(e) from None
    __init__.__doc__ = init.__doc__
    return __init__


# A bad value is a one-line ConfigError (a ValueError) however the config is built: by a
# constructor call, dataclasses.replace or from_dict.
RunConfig.__init__ = _checked_init(RunConfig.__init__)


def setting_names() -> set[str]:
    """The names of every run setting."""
    return {f.name for f in fields(RunConfig)}


def default_of(name: str):
    """The default value of run setting ``name``."""
    return next(f.default for f in fields(RunConfig) if f.name == name)


def choices_of(name: str) -> tuple[str, ...] | None:
    """The allowed values of a choice setting (``None`` for a free one)."""
    tp = next(f.type for f in fields(RunConfig) if f.name == name)
    return literal_values(tp)


def literal_values(tp) -> tuple | None:
    """The values of a ``Literal`` type, also inside ``Optional[...]``; else ``None``."""
    if isinstance(tp, str):  # postponed annotation
        tp = eval(tp, globals())  # noqa: S307 - our own annotations only
    if get_origin(tp) is Literal:
        return get_args(tp)
    for arg in get_args(tp):
        values = literal_values(arg)
        if values:
            return values
    return None


def build(cls, values: dict, source: str | None = None):
    """``cls(**values)``; a bad value is a :class:`ConfigError` located at ``source``."""
    try:
        return cls(**values)
    except ConfigError as e:
        raise located(e, source) from None


def located(error: ConfigError, source: str | None) -> ConfigError:
    """``error``, naming ``source`` as where it was found unless it names a place already."""
    if source and error.location is None:
        error.location = source
        error.args = (error.one_line(),)
    return error


def validation_error(error: ValidationError, source: str | None = None) -> ConfigError:
    """The first problem of a pydantic ``ValidationError`` as a one-line :class:`ConfigError`."""
    first = error.errors(include_url=False)[0]
    loc = [str(p) for p in first.get("loc", ()) if not isinstance(p, int)]
    field = loc[0] if loc else None
    if field == "cpu_offload_gb":
        return ConfigError(CPU_OFFLOAD_GB_REFUSAL, location=source, field=field)
    return ConfigError(f"{_message(first)}, got {_show(first.get('input'))}",
                       location=source, field=field)


def _message(err: dict) -> str:
    kind, ctx = err.get("type", ""), err.get("ctx") or {}
    value = err.get("input")
    if isinstance(value, float) and not math.isfinite(value):     # (no bound holds for nan)
        return "expected a finite number"
    if kind == "literal_error":
        return f"expected one of {ctx.get('expected', '').replace(' or ', ', ')}"
    bounds = {"greater_than_equal": ("at least", "ge"), "greater_than": ("more than", "gt"),
              "less_than_equal": ("at most", "le"), "less_than": ("less than", "lt")}
    if kind in bounds:
        word, key = bounds[kind]
        return f"must be {word} {ctx.get(key)}"
    words = {"int_type": "expected an integer", "int_from_float": "expected an integer",
             "float_type": "expected a number", "bool_type": "expected true or false",
             "string_type": "expected a string", "finite_number": "expected a finite number",
             "unexpected_keyword_argument": "unknown setting"}
    if kind in words:
        return words[kind]
    text = str(err.get("msg", "invalid value"))
    return text[0].lower() + text[1:] if text else "invalid value"


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
