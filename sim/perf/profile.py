"""Calibration profiles: the efficiency factors and overheads the cost model multiplies specs by.

A profile is a JSON object (see ``profiles/a100-80gb.json``); keys missing from a user's profile
take the values of the GPU's default profile, so a file may override a single number.
``CostModel(profile=None)`` loads ``profiles/<gpu>.json``.

A *fitted* profile (``"kind": "fitted"``, written by ``kvsim profile``) carries absolute
per-unit times measured on one device for one model (``fitted`` below), so it needs no GPU
datasheet: it can describe a CPU. The cost model then uses those coefficients directly (the GPU
given to it only names the default profile underneath) and refuses a model of another shape.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvsim.errors import ConfigError
from kvsim.sim.perf._catalog import profile_path, read_json_object

ELEMENTWISE_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")


@dataclass(frozen=True)
class Roofline:
    """``time = latency_s + max(flops(rows) / (peak * compute_eff), bytes / (bw * memory_eff))``.

    ``rows`` is the measured compute-efficiency curve over tokens per step, both parts
    optional: ``max(curve(tokens), padded(tokens))``. ``curve`` (JSON ``efficiency_curve:
    {"tokens": [...], "rows": [...]}``) is piecewise-linear through ``(0, 0)`` and the listed
    points, slope 1 beyond the last: a GEMM over ``tokens`` rows runs at the efficiency of
    ``rows`` rows at ``compute_eff``, which models the soft corner at the roofline's ridge
    (rows above tokens there). ``padded`` is wave quantization: with ``tile_tokens`` T and
    ``tile_padding`` a, ``tokens + a * (ceil(tokens / T) * T - tokens)`` beyond one tile. Both never decrease,
    so more tokens never take less time; without either, rows = tokens.

    *Shaped* GEMMs (``num_sms`` and ``tiles`` given; see :func:`kvsim.sim.perf.gemm.gemm_time`)
    replace that single curve by each GEMM's own matrix shape: ``tiles`` holds ``(tile_m,
    tile_n, efficiency)`` per output-tile shape the GEMM library may pick (the fastest wins),
    ``wave_tail`` the share of a last, partly filled wave of tiles over ``num_sms`` SMs that is
    paid, ``memory_latency_s``/``latency_s`` the floors of the memory- and compute-bound
    sides, and ``smoothness`` q the exponent of the soft maximum ``(mem^q + comp^q)^(1/q)``
    joining them (0: a hard corner)."""

    compute_efficiency: float
    memory_efficiency: float
    latency_s: float
    tile_tokens: float = 0.0
    tile_padding: float = 0.0
    curve_tokens: tuple[float, ...] = ()
    curve_rows: tuple[float, ...] = ()
    num_sms: int = 0
    tiles: tuple[tuple[float, float, float], ...] = ()
    wave_tail: float = 1.0
    memory_latency_s: float = 0.0
    smoothness: float = 0.0

    @property
    def shaped(self) -> bool:
        """True when GEMM times come from matrix shapes (tiles over SMs), not ``rows``."""
        return bool(self.num_sms and self.tiles)

    def rows(self, tokens):
        """Rows whose FLOPs a GEMM over ``tokens`` (a python or numpy scalar) costs."""
        rows = padded_rows(tokens, self.tile_tokens, self.tile_padding)
        if not self.curve_tokens:
            return rows
        return max(rows, curve_rows(tokens, self.curve_tokens, self.curve_rows))


def curve_rows(tokens, knots, rows):
    """The efficiency curve at ``tokens`` (a scalar): linear through (0, 0) and ``(knots[i],
    rows[i])``, slope 1 beyond the last knot; pure python, so every path gets the same float."""
    x0 = y0 = 0.0
    for x1, y1 in zip(knots, rows):
        if tokens <= x1:
            return y0 + (tokens - x0) * (y1 - y0) / (x1 - x0)
        x0, y0 = x1, y1
    return y0 + (tokens - x0)


def curve_rows_array(tokens: np.ndarray, knots, rows) -> np.ndarray:
    """:func:`curve_rows` for an array of token counts."""
    x, y = np.concatenate([[0.0], knots]), np.concatenate([[0.0], rows])
    return np.interp(tokens, x, y) + np.maximum(tokens - x[-1], 0.0)


def padded_rows(tokens, tile: float, padding: float):
    """``tokens + padding * (ceil(tokens / tile) * tile - tokens)`` beyond one tile, ``tokens``
    up to it (a GEMM of at most one tile of rows runs small-M kernels) or when ``tile`` is 0;
    numpy arrays and scalars alike; never decreasing in ``tokens``."""
    if not tile:
        return tokens
    padded = tokens + padding * (np.ceil(tokens / tile) * tile - tokens)
    if isinstance(tokens, np.ndarray):
        return np.where(tokens > tile, padded, tokens)
    return padded if tokens > tile else tokens


@dataclass(frozen=True)
class Elementwise:
    """``time = max(min_time_s + row_bytes * row_s_per_byte, bytes / (bw * memory_efficiency))``
    for one memory-bound kernel; ``row_bytes`` is what one token's row reads and writes (a
    kernel that gives each row to one thread block takes longer for wider rows even when
    the batch is tiny; 0 when the profile does not say). With ``smoothness`` q > 0 the
    maximum is the soft ``(floor^q + stream^q)^(1/q)``: the measured knee is round."""

    memory_efficiency: float
    min_time_s: float
    row_s_per_byte: float = 0.0
    smoothness: float = 0.0


FITTED_TERMS = ("step_s", "per_seq_s", "per_token_s", "per_kv_token_s", "per_attn_unit_s",
                "host_copy_s_per_byte", "device_copy_s_per_byte", "copy_call_s")
MODEL_SHAPE_KEYS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                    "intermediate_size", "vocab_size")


@dataclass(frozen=True)
class Fitted:
    """Measured coefficients (seconds, or seconds per unit) of one model on one device.

    A step of ``tokens`` new tokens over ``seqs`` requests reading ``kv`` KV tokens with
    ``units`` attention units (see ``cost_model``) takes ``step_s + per_seq_s * seqs +
    per_token_s * tokens + per_kv_token_s * kv + per_attn_unit_s * units``; one block copy call
    ``copy_call_s`` plus bytes times ``host_copy_s_per_byte`` (host<->device) or
    ``device_copy_s_per_byte`` (compaction). ``model_shape`` names the model it was fitted on.

    ``per_batch_s`` (optional) adds, to a step of ``seqs`` requests, seconds measured for
    exactly that many requests: entry ``n - 1`` for ``n`` requests, and beyond the table its last
    entry plus ``per_batch_slope_s`` per further request. It carries costs that are irregular in
    the batch size (on a CPU: the LM head GEMM, whose speed jumps between row counts), which no
    linear term can follow.
    """

    step_s: float
    per_seq_s: float
    per_token_s: float
    per_kv_token_s: float
    per_attn_unit_s: float
    host_copy_s_per_byte: float
    device_copy_s_per_byte: float
    copy_call_s: float
    model_shape: dict
    per_batch_s: tuple[float, ...] = ()
    per_batch_slope_s: float = 0.0


@dataclass(frozen=True)
class Profile:
    """Efficiencies (fractions of datasheet peaks) and fixed costs (seconds) for one GPU."""

    gemm: Roofline
    elementwise: dict[str, Elementwise]
    attn_prefill_compute_efficiency: float
    attn_decode_memory_efficiency: float
    attn_latency_s: float
    all_reduce: dict[int, tuple[float, float]]   # tp -> (latency_s, bus bandwidth bytes/s)
    all_reduce_link_efficiency: float            # for tp not measured: bus bw = eff * link bw
    all_reduce_default_latency_s: float
    pcie_efficiency: float
    copy_memory_efficiency: float
    step_overhead_s: float
    per_seq_overhead_s: float
    raw: dict
    fitted: Fitted | None = None

    def all_reduce_params(self, tp: int, link_bandwidth: float) -> tuple[float, float]:
        """(latency_s, bus bandwidth) for ``tp`` GPUs: measured if listed, else the fallback."""
        if tp in self.all_reduce:
            return self.all_reduce[tp]
        return self.all_reduce_default_latency_s, self.all_reduce_link_efficiency * link_bandwidth


def load_profile(gpu_name: str, profile: None | str | Path | dict = None) -> Profile:
    """The default profile of ``gpu_name`` overlaid with ``profile`` (a path or a dict)."""
    path = profile_path(gpu_name)
    if not path.exists():
        path = profile_path("a100-80gb")
    data = json.loads(path.read_text())
    where = None if profile is None or isinstance(profile, dict) else str(profile)
    if profile is not None:
        override = profile if isinstance(profile, dict) else _read(Path(profile))
        check_gpu(override, gpu_name, where)
        check_sections(override, where)
        check_keys(override, where)
        check_numbers(override, where)
        _overlay(data, override)
    try:
        return _build(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"calibration profile is missing or has a bad value: {exc}",
                          location=where, field="profile") from None


def check_gpu(d: dict, gpu_name: str, where: str | None) -> None:
    """A roofline profile holds one GPU's efficiencies: one measured on another GPU than the
    run's is refused (it was applied silently). A fitted profile's step times are checked by
    the model they were measured on instead (its ``gpu`` is the label of the replay)."""
    measured = d.get("gpu")
    if d.get("kind") == "fitted" or not isinstance(measured, str):
        return
    measured, simulated = _gpu_name(measured), _gpu_name(gpu_name)
    if measured != simulated:
        raise ConfigError(f"holds the efficiencies of {measured}, and the GPU simulated is "
                          f"{simulated}: simulate {measured} (--gpu), or give a profile of "
                          f"{simulated}", location=where, field="gpu")


def _gpu_name(name: str) -> str:
    """The catalog name of GPU ``name`` (an alias such as ``h100``), or ``name`` itself."""
    from kvsim.sim.perf.gpus import resolve_gpu
    try:
        return resolve_gpu(name).name
    except ConfigError:
        return name


NUMBER_SECTIONS = ("gemm", "elementwise", "attention", "all_reduce", "transfers", "overhead",
                   "fitted")


def check_sections(d: dict, where: str | None) -> None:
    """A profile's ``kind`` is ``fitted`` if given, and a section (an object) named like one
    of :data:`NUMBER_SECTIONS` but not one is a misspelling: both were ignored silently, so
    the run used the default profile. Other keys are the writers' notes."""
    kind = d.get("kind")
    if kind is not None and kind != "fitted":
        raise ConfigError(f"unknown profile kind {kind!r}; expected 'fitted' (or none: a "
                          "roofline profile)", location=where, field="kind")
    for key, value in d.items():
        near = difflib.get_close_matches(str(key), NUMBER_SECTIONS, n=1, cutoff=0.75)
        if isinstance(value, dict) and key not in NUMBER_SECTIONS and near:
            raise ConfigError(f"unknown section; did you mean '{near[0]}'?", location=where,
                              field=str(key))


_ELEMENT_KEYS = ("memory_efficiency", "min_time_s", "row_s_per_byte", "smoothness")
_ALL_REDUCE_KEYS = ("latency_s", "bus_bandwidth_bytes_per_s")
#: The keys each section of a profile may hold (``None``: any key, here a tensor-parallel
#: size); :func:`_build` reads these and no others.
PROFILE_KEYS: dict = {
    "gemm": {**dict.fromkeys(("compute_efficiency", "memory_efficiency", "latency_s",
                              "tile_tokens", "tile_padding", "num_sms", "wave_tail",
                              "memory_latency_s", "smoothness")),
             "efficiency_curve": dict.fromkeys(("tokens", "rows")),
             "tiles": dict.fromkeys(("tile_m", "tile_n", "efficiency"))},
    "elementwise": {op: dict.fromkeys(_ELEMENT_KEYS) for op in ELEMENTWISE_OPS},
    "attention": dict.fromkeys(("prefill_compute_efficiency", "decode_memory_efficiency",
                                "latency_s")),
    "all_reduce": {"latency_s": None, "link_efficiency": None,
                   "measured": {None: dict.fromkeys(_ALL_REDUCE_KEYS)}},
    "transfers": dict.fromkeys(("pcie_efficiency", "copy_memory_efficiency")),
    "overhead": dict.fromkeys(("step_s", "per_seq_s")),
    "fitted": dict.fromkeys((*FITTED_TERMS, "per_batch_s", "per_batch_slope_s")),
}


def check_keys(d: dict, where: str | None) -> None:
    """Every key inside a section is one the profile is read for (a misspelt one was ignored
    silently: the run used the default value), and a file holds at least one section (or is
    a fitted profile); keys starting with ``_`` are notes."""
    if not any(key in PROFILE_KEYS for key in d) and d.get("kind") != "fitted":
        raise ConfigError("holds no calibration: none of the sections "
                          f"{', '.join(NUMBER_SECTIONS)} (is it a profile written by kvsim "
                          "profile or validate-real --fit?)", location=where, field="profile")
    for section in PROFILE_KEYS:
        if isinstance(d.get(section), dict):
            _check_known(d[section], PROFILE_KEYS[section], section, where)


def _check_known(d: dict, known: dict, prefix: str, where: str | None) -> None:
    for key, value in d.items():
        if str(key).startswith("_"):
            continue
        if None in known:       # (any key: measured tensor-parallel sizes)
            inner = known[None]
        elif key in known:
            inner = known[key]
        else:
            near = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
            hint = f"; did you mean '{near[0]}'?" if near else \
                f"; known: {', '.join(known)}"
            raise ConfigError("unknown key" + hint, location=where, field=f"{prefix}.{key}")
        if inner is not None and isinstance(value, dict):
            _check_known(value, inner, f"{prefix}.{key}", where)


def check_numbers(d: dict, where: str | None, prefix: str = "") -> None:
    """Every value in the numeric sections of a profile is a finite number >= 0 (> 0 for an
    efficiency); strings only under keys starting with ``_``. A :class:`ConfigError` names the
    key (``gemm.compute_efficiency``) otherwise."""
    for key, value in d.items():
        name = f"{prefix}{key}"
        if str(key).startswith("_") or (not prefix and key not in NUMBER_SECTIONS):
            continue
        if isinstance(value, dict):
            check_numbers(value, where, name + ".")
        elif isinstance(value, list):
            for item in value:
                _check_number(item, name, where)
        else:
            _check_number(value, name, where)


def _check_number(value, name: str, where: str | None) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value) and value >= 0 and not ("efficiency" in name and value == 0)
    if not ok:
        need = "> 0" if "efficiency" in name else ">= 0"
        raise ConfigError(f"expected a finite number {need}, got {value!r}", location=where,
                          field=name)


def _read(path: Path) -> dict:
    return read_json_object(path, "calibration profile", "profile")


def _overlay(base: dict, override: dict) -> None:
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _overlay(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def _build(d: dict) -> Profile:
    g, a, ar, t, o = d["gemm"], d["attention"], d["all_reduce"], d["transfers"], d["overhead"]
    measured = {int(k): (float(v["latency_s"]), float(v["bus_bandwidth_bytes_per_s"]))
                for k, v in ar.get("measured", {}).items()}
    return Profile(
        gemm=Roofline(float(g["compute_efficiency"]), float(g["memory_efficiency"]),
                      float(g["latency_s"]), float(g.get("tile_tokens", 0.0)),
                      float(g.get("tile_padding", 0.0)), *_curve(g.get("efficiency_curve")),
                      num_sms=int(g.get("num_sms", 0)), tiles=_tiles(g.get("tiles")),
                      wave_tail=float(g.get("wave_tail", 1.0)),
                      memory_latency_s=float(g.get("memory_latency_s", 0.0)),
                      smoothness=float(g.get("smoothness", 0.0))),
        elementwise={op: Elementwise(float(e["memory_efficiency"]), float(e["min_time_s"]),
                                     float(e.get("row_s_per_byte", 0.0)),
                                     float(e.get("smoothness", 0.0)))
                     for op, e in ((op, d["elementwise"][op]) for op in ELEMENTWISE_OPS)},
        attn_prefill_compute_efficiency=float(a["prefill_compute_efficiency"]),
        attn_decode_memory_efficiency=float(a["decode_memory_efficiency"]),
        attn_latency_s=float(a["latency_s"]), all_reduce=measured,
        all_reduce_link_efficiency=float(ar["link_efficiency"]),
        all_reduce_default_latency_s=float(ar["latency_s"]),
        pcie_efficiency=float(t["pcie_efficiency"]),
        copy_memory_efficiency=float(t["copy_memory_efficiency"]),
        step_overhead_s=float(o["step_s"]), per_seq_overhead_s=float(o["per_seq_s"]), raw=d,
        fitted=_fitted(d) if d.get("kind") == "fitted" else None)


def _curve(c: dict | None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(tokens, rows)`` of an ``efficiency_curve`` (none: empty), checked: tokens increasing
    and > 0, rows never decreasing and as many."""
    if not c:
        return (), ()
    tokens, rows = tuple(float(v) for v in c["tokens"]), tuple(float(v) for v in c["rows"])
    if len(tokens) != len(rows) or not tokens or tokens[0] <= 0 or rows[0] < 0 or \
            any(b <= a for a, b in zip(tokens, tokens[1:])) or \
            any(b < a for a, b in zip(rows, rows[1:])):
        raise ValueError("efficiency_curve needs increasing tokens > 0 and as many rows, "
                         "never decreasing")
    return tokens, rows


def _tiles(t: dict | None) -> tuple[tuple[float, float, float], ...]:
    """``((tile_m, tile_n, efficiency), ...)`` of a ``tiles: {"tile_m": [...], "tile_n": [...],
    "efficiency": [...]}`` section (none: empty), checked: as many of each, sizes >= 1."""
    if not t:
        return ()
    out = tuple(zip(*(tuple(float(v) for v in t[k]) for k in ("tile_m", "tile_n", "efficiency"))))
    if len(out) != len(t["tile_m"]) or len({len(t["tile_m"]), len(t["tile_n"]),
                                            len(t["efficiency"])}) != 1 or \
            any(m < 1 or n < 1 for m, n, _ in out):
        raise ValueError("gemm.tiles needs as many tile_m, tile_n and efficiency values, "
                         "tile sizes >= 1")
    return out


def _fitted(d: dict) -> Fitted:
    f = d["fitted"]
    values = {k: float(f[k]) for k in FITTED_TERMS}
    if any(v < 0 for v in values.values()):
        raise ValueError(f"fitted coefficients must be >= 0: {values}")
    shape = {k: int(d["model_shape"][k]) for k in MODEL_SHAPE_KEYS}
    table = tuple(float(v) for v in f.get("per_batch_s") or ())
    slope = float(f.get("per_batch_slope_s", 0.0))
    if any(v < 0 for v in table) or slope < 0:
        raise ValueError("per_batch_s and per_batch_slope_s must be >= 0")
    if not any(values[k] for k in FITTED_TERMS if "copy" not in k) and not any(table) \
            and not slope:
        raise ValueError("every fitted step term is 0: each step would take no time")
    return Fitted(**values, model_shape=shape, per_batch_s=table, per_batch_slope_s=slope)
