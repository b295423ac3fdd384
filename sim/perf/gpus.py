"""GPU specifications from ``catalog/gpus.json``."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvsim.errors import ConfigError
from kvsim.sim.perf._catalog import close_matches, load_catalog


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's datasheet numbers. Bandwidths are bytes/s per direction; FLOP/s are dense."""

    name: str
    display_name: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    dense_bf16_flops: float
    l2_cache_bytes: int
    interconnect_type: str
    interconnect_bandwidth_bytes_per_s: float
    pcie_host_bandwidth_bytes_per_s: float
    price_per_hour_usd: float | None = None
    aliases: tuple[str, ...] = field(default=(), compare=False)


def _from_entry(name: str, e: dict) -> GpuSpec:
    link = e["interconnect"]
    return GpuSpec(
        name=name, display_name=e["display_name"], memory_bytes=int(e["memory_bytes"]),
        hbm_bandwidth_bytes_per_s=float(e["hbm_bandwidth_bytes_per_s"]),
        dense_bf16_flops=float(e["dense_bf16_flops"]), l2_cache_bytes=int(e["l2_cache_bytes"]),
        interconnect_type=link["type"],
        interconnect_bandwidth_bytes_per_s=float(link["bandwidth_bytes_per_s"]),
        pcie_host_bandwidth_bytes_per_s=float(e["pcie_host_bandwidth_bytes_per_s"]),
        price_per_hour_usd=e.get("price_per_hour_usd"), aliases=tuple(e.get("aliases", ())))


def list_gpus() -> list[str]:
    """Catalog names, sorted."""
    return sorted(load_catalog("gpus.json")["gpus"])


def gpu_name(name: str) -> str | None:
    """The catalog name of ``name`` (itself, or an alias's; case ignored), None if unknown."""
    try:
        return resolve_gpu(name).name
    except ConfigError:
        return None


def resolve_gpu(name: str | GpuSpec) -> GpuSpec:
    """A catalog name (``a100-80gb``) or alias (``h100``, ``A100-SXM4-80GB``), case ignored."""
    if isinstance(name, GpuSpec):
        return name
    gpus = load_catalog("gpus.json")["gpus"]
    index = {k: k for k in gpus}
    for key, entry in gpus.items():
        index.update({a.lower(): key for a in entry.get("aliases", ())})
    typed = str(name).lower().replace("_", "-").replace(" ", "-")
    key = index.get(typed)
    both = load_catalog("gpus.json").get("ambiguous", {}).get(typed)
    if both:
        raise ConfigError(f"'{name}' names more than one GPU: give {' or '.join(both)}",
                          field="gpu")
    if key is None:
        hint = close_matches(str(name).lower(), index)
        raise ConfigError(f"unknown GPU '{name}'{hint}; known: {', '.join(sorted(gpus))}",
                          field="gpu")
    return _from_entry(key, gpus[key])
