"""Every setting of a simulated run, named as vLLM names them where it has a name."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

from kvsim.cache.contiguous import RESERVE_POLICIES
from kvsim.cache.policies import POLICY_NAMES
from kvsim.cache.scheduler import PREEMPTION_MODES
from kvsim.cache.tiered import WRITE_POLICIES
from kvsim.errors import ConfigError
from kvsim.identity import SAMPLING_MODES

from .models import DTYPE_BYTES, weight_dtype_bytes

LAYOUTS = ("paged", "contiguous", "hybrid")


@dataclass(frozen=True)
class RunConfig:
    """Settings of one ``kvsim run`` (all of them end up in ``summary.json``'s ``config``)."""

    trace: str = "sample:mooncake"
    model: str = "llama-3.1-8b"
    gpu: str = "a100-80gb"
    tp: int = 1
    replicas: int = 1
    router: str = "round-robin"
    block_size: int = 16
    num_gpu_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"
    enable_chunked_prefill: bool = True
    scheduler_reserve_full_isl: bool = True   # admit only when the whole sequence fits
    sampling: str = "random"              # ids of unrecorded generated tokens: random, greedy
    dtype: str = "bf16"                   # KV cache, and weights unless weight_dtype is set
    weight_dtype: str | None = None       # bf16, fp16, fp8, int8, int4 (default: dtype)
    profile: str | None = None
    seed: int = 0
    skip_ahead: bool = True
    eviction: str = "lru"
    layout: str = "paged"
    reserve: str = "max"
    hybrid_threshold: int = 256
    compaction_threshold: float | None = None
    num_cpu_blocks: int | None = None     # host tier size in blocks (per replica) ...
    cpu_offload_gb: float = 0.0           # ... or in GiB of host memory per GPU
    offload_write: str = "back"           # demote on eviction (back) or on fill (through)
    preemption_mode: str = "recompute"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict, source: str = "config") -> "RunConfig":
        """Build from a mapping (a TOML file, CLI options); unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        for key in values:
            if key.replace("-", "_") not in known:
                raise ConfigError(f"unknown setting; known: {', '.join(sorted(known))}",
                                  location=source, field=key)
        return cls(**{k.replace("-", "_"): v for k, v in values.items()})

    def validate(self) -> None:
        positive = ("tp", "replicas", "block_size", "max_num_seqs", "max_num_batched_tokens")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"must be at least 1, got {getattr(self, name)}", field=name)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"must be in (0, 1], got {self.gpu_memory_utilization}",
                              field="gpu_memory_utilization")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ConfigError(f"expected 'fcfs' or 'priority', got {self.scheduling_policy!r}",
                              field="scheduling_policy")
        if self.sampling not in SAMPLING_MODES:
            raise ConfigError(f"expected one of {', '.join(SAMPLING_MODES)}, got "
                              f"{self.sampling!r}", field="sampling")
        if self.eviction not in POLICY_NAMES:
            raise ConfigError(f"expected one of {', '.join(POLICY_NAMES)}, got "
                              f"{self.eviction!r}", field="eviction")
        self._validate_layout()
        self._validate_tiering()
        self._validate_dtypes()
        if self.profile is not None and not Path(self.profile).is_file():
            raise ConfigError("no such profile file", location=str(self.profile),
                              field="profile")

    def _validate_layout(self) -> None:
        if self.layout not in LAYOUTS:
            raise ConfigError(f"expected one of {', '.join(LAYOUTS)}, got {self.layout!r}",
                              field="layout")
        if self.reserve not in RESERVE_POLICIES:
            raise ConfigError(f"expected one of {', '.join(RESERVE_POLICIES)}, got "
                              f"{self.reserve!r}", field="reserve")
        if self.hybrid_threshold < 1:
            raise ConfigError(f"must be at least 1, got {self.hybrid_threshold}",
                              field="hybrid_threshold")
        f = self.compaction_threshold
        if f is not None and not 0 <= f < 1:
            raise ConfigError(f"must be in [0, 1), got {f}", field="compaction_threshold")
        if f is not None and self.layout != "contiguous":
            raise ConfigError("compaction needs --layout contiguous", field="compaction_threshold")
        if self.layout == "hybrid" and self.eviction != "lru":
            raise ConfigError("the hybrid layout pages with lru eviction only", field="eviction")

    def _validate_dtypes(self) -> None:
        if self.dtype.lower() not in DTYPE_BYTES:
            raise ConfigError(f"expected one of {', '.join(sorted(DTYPE_BYTES))}, got "
                              f"{self.dtype!r}", field="dtype")
        if self.weight_dtype is not None:
            weight_dtype_bytes(self.weight_dtype)

    @property
    def has_host_tier(self) -> bool:
        return bool(self.num_cpu_blocks) or self.cpu_offload_gb > 0

    def _validate_tiering(self) -> None:
        if self.num_cpu_blocks is not None and self.num_cpu_blocks < 0:
            raise ConfigError(f"must be >= 0, got {self.num_cpu_blocks}", field="num_cpu_blocks")
        if self.cpu_offload_gb < 0:
            raise ConfigError(f"must be >= 0, got {self.cpu_offload_gb}", field="cpu_offload_gb")
        if self.num_cpu_blocks and self.cpu_offload_gb:
            raise ConfigError("give the host tier in blocks or in GiB, not both",
                              field="cpu_offload_gb")
        if self.offload_write not in WRITE_POLICIES:
            raise ConfigError(f"expected one of {', '.join(WRITE_POLICIES)}, got "
                              f"{self.offload_write!r}", field="offload_write")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ConfigError(f"expected one of {', '.join(PREEMPTION_MODES)}, got "
                              f"{self.preemption_mode!r}", field="preemption_mode")
        if self.has_host_tier and self.layout != "paged":
            raise ConfigError("a host tier needs --layout paged", field="layout")
        if self.preemption_mode == "swap" and not self.has_host_tier:
            raise ConfigError("swap preemption needs a host tier (--num-cpu-blocks or "
                              "--cpu-offload-gb)", field="preemption_mode")
