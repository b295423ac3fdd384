"""Refit the GEMM and elementwise parameters of the shipped calibration profiles from Vidur's
measured operator timings, so the numbers in ``sim/profiles/*.json`` are reproducible.

    python bench/fit_profiles.py [--data DIR] [--check]

For each GPU with data (``compute/<gpu>/<model>/mlp.csv``: a100 -> a100-80gb, h100 ->
h100-80gb), a least-squares fit on log error (soft-L1) over every (token count, TP) row of every
model of that GPU:

- each elementwise kernel on its own times: ``max(min_time + row_bytes * row_s_per_byte,
  tokens * bytes / (bw * eff))`` (the per-row term is the small-token region: a kernel that
  gives each token's row to one thread block takes longer for wider rows);
- then the GEMMs (``attn_pre_proj, attn_post_proj, mlp_up_proj, mlp_down_proj``) on the
  layer's total time, the kernels held: ``latency + max(FLOPs(rows) / (peak * eff_c), weight
  bytes / (bw * eff_m))`` with ``rows = tokens + a * (ceil(tokens / 128) * 128 - tokens)``
  beyond one tile (wave quantization), and rows = max(that, curve(tokens)), the curve
  piecewise-linear through (0, 0) and its fitted points at :data:`KNOTS` (never decreasing):
  the ridge region, where a hard roofline was ~20% too fast.

It writes those sections into ``sim/profiles/<gpu>.json`` and into the profiles copied from it
(:data:`COPIES`: same architecture, not measured here); every other section is left alone.
``--check`` writes nothing and exits 1 if a file would change. Needs scipy.

Data: Vidur (Agrawal et al., MLSys 2024), github.com/microsoft/vidur ``data/profiling/`` (MIT).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from kvsim.sim import calibration as cal
from kvsim.sim.gpus import resolve_gpu
from kvsim.sim.profile import ELEMENTWISE_OPS, load_profile

TILE = 128
"""Rows per GEMM tile (the common CUTLASS/cuBLAS tile height on A100 and H100)."""
KNOTS = (16, 48, 96, 128, 160, 192, 256, 384, 512, 1024, 2048)
"""Token counts at which the efficiency curve's rows are fitted."""
MAX_NFEV = 200
"""Evaluations of the GEMM fit (bounded: the held-out error stops moving well before)."""
COPIES = {"a100-80gb": ("a100-40gb", "l4", "l40s"), "h100-80gb": ("h200",)}
"""Profiles whose GEMM and elementwise parameters are copies of a fitted one."""
PROFILES = Path(__file__).resolve().parents[1] / "sim" / "profiles"


MAX_TOKENS = 4096
"""Rows above this many tokens are left out of the fit (Vidur measured some models to 4,096
tokens, others to 32,768: every model then weighs alike, over the range a step usually has)."""


def _residuals(gpu_name: str, sets, ops, override: dict) -> np.ndarray:
    prof, gpu = load_profile(gpu_name, override), resolve_gpu(gpu_name)
    return np.concatenate([np.log(cal.predict_op(m, gpu, prof, op, df["num_tokens"], df["tp"])
                                  / df[op].to_numpy()) for df, m in sets for op in ops])


def _clip(sets) -> list:
    return [(df[df["num_tokens"] <= MAX_TOKENS], m) for df, m in sets]


def _r(v, digits):
    return float(v) if digits is None else round(float(v), digits)


def gemm_section(x, pad: float, rounded: bool = False) -> dict:
    """The ``gemm`` section for parameters ``[eff_c, eff_m, latency us, rows at the first
    knot, increments of rows to each further knot]`` and tile padding ``pad`` (``rounded``: to
    the digits written into the profile)."""
    d = 4 if rounded else None
    rows = np.cumsum(np.asarray(x[3:], dtype=float))
    return {"compute_efficiency": _r(x[0], d), "memory_efficiency": _r(x[1], d),
            "latency_s": _r(_r(x[2], 3 if rounded else None) * 1e-6, 12 if rounded else None),
            "tile_tokens": TILE, "tile_padding": pad,
            "efficiency_curve": {"tokens": list(KNOTS),
                                 "rows": [_r(v, 2 if rounded else None) for v in rows]}}


def elementwise_entry(x, rounded: bool = False) -> dict:
    """One kernel's entry for ``[eff, min_time us, row ns per byte]``."""
    d = 4 if rounded else None
    return {"memory_efficiency": _r(x[0], d),
            "min_time_s": _r(_r(x[1], 3 if rounded else None) * 1e-6, 12 if rounded else None),
            "row_s_per_byte": _r(_r(x[2], 6 if rounded else None) * 1e-9, 15 if rounded else None)}


def _layer_residuals(gpu_name: str, sets, override: dict) -> np.ndarray:
    """Log error of the whole layer (GEMMs + kernels) per row."""
    prof, gpu = load_profile(gpu_name, override), resolve_gpu(gpu_name)
    ops = cal.GEMM_OPS + ELEMENTWISE_OPS
    return np.concatenate([np.log(sum(cal.predict_op(m, gpu, prof, op, df["num_tokens"], df["tp"])
                                      for op in ops) / df[list(ops)].sum(axis=1).to_numpy())
                           for df, m in sets])


def _fit_gemm(gpu_name: str, sets, elementwise: dict) -> dict:
    """GEMM section fitted (log error, soft-L1) on the layer's time, the kernels held; the
    curve's rows never decrease (its increments are bounded below by 0)."""
    from scipy.optimize import least_squares

    start = [0.7, 0.8, 4.0, 0.5, KNOTS[0], *np.diff(KNOTS)]
    lower = [0.1, 0.1, 0.0, 0.0] + [0.0] * len(KNOTS)
    upper = [1.0, 1.0, 50.0, 1.0] + [4.0 * KNOTS[-1]] * len(KNOTS)
    r = least_squares(lambda x: _layer_residuals(gpu_name, sets, {
        "gemm": gemm_section(np.delete(x, 3), x[3]), "elementwise": elementwise}),
        start, loss="soft_l1", f_scale=0.05, bounds=(lower, upper), x_scale="jac",
        ftol=1e-6, max_nfev=MAX_NFEV)
    return gemm_section(np.delete(r.x, 3), round(float(r.x[3]), 4), rounded=True)


def fit_gpu(gpu_name: str, sets) -> dict:
    """``{"gemm": ..., "elementwise": ...}`` fitted to ``sets`` (``[(frame, model)]``, all
    measured on ``gpu_name``): each kernel on its own times, then the GEMM terms on the
    layer's total (the kernels held), which is what a step costs."""
    from scipy.optimize import least_squares

    sets = _clip(sets)
    out = {"elementwise": {}}
    for op in ELEMENTWISE_OPS:
        e = least_squares(lambda x: _residuals(gpu_name, sets, (op,), {"elementwise": {
            op: elementwise_entry(x)}}), [0.5, 3.0, 0.0], loss="soft_l1", f_scale=0.05,
            bounds=([0.05, 0, 0], [1.0, 50, 1.0]))
        out["elementwise"][op] = elementwise_entry(e.x, rounded=True)
    out["gemm"] = _fit_gemm(gpu_name, sets, out["elementwise"])
    return out


def datasets(data_dir: Path) -> dict[str, list]:
    """``{catalog gpu: [(frame, model), ...]}`` for every mlp.csv under ``data_dir``."""
    out: dict[str, list] = {}
    for path, gpu in cal.find_mlp_files(data_dir):
        out.setdefault(gpu, []).append(cal.load_mlp_file(path))
    return out


def updated(name: str, fit: dict, source: str) -> str:
    """The JSON text of profile ``name`` with the fitted sections replaced."""
    data = json.loads((PROFILES / f"{name}.json").read_text())
    data["gemm"] = {**fit["gemm"], "_source": f"bench/fit_profiles.py: {source}"}
    data["elementwise"] = {**fit["elementwise"], "_source": "bench/fit_profiles.py: per-kernel "
                           "fit of max(min_time + row_bytes*row_s_per_byte, tokens*bytes/(bw*eff))"}
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
        source = (f"least-squares fit (log error, soft-L1) of latency + max(FLOPs(rows)/(peak*eff_c), "
                  f"bytes/(bw*eff_m)), rows = tokens + a*(ceil(tokens/{TILE})*{TILE} - tokens), to Vidur's GEMM medians, {len(sets)} "
                  f"model(s), rows of 1..{MAX_TOKENS} tokens, TP 1/2/4/8; GEMMs fitted on the layer total")
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
