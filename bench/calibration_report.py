"""Per-operator error of the default calibration profiles against Vidur's measured timings.

    python bench/calibration_report.py [--min-tokens 16] [--fit]
    python bench/calibration_report.py --data DIR [--gpu a100-80gb] [--profile FILE]

Prints, per operator, GPU and model, the median and p90 of |predicted - measured| / measured over
every (token count, TP degree) row of Vidur's ``mlp.csv``; then the 28 attention rows and the
all-reduce fit. ``--data DIR``: instead, median and p90 per operator and TP degree for every
``mlp.csv`` (Vidur's format) under DIR; the GPU comes from a parent folder named ``a100``,
``h100``, ... or ``--gpu``, the layer shape from the file's model columns; with ``--cv``,
leave-one-model-out: each file's error after refitting its GPU's parameters on the others
(needs scipy). ``--fit`` refits the GEMM and elementwise parameters (needs scipy) and prints them
for pasting into ``sim/profiles/<gpu>.json``.

Data: Vidur (Agrawal et al., MLSys 2024), github.com/microsoft/vidur ``data/profiling/`` (MIT).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from kvsim.sim import calibration as cal
from kvsim.sim.gpus import resolve_gpu
from kvsim.sim.models import resolve_model
from kvsim.sim.profile import ELEMENTWISE_OPS, load_profile


def print_attention(root) -> None:
    df = cal.load_attention_rows(root)
    df["predicted_ms"] = cal.predict_attention_rows(df) * 1e3
    df["measured_ms"] = df["measured_s"] * 1e3
    df["pred/meas"] = df["predicted_ms"] / df["measured_ms"]
    cols = ["num_tensor_parallel_workers", "batch_size", "prefill_chunk_size", "kv_cache_size",
            "is_prefill", "measured_ms", "predicted_ms", "pred/meas"]
    print("\nAttention sample (A100, Llama-3-8B, FlashInfer), per layer per GPU:")
    print(df[cols].round(4).to_string(index=False))
    for kind, part in df.groupby("is_prefill"):
        err = np.abs(part["pred/meas"] - 1)
        print(f"  {'prefill' if kind else 'decode'}: median rel err {np.median(err):.3f}, "
              f"p90 {np.quantile(err, 0.9):.3f}")


def print_all_reduce(root) -> None:
    print("\nAll-reduce (a100_dgx, one node), latency + size*2(tp-1)/tp / bus_bw:")
    prof, link = load_profile("a100-80gb"), resolve_gpu("a100-80gb").interconnect_bandwidth_bytes_per_s
    df = cal.load_all_reduce(root)
    df["pred"] = cal.predict_all_reduce(prof, df["tp"], df["size_bytes"], link)
    for tp, part in df.groupby("tp"):
        err = np.abs(part["pred"] - part["seconds"]) / part["seconds"]
        print(f"  tp={tp}: median rel err {np.median(err):.3f}, p90 {np.quantile(err, 0.9):.3f}"
              f" ({len(part)} sizes)")


def fit(root) -> None:
    """Least-squares (log error, soft-L1) fit per GPU of the GEMM roofline and each kernel."""
    from scipy.optimize import least_squares

    for gpu_dir, gpu_name in (("a100", "a100-80gb"), ("h100", "h100-80gb")):
        gpu = resolve_gpu(gpu_name)
        sets = [(cal.load_mlp(root, g, md), resolve_model(mn))
                for g, _, md, mn in cal.DATASETS if g == gpu_dir]

        def residuals(ops, override):
            prof = load_profile(gpu_name, override)
            return np.concatenate([np.log(cal.predict_op(m, gpu, prof, op, df["num_tokens"], df["tp"])
                                          / df[op].to_numpy()) for df, m in sets for op in ops])

        g = least_squares(lambda x: residuals(cal.GEMM_OPS, {"gemm": {
            "compute_efficiency": x[0], "memory_efficiency": x[1], "latency_s": x[2] * 1e-6}}),
            [0.7, 0.75, 3.0], bounds=([0.1, 0.1, 0], [1, 1, 50]), loss="soft_l1", f_scale=0.1)
        print(f"{gpu_name} gemm: compute_eff {g.x[0]:.3f} memory_eff {g.x[1]:.3f} "
              f"latency {g.x[2]:.2f} us")
        for op in ELEMENTWISE_OPS:
            e = least_squares(lambda x: residuals((op,), {"elementwise": {op: {
                "memory_efficiency": x[0], "min_time_s": x[1] * 1e-6}}}),
                [0.5, 4.0], bounds=([0.05, 0], [1.0, 50]), loss="soft_l1", f_scale=0.1)
            print(f"{gpu_name} {op}: memory_eff {e.x[0]:.3f} min_time {e.x[1]:.2f} us")


def fit_profile(gpu_name: str, sets) -> dict:
    """Profile overrides (GEMM roofline, each elementwise kernel) fitted by least squares on
    log error to ``sets`` (``[(frame, model)]``, all measured on ``gpu_name``; needs scipy)."""
    from scipy.optimize import least_squares

    gpu = resolve_gpu(gpu_name)

    def residuals(ops, override):
        prof = load_profile(gpu_name, override)
        return np.concatenate([np.log(cal.predict_op(m, gpu, prof, op, df["num_tokens"], df["tp"])
                                      / df[op].to_numpy()) for df, m in sets for op in ops])

    def gemm(x):
        return {"gemm": {"compute_efficiency": x[0], "memory_efficiency": x[1],
                         "latency_s": x[2] * 1e-6}}

    def elem(op, x):
        return {"elementwise": {op: {"memory_efficiency": x[0], "min_time_s": x[1] * 1e-6}}}

    g = least_squares(lambda x: residuals(cal.GEMM_OPS, gemm(x)), [0.7, 0.75, 3.0],
                      bounds=([0.1, 0.1, 0], [1, 1, 50]), loss="soft_l1", f_scale=0.1)
    out = gemm(g.x)
    out["elementwise"] = {}
    for op in ELEMENTWISE_OPS:
        e = least_squares(lambda x: residuals((op,), elem(op, x)), [0.5, 4.0],
                          bounds=([0.05, 0], [1.0, 50]), loss="soft_l1", f_scale=0.1)
        out["elementwise"].update(elem(op, e.x)["elementwise"])
    return out


def cross_validate(data_dir, gpu=None, min_tokens: int = 1) -> pd.DataFrame:
    """Leave one model out: for each ``mlp.csv``, refit its GPU's parameters on the other
    files of that GPU and report the held-out per-layer error per TP (no other file: n/a)."""
    from pathlib import Path

    files = [(path, g, *cal.load_mlp_file(path)) for path, g in cal.find_mlp_files(Path(data_dir),
                                                                                   gpu)]
    rows = []
    for path, g, df, model in files:
        train = [(d, m) for p, gg, d, m in files if gg == g and p != path]
        prof = load_profile(g, fit_profile(g, train)) if train else None
        for tp, part in df[df["num_tokens"] >= min_tokens].groupby("tp"):
            err = (cal.relative_errors(part, model, resolve_gpu(g), prof, cal.GEMM_OPS
                                       + ELEMENTWISE_OPS) if prof else np.full(1, np.nan))
            rows.append({"held_out": str(path.relative_to(data_dir)), "gpu": g, "tp": int(tp),
                         "train_files": len(train), "median_rel_err": float(np.median(err)),
                         "p90_rel_err": float(np.quantile(err, 0.9))})
    return pd.DataFrame(rows)


def report_cv(args) -> int:
    """``--data DIR --cv``: leave-one-model-out per-layer error of the refitted roofline."""
    table = cross_validate(args.data, args.gpu, args.min_tokens)
    pd.set_option("display.width", 200)
    print("Leave-one-model-out, per-layer (sum of operators) error of the refitted roofline:")
    print(table.round(3).to_string(index=False))
    done = table.dropna()
    if len(done):
        print(f"\nworst held-out p90 {done['p90_rel_err'].max():.3f} "
              f"({len(done)} file/TP cells; {len(table) - len(done)} without training data)")
    return 0


def report_dir(args) -> int:
    """``--data DIR``: per file, operator and TP, median and p90 relative error."""
    from pathlib import Path

    from kvsim.errors import KvsimError
    try:
        table = cal.error_table_by_tp(Path(args.data), args.gpu, args.min_tokens, args.profile)
    except KvsimError as e:
        print(f"calibration_report: {e}", file=sys.stderr)
        return 2
    if table.empty:
        print(f"calibration_report: no mlp.csv under {args.data}", file=sys.stderr)
        return 2
    pd.set_option("display.width", 200)
    print(f"Per-operator error by TP degree, rows with >= {args.min_tokens} tokens:")
    print(table.round(3).to_string(index=False))
    layer = table[table["operator"] == "layer (sum)"]
    print(f"\nlayer (sum): worst p90 {layer['p90_rel_err'].max():.3f} "
          f"({len(layer)} file/TP cells)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-tokens", type=int, default=1, help="ignore rows with fewer tokens")
    ap.add_argument("--fit", action="store_true", help="refit the parameters (needs scipy)")
    ap.add_argument("--data", help="report every mlp.csv under this directory, per TP")
    ap.add_argument("--gpu", help="with --data: the catalog GPU of every file")
    ap.add_argument("--profile", help="with --data: a calibration profile JSON to evaluate")
    ap.add_argument("--cv", action="store_true", help="with --data: leave-one-model-out "
                    "cross-validation of the refitted roofline (needs scipy)")
    args = ap.parse_args(argv)
    if args.data and args.cv:
        return report_cv(args)
    if args.data:
        return report_dir(args)
    root = cal.calibration_dir()
    if root is None:
        print("calibration data not found: set KVSIM_CALIBRATION_DIR", file=sys.stderr)
        return 2
    pd.set_option("display.width", 200)
    table = cal.error_table(root, min_tokens=args.min_tokens)
    print(f"Per-operator error, rows with >= {args.min_tokens} tokens, TP 1/2/4/8:")
    print(table.round(3).to_string(index=False))
    print_attention(root)
    print_all_reduce(root)
    if args.fit:
        fit(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
