"""Refit the GEMM and elementwise parameters of the shipped calibration profiles from Vidur's
measured operator timings, so the numbers in ``sim/perf/profiles/*.json`` are reproducible.

    python bench/fit_profiles.py [--data DIR] [--check]

For each GPU with data (``compute/<gpu>/<model>/mlp.csv``: a100 -> a100-80gb, h100 ->
h100-80gb), a least-squares fit on log error (soft-L1) over every (token count, TP) row of every
model of that GPU:

- each elementwise kernel on its own times: the soft maximum ``(floor^q + stream^q)^(1/q)`` of
  ``floor = min_time + row_bytes * row_s_per_byte`` and ``stream = tokens * bytes / (bw * eff)``
  (the per-row term is the small-token region: a kernel that gives each token's row to one
  thread block takes longer for wider rows; q rounds the knee);
- each GEMM (``attn_pre_proj, attn_post_proj, mlp_up_proj, mlp_down_proj``) on its own times,
  by its matrix shape (``kvsim.sim.perf.gemm.gemm_time``): the soft maximum of a memory side
  ``memory_latency + bytes / (bw * memory_eff)`` and a compute side ``latency + waves * tile
  FLOPs / (SM peak * tile eff)`` for the fastest of the output tiles :data:`TILES`, with
  ``ceil(tokens / tile_m) * ceil(N / tile_n)`` tiles over the GPU's SMs (:data:`NUM_SMS`) and
  ``wave_tail`` of a partly filled last wave paid. Eight numbers per GPU, one set for every
  operator, model and TP degree: what differs between them is the shape (N, K).

It writes those sections into ``sim/perf/profiles/<gpu>.json`` and into the profiles copied from it
(:data:`COPIES`: same architecture, not measured here); every other section is left alone.
``--check`` writes nothing and exits 1 if a file would change. Needs scipy.

Data: Vidur (Agrawal et al., MLSys 2024), github.com/microsoft/vidur ``data/profiling/`` (MIT).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from kvsim.sim.perf import calibration as cal
from kvsim.sim.perf.gpus import resolve_gpu
from kvsim.sim.perf.profile import ELEMENTWISE_OPS, Elementwise, Roofline, load_profile

TILES = ((128, 128), (64, 128), (64, 64))
"""Output tile shapes (rows of tokens x columns of N) the GEMM library chooses between: the
large CUTLASS/cuBLAS tile, and the smaller ones it takes when a GEMM has too few tiles to fill
the GPU (small batches, narrow TP shards)."""
NUM_SMS = {"a100-80gb": 108, "a100-40gb": 108, "h100-80gb": 132, "h200": 132, "l4": 58,
           "l40s": 142}
"""Streaming multiprocessors per GPU (datasheets): the width of one wave of tiles."""
MAX_NFEV = 300
"""Evaluations of each fit (bounded: the held-out error stops moving well before)."""
COPIES = {"a100-80gb": ("a100-40gb", "l4", "l40s"), "h100-80gb": ("h200",)}
"""Profiles whose GEMM and elementwise parameters are copies of a fitted one."""
PROFILES = Path(__file__).resolve().parents[1] / "sim" / "profiles"


MAX_TOKENS = 4096
"""Rows above this many tokens are left out of the fit (Vidur measured some models to 4,096
tokens, others to 32,768: every model then weighs alike, over the range a step usually has)."""


def _residuals(gpu_name: str, sets, ops, prof) -> np.ndarray:
    gpu = resolve_gpu(gpu_name)
    return np.concatenate([np.log(cal.predict_op(m, gpu, prof, op, df["num_tokens"], df["tp"])
                                  / df[op].to_numpy()) for df, m in sets for op in ops])


def _clip(sets) -> list:
    return [(df[df["num_tokens"] <= MAX_TOKENS], m) for df, m in sets]


def _r(v, digits):
    return float(v) if digits is None else round(float(v), digits)


def _us(v, rounded: bool) -> float:
    """Microseconds ``v`` in seconds (rounded: to the nanosecond)."""
    return round(float(v) * 1e-6, 9) if rounded else float(v) * 1e-6


def gemm_section(x, num_sms: int, rounded: bool = False) -> dict:
    """The ``gemm`` section for parameters ``[memory_eff, memory latency us, compute latency
    us, smoothness, wave_tail, eff of each tile of TILES]`` (``rounded``: to the digits
    written into the profile). ``compute_efficiency`` (the large tile's) and ``latency_s``
    also serve the unshaped roofline of mixture-of-experts models."""
    d = 4 if rounded else None
    effs = [_r(v, d) for v in x[5:]]
    return {"compute_efficiency": effs[0], "memory_efficiency": _r(x[0], d),
            "memory_latency_s": _us(x[1], rounded), "latency_s": _us(x[2], rounded),
            "smoothness": _r(x[3], d), "wave_tail": _r(x[4], d), "num_sms": num_sms,
            "tiles": {"tile_m": [m for m, _ in TILES], "tile_n": [n for _, n in TILES],
                      "efficiency": effs}}


def elementwise_entry(x, rounded: bool = False) -> dict:
    """One kernel's entry for ``[eff, min_time us, row ns per byte, smoothness]``."""
    d = 4 if rounded else None
    return {"memory_efficiency": _r(x[0], d), "min_time_s": _us(x[1], rounded),
            "row_s_per_byte": _r(_r(x[2], 6 if rounded else None) * 1e-9, 15 if rounded else None),
            "smoothness": _r(x[3], d)}


def _fit_gemm(gpu_name: str, sets, base) -> dict:
    """GEMM section fitted (log error, soft-L1) on every GEMM's own times."""
    from scipy.optimize import least_squares

    sms = NUM_SMS[gpu_name]
    start = [0.85, 1.0, 4.0, 2.0, 0.3] + [0.75, 0.7, 0.6]
    lower = [0.1, 0.0, 0.0, 1.0, 0.0] + [0.05] * len(TILES)
    upper = [1.0, 30.0, 30.0, 20.0, 1.0] + [1.0] * len(TILES)

    def residuals(x):
        return _residuals(gpu_name, sets, cal.GEMM_OPS, replace(base, gemm=_roofline(
            gemm_section(x, sms))))
    r = least_squares(residuals, start, loss="soft_l1", f_scale=0.15, bounds=(lower, upper),
                      x_scale="jac", max_nfev=MAX_NFEV)
    return gemm_section(r.x, sms, rounded=True)


def _roofline(g: dict) -> Roofline:
    t = g["tiles"]
    return Roofline(g["compute_efficiency"], g["memory_efficiency"], g["latency_s"],
                    num_sms=g["num_sms"], tiles=tuple(zip(t["tile_m"], t["tile_n"], t["efficiency"])),
                    wave_tail=g["wave_tail"], memory_latency_s=g["memory_latency_s"],
                    smoothness=g["smoothness"])


def fit_gpu(gpu_name: str, sets) -> dict:
    """``{"gemm": ..., "elementwise": ...}`` fitted to ``sets`` (``[(frame, model)]``, all
    measured on ``gpu_name``): each kernel on its own times, the GEMMs on theirs."""
    from scipy.optimize import least_squares

    sets, base = _clip(sets), load_profile(gpu_name)
    out = {"elementwise": {}}
    for op in ELEMENTWISE_OPS:
        def residuals(x, op=op):
            kernels = {**base.elementwise, op: Elementwise(**elementwise_entry(x))}
            return _residuals(gpu_name, sets, (op,), replace(base, elementwise=kernels))
        e = least_squares(residuals, [0.5, 3.0, 0.0, 4.0], loss="soft_l1", f_scale=0.05,
                          bounds=([0.05, 0, 0, 1.0], [1.0, 50, 1.0, 20.0]), max_nfev=MAX_NFEV)
        out["elementwise"][op] = elementwise_entry(e.x, rounded=True)
    out["gemm"] = _fit_gemm(gpu_name, sets, base)
    return out


def datasets(data_dir: Path) -> dict[str, list]:
    """``{catalog gpu: [(frame, model), ...]}`` for every mlp.csv under ``data_dir``."""
    out: dict[str, list] = {}
    for path, gpu in cal.find_mlp_files(data_dir):
        out.setdefault(gpu, []).append(cal.load_mlp_file(path))
    return out


def updated(name: str, fit: dict, source: str) -> str:
    """The JSON text of profile ``name`` with the fitted sections replaced (its own SM count)."""
    data = json.loads((PROFILES / f"{name}.json").read_text())
    data["gemm"] = {**fit["gemm"], "num_sms": NUM_SMS[name],
                    "_source": f"bench/fit_profiles.py: {source}"}
    data["elementwise"] = {**fit["elementwise"], "_source": "bench/fit_profiles.py: per-kernel "
                           "fit of the soft maximum (q) of min_time + row_bytes*row_s_per_byte and "
                           "tokens*bytes/(bw*eff)"}
    return json.dumps(data, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="Vidur profiling folder (default: "
                    "shared/calibration/vidur)")
    ap.add_argument("--check", action="store_true", help="exit 1 if a profile would change")
    args = ap.parse_args(argv)
    root = Path(args.data) if args.data else (cal.calibration_dir() or Path(".")) / "vidur"
    changed = []
    for gpu, sets in sorted(datasets(root).items()):
        fit = fit_gpu(gpu, sets)
        source = (f"least-squares fit (log error, soft-L1) of GEMM time by matrix shape: soft max "
                  f"of memory_latency + bytes/(bw*eff_m) and latency + waves*tile FLOPs/(SM peak*"
                  f"tile eff), tiles {TILES} over num_sms SMs, to Vidur's GEMM medians, {len(sets)} "
                  f"model(s), rows of 1..{MAX_TOKENS} tokens, TP 1/2/4/8")
        for name in (gpu, *COPIES.get(gpu, ())):
            text, path = updated(name, fit, source), PROFILES / f"{name}.json"
            if path.read_text() != text:
                changed.append(name)
                if not args.check:
                    path.write_text(text)
        print(f"{gpu}: {json.dumps(fit)}")
    print(("would change: " if args.check else "changed: ") + (", ".join(changed) or "nothing"))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
