"""Compare the cost model's per-operator predictions with Vidur's measured operator timings.

Data: Vidur (Agrawal et al., "Vidur: A Large-Scale Simulation Framework for LLM Inference",
MLSys 2024; github.com/microsoft/vidur, MIT license, commit 7d47513, ``data/profiling/``), copied to
``shared/calibration/vidur``. Each ``mlp.csv`` row is one (token count, TP degree) with the median
time in ms of every non-attention operator of one layer on one TP worker.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.sim.perf.gemm import (elementwise_bytes, gemm_params, gemm_shapes, gemm_time,
                                 smooth_max)
from kvsim.sim.perf.gpus import GpuSpec, resolve_gpu
from kvsim.sim.perf.models import ModelSpec, resolve_model
from kvsim.sim.perf.profile import (ELEMENTWISE_OPS, Profile, curve_rows_array, load_profile,
                              padded_rows)

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
# (Vidur GPU folder, catalog GPU, Vidur model folder, catalog model)
DATASETS = (("a100", "a100-80gb", "Llama-2-7b-hf", "llama-2-7b"),
            ("a100", "a100-80gb", "Meta-Llama-3-8B", "llama-3-8b"),
            ("h100", "h100-80gb", "Llama-2-7b-hf", "llama-2-7b"))


def calibration_dir() -> Path | None:
    """``$KVSIM_CALIBRATION_DIR``, else ``shared/calibration`` inside or beside the checkout."""
    env = os.environ.get("KVSIM_CALIBRATION_DIR")
    here = Path(__file__).resolve().parents[2]
    for cand in ([Path(env)] if env else []) + [here / "shared" / "calibration",
                                                here.parent / "shared" / "calibration"]:
        if (cand / "vidur").is_dir():
            return cand
    return None


def load_mlp(root: Path, gpu_dir: str, model_dir: str) -> pd.DataFrame:
    """Columns ``num_tokens, tp`` and one column per operator: median seconds per layer."""
    raw = pd.read_csv(root / "vidur" / "compute" / gpu_dir / model_dir / "mlp.csv")
    out = pd.DataFrame({"num_tokens": raw["num_tokens"], "tp": raw["num_tensor_parallel_workers"]})
    for op in GEMM_OPS + ELEMENTWISE_OPS:
        out[op] = raw[f"time_stats.{op}.median"] / 1e3
    return out.drop_duplicates(["num_tokens", "tp"]).sort_values(["tp", "num_tokens"])


def predict_gemm(model: ModelSpec, gpu: GpuSpec, prof: Profile, op: str, n, tp) -> np.ndarray:
    """Seconds of one GEMM of one layer for ``n`` tokens on one of ``tp`` GPUs (bf16): by its
    matrix shape (:func:`kvsim.sim.perf.gemm.gemm_time`) where the profile is shaped."""
    w = gemm_params(model)[op] / np.asarray(tp, dtype=float)
    n = np.asarray(n, dtype=float)
    if prof.gemm.shaped:
        cols, k = gemm_shapes(model, np.asarray(tp, dtype=float))[op]
        return gemm_time(prof.gemm, gpu, n, cols, k)
    g = prof.gemm
    rows = padded_rows(n, g.tile_tokens, g.tile_padding)
    if g.curve_tokens:
        rows = np.maximum(rows, curve_rows_array(n, g.curve_tokens, g.curve_rows))
    flops = 2.0 * rows * w / (gpu.dense_bf16_flops * prof.gemm.compute_efficiency)
    mem = 2.0 * w / (gpu.hbm_bandwidth_bytes_per_s * prof.gemm.memory_efficiency)
    return prof.gemm.latency_s + np.maximum(flops, mem)


def predict_elementwise(model: ModelSpec, gpu: GpuSpec, prof: Profile, op: str, n, tp) -> np.ndarray:
    """Seconds of one memory-bound kernel of one layer for ``n`` tokens on one of ``tp`` GPUs."""
    tp = np.asarray(tp, dtype=float)
    per_token = elementwise_bytes(model, 1, "bf16")[op]
    if op in ("attn_rope", "mlp_act"):
        per_token = per_token / tp
    e = prof.elementwise[op]
    t = np.asarray(n, dtype=float) * per_token / (gpu.hbm_bandwidth_bytes_per_s * e.memory_efficiency)
    return smooth_max(e.min_time_s + per_token * e.row_s_per_byte, t, e.smoothness)


def predict_op(model, gpu, prof, op, n, tp) -> np.ndarray:
    fn = predict_gemm if op in GEMM_OPS else predict_elementwise
    return fn(model, gpu, prof, op, n, tp)


def relative_errors(df: pd.DataFrame, model, gpu, prof, ops) -> np.ndarray:
    """``|predicted - measured| / measured`` of the summed time of ``ops`` per row."""
    measured = df[list(ops)].sum(axis=1).to_numpy()
    pred = sum(predict_op(model, gpu, prof, op, df["num_tokens"], df["tp"]) for op in ops)
    return np.abs(pred - measured) / measured


def error_table(root: Path, min_tokens: int = 1, profile=None) -> pd.DataFrame:
    """Median and p90 relative error per operator (and per group) for every dataset."""
    rows = []
    groups = [(op, (op,)) for op in GEMM_OPS + ELEMENTWISE_OPS]
    groups += [("linear (sum)", GEMM_OPS), ("elementwise (sum)", ELEMENTWISE_OPS),
               ("layer (sum)", GEMM_OPS + ELEMENTWISE_OPS)]
    for gpu_dir, gpu_name, model_dir, model_name in DATASETS:
        df = load_mlp(root, gpu_dir, model_dir)
        df = df[df["num_tokens"] >= min_tokens]
        gpu, model = resolve_gpu(gpu_name), resolve_model(model_name)
        prof = load_profile(gpu_name, profile)
        for name, ops in groups:
            err = relative_errors(df, model, gpu, prof, ops)
            rows.append({"operator": name, "gpu": gpu_dir, "model": model_dir,
                         "median_rel_err": float(np.median(err)),
                         "p90_rel_err": float(np.quantile(err, 0.9)), "rows": len(err)})
    return pd.DataFrame(rows)


# --- any directory of mlp.csv files (Vidur's format) ----------------------------------------------
GPU_FOLDERS = {"a100": "a100-80gb", "h100": "h100-80gb", "h200": "h200", "l4": "l4",
               "l40s": "l40s", "a100-40gb": "a100-40gb"}
"""Vidur's GPU folder names (``compute/<gpu>/<model>/mlp.csv``) and the catalog GPU of each."""


def find_mlp_files(data_dir: Path, gpu: str | None = None) -> list[tuple[Path, str]]:
    """Every ``mlp.csv`` under ``data_dir`` with its catalog GPU: ``gpu`` when given, else the
    nearest parent folder named as in :data:`GPU_FOLDERS`. A file whose GPU cannot be told is
    an error naming it."""
    from kvsim.errors import ConfigError
    found = []
    for path in sorted(Path(data_dir).rglob("mlp.csv")):
        name = gpu or next((GPU_FOLDERS[p.lower()] for p in reversed(path.parent.parts)
                            if p.lower() in GPU_FOLDERS), None)
        if name is None:
            raise ConfigError(f"no GPU folder ({', '.join(GPU_FOLDERS)}) above it; pass --gpu",
                              location=str(path), field="gpu")
        found.append((path, name))
    return found


def model_from_mlp(raw: pd.DataFrame, label: str) -> ModelSpec:
    """The layer shape a Vidur ``mlp.csv`` was measured on, from its model columns."""
    row = raw.iloc[0]
    heads, embd = int(row["n_head"]), int(row["n_embd"])
    return ModelSpec(label, 1, embd, heads, int(row["n_kv_head"]), embd // heads,
                     int(row["n_expanded_embd"]), int(row["vocab_size"]), 4096,
                     gated_mlp=bool(row["use_gated_mlp"]))


def load_mlp_file(path: Path) -> tuple[pd.DataFrame, ModelSpec]:
    """One ``mlp.csv``: the frame of :func:`load_mlp` and the model it was measured on."""
    raw = pd.read_csv(path)
    out = pd.DataFrame({"num_tokens": raw["num_tokens"], "tp": raw["num_tensor_parallel_workers"]})
    for op in GEMM_OPS + ELEMENTWISE_OPS:
        out[op] = raw[f"time_stats.{op}.median"] / 1e3
    out = out.drop_duplicates(["num_tokens", "tp"]).sort_values(["tp", "num_tokens"])
    return out, model_from_mlp(raw, path.parent.name)


def error_table_by_tp(data_dir: Path, gpu: str | None = None, min_tokens: int = 1,
                      profile=None) -> pd.DataFrame:
    """Median and p90 relative error per file, operator (and group) and TP degree."""
    groups = [(op, (op,)) for op in GEMM_OPS + ELEMENTWISE_OPS]
    groups += [("linear (sum)", GEMM_OPS), ("elementwise (sum)", ELEMENTWISE_OPS),
               ("layer (sum)", GEMM_OPS + ELEMENTWISE_OPS)]
    rows = []
    for path, gpu_name in find_mlp_files(data_dir, gpu):
        df, model = load_mlp_file(path)
        spec, prof = resolve_gpu(gpu_name), load_profile(gpu_name, profile)
        for tp, part in df[df["num_tokens"] >= min_tokens].groupby("tp"):
            for name, ops in groups:
                err = relative_errors(part, model, spec, prof, ops)
                rows.append({"file": str(path.relative_to(data_dir)), "gpu": gpu_name,
                             "tp": int(tp), "operator": name,
                             "median_rel_err": float(np.median(err)),
                             "p90_rel_err": float(np.quantile(err, 0.9)), "rows": len(err)})
    return pd.DataFrame(rows)


# --- attention sample ----------------------------------------------------------------------------
def load_attention_rows(root: Path) -> pd.DataFrame:
    """The 28 hand-copied Llama-3-8B A100 attention rows (times converted to seconds)."""
    path = root / "vidur" / "compute" / "a100" / "Meta-Llama-3-8B" / "attention_rows.csv"
    df = pd.read_csv(path, comment="#")
    df["measured_s"] = np.where(df["is_prefill"], df["time_stats.attn_prefill.median"],
                                df["time_stats.attn_decode.median"]) / 1e3
    return df


def predict_attention_rows(df: pd.DataFrame, prof: Profile | None = None) -> np.ndarray:
    """Seconds per layer the cost model gives each attention row (kernel only, no KV save).

    Prefill rows: ``batch_size`` requests of ``prefill_chunk_size`` new tokens on ``kv_cache_size``
    cached ones; decode rows: ``batch_size`` requests of one new token on ``kv_cache_size``. Same
    roofline as the cost model: max(causal FLOPs, KV bytes read).
    """
    model, gpu = resolve_model("llama-3-8b"), resolve_gpu("a100-80gb")
    prof = prof or load_profile("a100-80gb")
    tp, q, c = (df[k].to_numpy(dtype=float) for k in
                ("num_tensor_parallel_workers", "prefill_chunk_size", "kv_cache_size"))
    heads = model.num_heads / tp
    batch = df["batch_size"].to_numpy(dtype=float)
    q = np.where(df["is_prefill"], q, 1.0)
    flops = batch * 4.0 * heads * model.head_dim * q * (c + (q + 1) / 2)
    kv_heads = np.maximum(1.0, np.ceil(model.num_kv_heads / tp))
    kv_bytes = batch * (c + q) * 2 * kv_heads * model.head_dim * 2
    compute = flops / (gpu.dense_bf16_flops * prof.attn_prefill_compute_efficiency)
    memory = kv_bytes / (gpu.hbm_bandwidth_bytes_per_s * prof.attn_decode_memory_efficiency)
    return prof.attn_latency_s + np.maximum(compute, memory)


# --- all-reduce ------------------------------------------------------------------------------------
def load_all_reduce(root: Path, folder: str = "a100_dgx") -> pd.DataFrame:
    """Single-node all-reduce medians: columns ``tp, size_bytes, seconds``."""
    raw = pd.read_csv(root / "vidur" / "network" / folder / "all_reduce.csv")
    raw = raw[raw["num_workers"] == raw["devices_per_node"]]
    out = raw.groupby(["num_workers", "size"])["time_stats.all_reduce.median"].median()
    out = out.reset_index().rename(columns={"num_workers": "tp", "size": "size_bytes"})
    out["seconds"] = out.pop("time_stats.all_reduce.median") / 1e3
    return out


def predict_all_reduce(prof: Profile, tp, size_bytes, link_bandwidth: float) -> np.ndarray:
    """``latency + size * 2(tp-1)/tp / bus_bw`` per row."""
    out = []
    for t, s in zip(np.asarray(tp), np.asarray(size_bytes, dtype=float)):
        lat, bus = prof.all_reduce_params(int(t), link_bandwidth)
        out.append(lat + s * 2 * (t - 1) / t / bus)
    return np.asarray(out)
