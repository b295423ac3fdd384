"""Per-operator error of the default calibration profiles against Vidur's measured timings.

    python bench/calibration_report.py [--min-tokens 16] [--fit]
    python bench/calibration_report.py --data DIR [--gpu a100-80gb] [--profile FILE]

Prints, per operator, GPU and model, the median and p90 of |predicted - measured| / measured over
every (token count, TP degree) row of Vidur's ``mlp.csv``; then the 28 attention rows and the
all-reduce fit. ``--data DIR``: instead, median and p90 per operator and TP degree for every
``mlp.csv`` (Vidur's format) under DIR; the GPU comes from a parent folder named ``a100``,
``h100``, ... or ``--gpu``, the layer shape from the file's model columns; with ``--cv``,
held-out per-layer error per GPU and TP degree, twice: leave one model out (each file after
refitting its GPU's parameters, ``bench/fit_profiles.py``, on the other models of that GPU) and
leave one TP degree out (each TP degree after refitting on the GPU's other TP degrees); needs
scipy. ``--fit`` refits the GEMM and elementwise
parameters (needs scipy) and prints them (``bench/fit_profiles.py`` writes them into
``sim/perf/profiles/``).

Data: Vidur (Agrawal et al., MLSys 2024), github.com/microsoft/vidur ``data/profiling/`` (MIT).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pandas as pd

from kvsim.sim.perf import calibration as cal
from kvsim.sim.perf.gpus import resolve_gpu
from kvsim.sim.perf.models import resolve_model
from kvsim.sim.perf.profile import ELEMENTWISE_OPS, load_profile


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
    """Refit (``bench/fit_profiles.py``) and print the parameters of every GPU with data."""
    from fit_profiles import datasets, fit_gpu

    for gpu, sets in sorted(datasets(root / "vidur").items()):
        print(f"{gpu}: {json.dumps(fit_gpu(gpu, sets))}")


def _held_out_rows(g, part, model, train) -> list[dict]:
    """Held-out cells: the profile refitted on ``train`` and its per-layer error on ``part``,
    per TP degree."""
    from fit_profiles import fit_gpu

    prof, rows = load_profile(g, fit_gpu(g, train)), []
    for tp, cell in part.groupby("tp"):
        err = cal.relative_errors(cell, model, resolve_gpu(g), prof, cal.GEMM_OPS + ELEMENTWISE_OPS)
        rows.append({"gpu": g, "tp": int(tp), "median_rel_err": float(np.median(err)),
                     "p90_rel_err": float(np.quantile(err, 0.9)), "rows": len(err)})
    return rows


def cross_validate(data_dir, gpu=None, min_tokens: int = 1, split: str = "model") -> pd.DataFrame:
    """Held-out per-layer error of the refitted profile per file and TP degree.

    ``split="model"``: leave one model out, each file refitted on the other files of its GPU
    (a GPU with one file has nothing to train on and is left out). ``split="tp"``: leave one
    TP degree out, each TP degree of each file refitted on every file of its GPU at the other
    TP degrees."""
    from pathlib import Path

    files = [(path, g, *cal.load_mlp_file(path)) for path, g in cal.find_mlp_files(Path(data_dir),
                                                                                   gpu)]
    out = []
    for path, g, df, model in files:
        held = df[df["num_tokens"] >= min_tokens]
        if split == "model":
            train = [(d, m) for p, gg, d, m in files if gg == g and p != path]
            cells = [(held, train)] if train else []
        else:
            cells = [(held[held["tp"] == tp], [(d[d["tp"] != tp], m) for _, gg, d, m in files
                                               if gg == g]) for tp in sorted(held["tp"].unique())]
        for part, train in cells:
            for row in _held_out_rows(g, part, model, train):
                out.append({"held_out": str(path.relative_to(data_dir)), "split": split,
                            "train_files": len(train), **row})
    return pd.DataFrame(out)


def report_cv(args) -> int:
    """``--data DIR --cv``: held-out per-layer error of the refitted profile, leave one model
    out and leave one TP degree out."""
    pd.set_option("display.width", 200)
    for split, what in (("model", "leave one model out (refit on the GPU's other models; a "
                                  "GPU with one model has none)"),
                        ("tp", "leave one TP degree out (refit on the GPU's other TP degrees)")):
        table = cross_validate(args.data, args.gpu, args.min_tokens, split)
        print(f"Held-out per-layer (sum of operators) error, {what}:")
        if table.empty:
            print("  (no cell: every GPU has one model)\n")
            continue
        print(table.round(3).to_string(index=False))
        for g, part in table.groupby("gpu"):
            print(f"worst held-out p90, split {split}, {g}: {part['p90_rel_err'].max():.3f} "
                  f"({len(part)} file/TP cells)")
        print()
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
    ap.add_argument("--cv", action="store_true", help="with --data: held-out (leave one model out, and leave one TP degree out) "
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
