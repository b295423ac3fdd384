"""The planner's Ray path on a local Ray runtime gives the process pool's result."""

import pytest

from kvsim.sim.plan import planner
from kvsim.sim.config import RunConfig
from kvsim.sim.plan.spec import DEFAULT_ROUTER, build_slo, build_spec
from kvsim.sim.plan.sweep import SweepOptions
from kvsim.workloads import TraceOptions, sample_path

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kvsim[ray]')")


def test_ray_tasks_give_the_process_pools_plan():
    spec = build_spec(sample_path("azure-conv"), "sample:azure-conv",
                      TraceOptions(limit=30, rate_scale=8.0),
                      RunConfig(router=DEFAULT_ROUTER), build_slo(ttft_p99_s=0.5,
                                                                  tpot_p99_s=0.05),
                      {"gpu": ("h100-80gb", "a100-80gb", "l4"), "tp": (1,)}, burst=True)
    pooled = planner.plan(spec, SweepOptions(workers=2))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = planner.plan(spec, SweepOptions(workers=2, use_ray=True))
    finally:
        ray.shutdown()
    assert on_ray == pooled
    assert [r["label"] for r in on_ray["candidates"]] == ["h100-80gb TP1", "a100-80gb TP1",
                                                          "l4 TP1"]
