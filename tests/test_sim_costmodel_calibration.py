"""The shipped A100 (and H100) profiles stay close to Vidur's measured operator timings.

Data: Vidur (Agrawal et al., MLSys 2024; github.com/microsoft/vidur, MIT) under
``shared/calibration`` (or ``$KVSIM_CALIBRATION_DIR``); skipped when absent. Bounds are the
errors of the profiles before the refit of issue 16 (see ``bench/calibration_report.py``) plus
a margin; the refit profiles (``bench/fit_profiles.py``) are well inside them, and the per-layer
bound per TP degree is the refit's own:
    linear (sum of 4 GEMMs)     A100 median 4.6% / 2.8%, p90 15.6% / 10.9% (Llama-2-7B / Llama-3-8B)
    elementwise (sum)           A100 median 6.1% / 3.4%, p90 15.1% / 12.9%
    any single operator         A100 median <= 10.8%, p90 <= 30%
"""

import numpy as np
import pytest

from kvsim.sim import calibration as cal
from kvsim.sim.gpus import resolve_gpu
from kvsim.sim.models import resolve_model
from kvsim.sim.profile import load_profile

ROOT = cal.calibration_dir()
pytestmark = pytest.mark.skipif(ROOT is None, reason="shared/calibration (Vidur data) not found")


@pytest.fixture(scope="module")
def table():
    return cal.error_table(ROOT, min_tokens=16).set_index(["gpu", "model", "operator"])


@pytest.mark.parametrize("model", ["Llama-2-7b-hf", "Meta-Llama-3-8B"])
@pytest.mark.parametrize("group, median, p90", [("linear (sum)", 0.08, 0.20),
                                                ("elementwise (sum)", 0.10, 0.20),
                                                ("layer (sum)", 0.08, 0.20)])
def test_a100_groups_within_bounds(table, model, group, median, p90):
    row = table.loc[("a100", model, group)]
    assert row["median_rel_err"] <= median and row["p90_rel_err"] <= p90


def test_every_a100_operator_within_bounds(table):
    a100 = table.loc["a100"]
    assert (a100["median_rel_err"] <= 0.12).all(), a100["median_rel_err"]
    assert (a100["p90_rel_err"] <= 0.35).all(), a100["p90_rel_err"]


def test_h100_linear_time_within_bounds(table):
    row = table.loc[("h100", "Llama-2-7b-hf", "linear (sum)")]
    assert row["median_rel_err"] <= 0.10 and row["p90_rel_err"] <= 0.25


def test_large_gemms_are_compute_bound_near_the_measured_rate():
    # 4096 tokens, TP1: QKV projection measured 1.911 ms on A100 for Llama-2-7B.
    df = cal.load_mlp(ROOT, "a100", "Llama-2-7b-hf")
    row = df[(df["num_tokens"] == 4096) & (df["tp"] == 1)].iloc[0]
    pred = cal.predict_op(resolve_model("llama-2-7b"), resolve_gpu("a100-80gb"),
                          load_profile("a100-80gb"), "attn_pre_proj", 4096, 1)
    assert float(pred) == pytest.approx(row["attn_pre_proj"], rel=0.05)


def test_attention_sample_is_compared_and_the_gap_is_known():
    # The 28 rows are chunk-64 prefills and TP8 decodes with one KV head per GPU: small,
    # occupancy-limited kernels. The assumed efficiencies (prefill 50% of peak, decode 60% of
    # HBM) are optimistic here: predictions are 0.18x..0.93x of the measurements. This test
    # pins that gap so a profile change that widens it is noticed.
    df = cal.load_attention_rows(ROOT)
    assert len(df) == 28
    ratio = cal.predict_attention_rows(df) / df["measured_s"].to_numpy()
    assert ratio.min() >= 0.15 and ratio.max() <= 1.0
    assert np.median(ratio[df["is_prefill"].to_numpy()]) >= 0.4


def test_all_reduce_fit_within_bounds():
    prof, gpu = load_profile("a100-80gb"), resolve_gpu("a100-80gb")
    df = cal.load_all_reduce(ROOT)
    pred = cal.predict_all_reduce(prof, df["tp"], df["size_bytes"], gpu.interconnect_bandwidth_bytes_per_s)
    err = np.abs(pred - df["seconds"].to_numpy()) / df["seconds"].to_numpy()
    assert np.median(err) <= 0.10 and np.quantile(err, 0.9) <= 0.25


def test_every_layer_within_eleven_percent_at_every_tp_degree():
    """Issue 16: the per-layer p90 of the shipped profiles, per GPU, model and TP degree
    (measured 0.056-0.106; held out, see ``bench/calibration_report.py --data DIR --cv``)."""
    t = cal.error_table_by_tp(ROOT / "vidur")
    layer = t[t["operator"] == "layer (sum)"]
    assert len(layer) == 12 and (layer["p90_rel_err"] <= 0.11).all(), layer


def test_the_efficiency_curve_and_tiles_give_rows_exactly():
    """Curve through (0, 0), (16, 32), (128, 160), slope 1 beyond; tiles of 128, half the
    padding paid beyond the first tile (n + 0.5 * (ceil(n / 128) * 128 - n)); rows are the
    larger of the two."""
    from kvsim.sim.profile import Roofline, curve_rows
    assert [curve_rows(n, (16.0, 128.0), (32.0, 160.0)) for n in (1, 8, 72, 129, 200)] == [
        2.0, 16.0, 96.0, 161.0, 232.0]
    g = Roofline(0.7, 0.8, 0.0, 128, 0.5, (16.0, 128.0), (32.0, 160.0))
    assert [g.rows(n) for n in (1, 8, 16, 72, 128, 129, 200, 256)] == [
        2.0, 16.0, 32.0, 96.0, 160.0, 192.5, 232.0, 288.0]
    assert Roofline(0.7, 0.8, 0.0).rows(37) == 37          # neither: rows = tokens


def test_a_decreasing_curve_is_refused(tmp_path):
    import json

    from kvsim.errors import ConfigError
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"gemm": {"efficiency_curve": {"tokens": [16, 64],
                                                              "rows": [40, 30]}}}))
    with pytest.raises(ConfigError, match="never decreasing"):
        load_profile("a100-80gb", path)
