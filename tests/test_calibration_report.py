"""``bench/calibration_report.py --data DIR`` (issue 16): per-operator, per-TP error for any
directory of Vidur-format ``mlp.csv`` files."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.sim.perf import calibration as cal
from kvsim.sim.perf.gpus import resolve_gpu
from kvsim.sim.perf.profile import ELEMENTWISE_OPS, load_profile

REPORT = Path(__file__).resolve().parents[1] / "bench" / "calibration_report.py"


def write_mlp(folder: Path, scale: float) -> None:
    """A Vidur-format mlp.csv whose times are ``scale`` x the cost model's own prediction."""
    raw = pd.DataFrame({"n_head": 32, "n_kv_head": 8, "n_embd": 4096, "n_expanded_embd": 14336,
                        "vocab_size": 128256, "use_gated_mlp": True,
                        "num_tokens": np.tile([1, 16, 256, 4096], 2),
                        "num_tensor_parallel_workers": np.repeat([1, 2], 4)})
    model = cal.model_from_mlp(raw, "m")
    gpu, prof = resolve_gpu("h100-80gb"), load_profile("h100-80gb")
    for op in cal.GEMM_OPS + ELEMENTWISE_OPS:
        t = cal.predict_op(model, gpu, prof, op, raw["num_tokens"],
                           raw["num_tensor_parallel_workers"])
        raw[f"time_stats.{op}.median"] = t * 1e3 * scale
    folder.mkdir(parents=True)
    raw.to_csv(folder / "mlp.csv", index=False)


def test_errors_per_operator_and_tp(tmp_path):
    write_mlp(tmp_path / "h100" / "m", 1.25)
    table = cal.error_table_by_tp(tmp_path)
    assert set(table["tp"]) == {1, 2} and set(table["gpu"]) == {"h100-80gb"}
    assert np.allclose(table["median_rel_err"], 0.2) and np.allclose(table["p90_rel_err"], 0.2)


def test_the_report_runs_on_any_directory_and_names_what_it_cannot_read(tmp_path):
    write_mlp(tmp_path / "h100" / "m", 1.0)
    done = subprocess.run([sys.executable, str(REPORT), "--data", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "layer (sum): worst p90 0.000" in done.stdout
    write_mlp(tmp_path / "unknown-gpu" / "m", 1.0)
    done = subprocess.run([sys.executable, str(REPORT), "--data", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "field 'gpu'" in done.stderr


SUBSET = Path(__file__).resolve().parent / "data" / "vidur_subset"
"""26 token counts (1..4,096) x TP 1/2/4/8 of Vidur's A100 Llama-2-7B and Llama-3-8B mlp.csv
(github.com/microsoft/vidur, MIT), the columns the report reads."""


def _cross_validate():
    import pytest
    pytest.importorskip("scipy")
    sys.path.insert(0, str(REPORT.parent))
    from calibration_report import cross_validate
    return cross_validate


def test_leave_one_model_out_refits_on_the_other_files(tmp_path):
    cross_validate = _cross_validate()
    write_mlp(tmp_path / "h100" / "a", 1.0)
    write_mlp(tmp_path / "h100" / "b", 1.0)
    write_mlp(tmp_path / "a100" / "c", 1.0)
    table = cross_validate(tmp_path)
    assert set(table["gpu"]) == {"h100-80gb"}        # a100 has one model: nothing to train on
    assert (table["train_files"] == 1).all() and (table["split"] == "model").all()
    assert (table["p90_rel_err"] < 0.25).all()      # 8 rows refit: the mechanism, not accuracy
    by_tp = cross_validate(tmp_path, split="tp")     # each TP degree refit on the other one
    a100 = by_tp[by_tp["gpu"] == "a100-80gb"]
    assert (a100["split"] == "tp").all() and list(a100["tp"]) == [1, 2]
    assert a100["p90_rel_err"].notna().all() and list(a100["rows"]) == [4, 4]


def test_held_out_layer_error_within_ten_and_a_half_percent_on_the_committed_subset():
    """Issue 16: refit on one A100 model, per-layer error on the other, every TP degree
    (measured: p90 0.063-0.102, median 0.029-0.044; the earlier efficiency-curve model had a
    held-out p90 of 0.115 on the full data)."""
    table = _cross_validate()(SUBSET)
    assert len(table) == 8 and set(table["tp"]) == {1, 2, 4, 8} and (table["rows"] == 26).all()
    assert (table["p90_rel_err"] <= 0.105).all(), table
    assert (table["median_rel_err"] <= 0.045).all(), table
