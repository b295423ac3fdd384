"""Settings shared by ``kvsim profile`` and ``kvsim validate``, and building a runner from them.

CPU timings are only comparable under the same thread count, so :func:`prepare_device` pins
``torch.set_num_threads`` (and the inter-op pool) before anything runs.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass

import torch

from kvsim.errors import ConfigError

from kvsim.real_backend.torch_executor import CLOCKS
from kvsim.real_backend.llama import resolve_dtype
from kvsim.real_backend.backend_model import BackendModel, resolve_backend_model
from kvsim.real_backend.model_runner import ModelRunner, RequestChunk


@dataclass(frozen=True)
class BackendSettings:
    """Which model runs where, and how steps are timed."""

    model: str = "tiny-llama"
    device: str = "cpu"
    dtype: str = "fp32"
    block_size: int = 32
    threads: int = 1
    seed: int = 0
    clock: str = "wall"

    def to_dict(self) -> dict:
        return asdict(self)

    def validate(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"expected 'cpu' or 'cuda', got {self.device!r}", field="device")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("no CUDA device is available (torch.cuda.is_available() is "
                              "False)", field="device")
        if self.clock not in CLOCKS or (self.clock == "cpu" and self.device == "cuda"):
            raise ConfigError(f"expected one of {CLOCKS} ('cpu' on the CPU only), got "
                              f"{self.clock!r}", field="clock")
        if self.block_size < 1 or self.threads < 1:
            raise ConfigError("block size and threads must be at least 1", field="block_size")
        try:
            resolve_dtype(self.dtype)
        except ValueError as exc:
            raise ConfigError(str(exc), field="dtype") from None


def prepare_device(settings: BackendSettings) -> BackendModel:
    """Validate the settings, pin torch's threads, resolve the model."""
    settings.validate()
    torch.set_num_threads(settings.threads)
    try:
        torch.set_num_interop_threads(settings.threads)
    except RuntimeError:  # may only be set once per process
        pass
    model = resolve_backend_model(settings.model)
    check_memory(model, settings.dtype, settings.device)
    return model


def check_memory(model: BackendModel, dtype: str, device: str) -> None:
    """Refuse a model whose random weights do not fit where they are built (drawn in fp32,
    then cast to ``dtype``), before minutes of drawing them end in the kernel's OOM killer."""
    params = model.spec.num_params
    cast = resolve_dtype(dtype)
    need = params * (4 + (0 if cast == torch.float32 else cast.itemsize))
    drawn = "in fp32" if cast == torch.float32 else f"drawn in fp32, then cast to {dtype}"
    free, where = _free_memory(device)
    if free is not None and need > free:
        raise ConfigError(
            f"{model.spec.name} has {params / 1e9:.1f}B parameters: its random weights need about "
            f"{need / 2**30:,.0f} GiB to build ({drawn}), and {where} has "
            f"{free / 2**30:,.0f} GiB free; the real backend runs small models (tiny-llama, "
            "or a config.json of a few hundred million parameters)", field="model")


def _free_memory(device: str) -> tuple[int | None, str]:
    """Bytes free on ``device`` (None: unknown) and its name in words."""
    if device == "cuda":
        return torch.cuda.mem_get_info()[0], "the GPU"
    try:
        for line in open("/proc/meminfo", encoding="utf-8"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "this machine"
    except (OSError, ValueError, IndexError):
        pass
    return None, "this machine"


def build_runner(settings: BackendSettings, model: BackendModel, num_blocks: int,
                 num_host_blocks: int = 0) -> ModelRunner:
    """A random-weight model and a KV store of ``num_blocks`` device blocks."""
    return ModelRunner.create(model.llama_config(), num_blocks=num_blocks,
                              block_size=settings.block_size, num_host_blocks=num_host_blocks,
                              seed=settings.seed, dtype=settings.dtype, device=settings.device)


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's model (best effort)."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def warm_up(runner: ModelRunner, max_rows: int = 32, head_layouts: dict | None = None) -> None:
    """Before timing anything: tune the CPU LM head's layouts (see :mod:`.cpu_head`; or take
    ``head_layouts``, the choices a profile recorded, and add any row count it lacks) and run a
    prefill and a decode step once (first calls of a shape pay one-off costs). The steps write
    K/V into the first blocks; every request writes its own K/V before reading it, and prefix
    hits only name blocks a request computed, so nothing stale is ever read."""
    if runner.device.type == "cpu":
        head = runner.model.cpu_head()
        if head_layouts:
            head.set_layouts(head_layouts)
        missing = [rows for rows in range(1, max_rows + 1) if rows not in head.row_major]
        if missing:
            head.tune(row_counts=missing)
    bs, blocks = runner.kv_store.block_size, runner.kv_store.num_blocks
    n = min(64, bs * blocks)
    runner.greedy([RequestChunk(list(range(n)), 0, list(range(-(-n // bs))))])
    rows = min(max_rows, blocks)
    runner.greedy([RequestChunk([1], 0, [i]) for i in range(rows)])


def keep_warm(runner: ModelRunner, seconds: float, rows: int = 8, context: int = 512) -> int:
    """Run one decode step of ``rows`` requests at ``context`` tokens over and over for
    ``seconds`` (wall clock), after :func:`warm_up`: a longer warm-up, to see whether the first
    seconds of a run are slower than the rest (CPU frequency, caches, allocator). Returns the
    number of steps run."""
    import time
    bs, blocks = runner.kv_store.block_size, runner.kv_store.num_blocks
    per_request = -(-(context + 1) // bs)
    rows = max(min(rows, blocks // per_request), 1)
    context = min(context, per_request * bs - 1, blocks * bs - 1)
    chunks = [RequestChunk([1], context, [(i * per_request + k) % blocks
                                          for k in range(per_request)]) for i in range(rows)]
    steps, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        runner.greedy(chunks)
        steps += 1
    return steps
