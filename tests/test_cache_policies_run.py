"""Eviction policies in a full simulation: `--eviction`, RunConfig and summary.json."""

import json
import subprocess
import sys

import pytest

from kvsim.cache.policies import POLICY_NAMES
from kvsim.errors import ConfigError
from kvsim.pipeline import run_outputs
from kvsim.sim.config import RunConfig
from kvsim.sim.serving.runner import simulate
from kvsim.workloads import TraceOptions, load_trace, sample_path


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_drives_a_simulation_under_cache_pressure(name):
    requests = load_trace(sample_path("mooncake"), TraceOptions(limit=40))
    config = RunConfig(eviction=name, num_gpu_blocks=2500, max_num_seqs=8)
    summary, _, _ = run_outputs(simulate(requests, config))
    assert summary["config"]["eviction"] == name
    assert summary["num_completed"] == summary["num_requests"] - summary["num_rejected"] > 30
    assert summary["prefix_cache"]["hit_tokens"] > 0


def test_an_unknown_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="field 'eviction': expected one of 'lru'"):
        RunConfig.from_dict({"eviction": "fifo"})
    with pytest.raises(ValueError, match="eviction"):
        RunConfig(eviction="fifo")


def test_run_takes_eviction_and_reports_it(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kvsim.cli", "run", "--limit", "20",
                           "--eviction", "hybrid", "--out", str(tmp_path), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["config"]["eviction"] == "hybrid"


def test_summary_reports_the_cached_idle_room_eviction_has():
    requests = load_trace(sample_path("mooncake"), TraceOptions(limit=40))
    summary, _, _ = run_outputs(simulate(requests, RunConfig(num_gpu_blocks=2500,
                                                             max_num_seqs=8)))
    kv = summary["kv"]
    assert 0 < kv["mean_cached_idle_blocks"] <= kv["num_gpu_blocks"]
    assert kv["mean_cached_idle_fraction"] == pytest.approx(
        kv["mean_cached_idle_blocks"] / kv["num_gpu_blocks"])
    assert {"mean_usage", "peak_usage", "mean_batch_size"} <= set(kv)   # old keys kept
    from kvsim.reports.terminal import _idle_text
    assert "blocks on average" in _idle_text(summary)
