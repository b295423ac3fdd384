"""`kvsim models` and `kvsim gpus`: the catalogs --model and --gpu name."""

import json

from clirun import kvsim


def test_models_lists_every_catalog_model_with_its_shape():
    from kvsim.sim.perf.models import list_models
    done = kvsim("models")
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[0].split() == [
        "model", "params", "active", "layers", "attn", "max", "len", "KV/token"]
    assert [line.split()[0] for line in lines[1:-1]] == list_models()
    assert lines[-1] == "active: parameters used per token; KV/token: its cache over all layers, bf16"
    assert max(map(len, lines)) <= 80           # (a terminal of 80 columns: no line wraps)
    row = next(line for line in lines if line.startswith("llama-2-7b "))
    assert row.split()[1:8] == ["6.7B", "6.7B", "32", "mha", "4,096", "512", "KiB"]
    listed = json.loads(kvsim("models", "--json").stdout)
    assert {m["name"]: m["kv_bytes_per_token"] for m in listed}["llama-2-7b"] == 524288


def test_gpus_lists_memory_bandwidth_and_price():
    done = kvsim("gpus")
    row = next(line for line in done.stdout.splitlines() if line.startswith("h100-80gb "))
    assert row.split() == ["h100-80gb", "79.65", "GiB", "3.35", "TB/s", "989", "TFLOP/s",
                           "nvlink4", "2.99"]
    assert "h100" in {g["name"]: g["aliases"] for g in
                      json.loads(kvsim("gpus", "--json").stdout)}["h100-80gb"]


def test_an_alias_runs_as_its_catalog_name_and_bare_a100_is_ambiguous(tmp_path):
    done = kvsim("run", "--gpu", "H100", "--limit", "5", "--out", tmp_path, "--json")
    assert json.loads(done.stdout)["config"]["gpu"] == "h100-80gb"
    done = kvsim("run", "--gpu", "a100", "--limit", "5", "--out", tmp_path / "b")
    assert (done.returncode, done.stderr) == (2, "kvsim: error: --gpu: 'a100' names "
                                                 "more than one GPU: give a100-40gb or "
                                                 "a100-80gb\n")
