"""The shipped A100 (and H100) profiles stay close to Vidur's measured operator timings.

Data: Vidur (Agrawal et al., MLSys 2024; github.com/microsoft/vidur, MIT) under
``shared/calibration`` (or ``$KVSIM_CALIBRATION_DIR``); skipped when absent. Bounds are the
errors of the shipped profiles, GEMMs by matrix shape (``bench/fit_profiles.py``), rows of >= 16
tokens, plus a small margin (``bench/calibration_report.py``):
    linear (sum of 4 GEMMs)     A100 median 4.1% / 3.8%, p90 9.2% / 7.2% (Llama-2-7B / Llama-3-8B)
    elementwise (sum)           A100 median 5.4% / 5.7%, p90 10.6% / 10.4%
    layer                       A100 median 3.7% / 4.2%, p90 8.8% / 6.8%; H100 2.9% / 7.3%
    any single operator         median <= 12.2% (layernorms: 4-5 us kernels timed to 1 us), p90 <= 23.6%
The held-out (leave-one-model-out) bound on a committed subset is in ``test_calibration_report``.
"""

import numpy as np
import pytest

from kvsim.sim.perf import calibration as cal
from kvsim.sim.perf.gpus import resolve_gpu
from kvsim.sim.perf.models import resolve_model
from kvsim.sim.perf.profile import load_profile

ROOT = cal.calibration_dir()
pytestmark = pytest.mark.skipif(ROOT is None, reason="shared/calibration (Vidur data) not found")


@pytest.fixture(scope="module")
def table():
    return cal.error_table(ROOT, min_tokens=16).set_index(["gpu", "model", "operator"])


@pytest.mark.parametrize("model", ["Llama-2-7b-hf", "Meta-Llama-3-8B"])
@pytest.mark.parametrize("group, median, p90", [("linear (sum)", 0.045, 0.10),
                                                ("elementwise (sum)", 0.06, 0.115),
                                                ("layer (sum)", 0.045, 0.095)])
def test_a100_groups_within_bounds(table, model, group, median, p90):
    row = table.loc[("a100", model, group)]
    assert row["median_rel_err"] <= median and row["p90_rel_err"] <= p90


def test_every_a100_operator_within_bounds(table):
    a100 = table.loc["a100"]
    assert (a100["median_rel_err"] <= 0.13).all(), a100["median_rel_err"]
    assert (a100["p90_rel_err"] <= 0.25).all(), a100["p90_rel_err"]


def test_h100_linear_time_within_bounds(table):
    row = table.loc[("h100", "Llama-2-7b-hf", "linear (sum)")]
    assert row["median_rel_err"] <= 0.04 and row["p90_rel_err"] <= 0.09
    row = table.loc[("h100", "Llama-2-7b-hf", "layer (sum)")]
    assert row["median_rel_err"] <= 0.035 and row["p90_rel_err"] <= 0.08


def test_large_gemms_are_compute_bound_near_the_measured_rate():
    # 4096 tokens, TP1, Llama-2-7B on A100: the four GEMMs measured 1.911 + 0.611 + 3.3655 +
    # 1.604 = 7.4915 ms (predicted 7.104 ms, 5.2% fast); the QKV projection alone 1.911 ms
    # (predicted 7.6% fast: one set of tile efficiencies serves every shape).
    df = cal.load_mlp(ROOT, "a100", "Llama-2-7b-hf")
    row = df[(df["num_tokens"] == 4096) & (df["tp"] == 1)].iloc[0]
    args = (resolve_model("llama-2-7b"), resolve_gpu("a100-80gb"), load_profile("a100-80gb"))
    pred = {op: float(cal.predict_op(*args, op, 4096, 1)) for op in cal.GEMM_OPS}
    assert sum(pred.values()) == pytest.approx(sum(row[op] for op in cal.GEMM_OPS), rel=0.06)
    assert pred["attn_pre_proj"] == pytest.approx(row["attn_pre_proj"], rel=0.08)


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


def test_every_layer_within_ten_percent_at_every_tp_degree():
    """Issue 16: the per-layer p90 of the shipped profiles, per GPU, model and TP degree, all
    rows (measured 0.055-0.098; held out, see ``bench/calibration_report.py --data DIR --cv``)."""
    t = cal.error_table_by_tp(ROOT / "vidur")
    layer = t[t["operator"] == "layer (sum)"]
    assert len(layer) == 12 and (layer["p90_rel_err"] <= 0.10).all(), layer


def test_the_efficiency_curve_and_tiles_give_rows_exactly():
    """Curve through (0, 0), (16, 32), (128, 160), slope 1 beyond; tiles of 128, half the
    padding paid beyond the first tile (n + 0.5 * (ceil(n / 128) * 128 - n)); rows are the
    larger of the two."""
    from kvsim.sim.perf.profile import Roofline, curve_rows
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


def test_a_gemm_by_its_shape_pays_whole_tiles_and_part_of_the_last_wave():
    """4 SMs of 1e12 FLOP/s each, one 128x128 tile shape at efficiency 0.5, half of a partly
    filled wave paid, no latencies, hard maximum. 200 tokens x K=1024 into N=512: 2 x 4 = 8
    tiles = 2 full waves; 129 tokens: the same 8 tiles; 128 tokens: 4 tiles, 1 wave; N=640 at
    128 tokens: 5 tiles = 1.25 waves + 0.5 * 0.75 idle = 1.625 waves."""
    from kvsim.sim.perf.gemm import gemm_time
    from kvsim.sim.perf.gpus import GpuSpec
    from kvsim.sim.perf.profile import Roofline
    gpu = GpuSpec("t", "t", 1, 1e18, 4e12, 0, "pcie", 1.0, 1.0)     # memory never binds
    g = Roofline(0.5, 1.0, 0.0, num_sms=4, tiles=((128.0, 128.0, 0.5),), wave_tail=0.5)
    wave = 2.0 * 128 * 128 * 1024 / (1e12 * 0.5)
    assert [gemm_time(g, gpu, m, 512.0, 1024.0) for m in (200.0, 129.0, 128.0)] == [
        2 * wave, 2 * wave, wave]
    assert gemm_time(g, gpu, 128.0, 640.0, 1024.0) == pytest.approx(1.625 * wave, rel=1e-12)
    two = Roofline(0.5, 1.0, 0.0, num_sms=4, tiles=((128.0, 128.0, 0.5), (64.0, 64.0, 0.4)),
                   wave_tail=0.5)     # 64x64: 4 tiles of a quarter the work at 0.4: 0.3125 waves
    assert gemm_time(two, gpu, 64.0, 128.0, 1024.0) == pytest.approx(wave / 4 * 0.5 / 0.4 * (
        0.5 + 0.5 * 0.5), rel=1e-12)


@pytest.mark.parametrize("gpu_name", ["a100-80gb", "h100-80gb", "l4"])
def test_a_gemm_timed_with_python_scalars_is_the_numpy_time_bit_for_bit(gpu_name):
    """The cost model times a step's GEMMs with python's ceil/min/max (three times faster on
    scalars than numpy's scalar operations, which it used before): every token count up to
    5,000 and some up to 10^6 give the same float."""
    import math

    from kvsim.sim.perf.gemm import gemm_shapes, gemm_time
    from kvsim.sim.perf.gpus import resolve_gpu
    from kvsim.sim.perf.models import resolve_model
    gpu, g = resolve_gpu(gpu_name), load_profile(gpu_name).gemm
    shapes = gemm_shapes(resolve_model("llama-3-70b"), 4).values()
    tokens = np.concatenate([np.arange(1, 5_001), np.geomspace(5e3, 1e6, 200).round()]).tolist()
    for n, k in shapes:
        numpy_scalars = [float(gemm_time(g, gpu, t, n, k)) for t in tokens]
        python = [gemm_time(g, gpu, t, n, k, ceil=math.ceil, minimum=min, maximum=max)
                  for t in tokens]
        assert numpy_scalars == python


def test_the_soft_maximum_rounds_the_corner():
    from kvsim.sim.perf.cost_model import smooth_max
    assert smooth_max(3.0, 4.0, 2.0) == 5.0 and smooth_max(3.0, 4.0, 0.0) == 4.0


def test_bad_tiles_are_refused(tmp_path):
    import json

    from kvsim.errors import ConfigError
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"gemm": {"tiles": {"tile_m": [128, 64], "tile_n": [128],
                                                   "efficiency": [0.7, 0.6]}}}))
    with pytest.raises(ConfigError, match="tiles"):
        load_profile("a100-80gb", path)


def test_shipped_profiles_are_shaped_with_their_gpus_sm_count():
    assert [load_profile(g).gemm.num_sms for g in ("a100-80gb", "h100-80gb", "l4")] == [108, 132, 58]
    assert all(load_profile(g).gemm.shaped for g in ("a100-80gb", "h100-80gb"))


def test_a_profile_of_another_gpu_is_refused_and_a_fitted_one_that_costs_nothing_too(tmp_path):
    """A roofline profile is one GPU's efficiencies (applied silently to another before); a
    fitted profile whose every step term is 0 made every step free (TTFT 0)."""
    import json

    from kvsim.errors import ConfigError
    from kvsim.sim.perf.profile import FITTED_TERMS, MODEL_SHAPE_KEYS, profile_path
    with pytest.raises(ConfigError) as other:
        load_profile("l4", profile_path("h100-80gb"))
    assert other.value.one_line() == (
        f"{profile_path('h100-80gb')}: field 'gpu': holds the efficiencies of h100-80gb, and "
        "the GPU simulated is l4: simulate h100-80gb (--gpu), or give a profile of l4")
    assert load_profile("h100-80gb", profile_path("h100-80gb")).gemm.num_sms == 132
    aliased = json.loads(profile_path("h100-80gb").read_text()) | {"gpu": "H100"}
    assert load_profile("h100", aliased).gemm.num_sms == 132       # (names an alias gives)
    fitted = {"kind": "fitted", "gpu": "a100-80gb", "fitted": dict.fromkeys(FITTED_TERMS, 0.0),
              "model_shape": dict.fromkeys(MODEL_SHAPE_KEYS, 64)}
    path = tmp_path / "zero.json"
    path.write_text(json.dumps(fitted))
    with pytest.raises(ConfigError, match="every fitted step term is 0: each step would take "
                                          "no time$"):
        load_profile("a100-80gb", path)
    fitted["fitted"]["per_token_s"] = 1e-6
    path.write_text(json.dumps(fitted))
    assert load_profile("l4", path).fitted.per_token_s == 1e-6     # (checked by its model)
