"""A Hugging Face id that is no catalog alias resolves through the local Hugging Face cache."""

import json
import os
import subprocess
import sys

import pytest
from kvsim.errors import ConfigError
from kvsim.sim.perf.hf_cache import cached_config, hub_cache_dir
from kvsim.sim.perf.models import resolve_model

SMALL_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
               "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8,
               "num_hidden_layers": 16, "intermediate_size": 8192, "vocab_size": 128256,
               "max_position_embeddings": 131072, "tie_word_embeddings": True}


def put(hub, repo_id, config, rev="abc123", main=True):
    """A config.json laid out as huggingface_hub caches it."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(rev)
    return snap / "config.json"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf" / "hub"


def test_cache_dir_follows_huggingface_hubs_variables(tmp_path, monkeypatch, hub):
    assert hub_cache_dir() == hub
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub_cache_dir() == tmp_path / "elsewhere"


def test_a_cached_id_resolves_offline(hub):
    put(hub, "meta-llama/Llama-3.2-1B", SMALL_LLAMA)
    model = resolve_model("meta-llama/Llama-3.2-1B")
    assert model.name == "meta-llama/Llama-3.2-1B"
    assert (model.num_layers, model.num_kv_heads, model.head_dim) == (16, 8, 64)
    assert model.kv_bytes_per_token("bf16") == 2 * 16 * 8 * 64 * 2


def test_refs_main_picks_the_snapshot(hub):
    put(hub, "org/m", {**SMALL_LLAMA, "num_hidden_layers": 4}, rev="old", main=False)
    put(hub, "org/m", SMALL_LLAMA, rev="new")
    assert cached_config("org/m").parent.name == "new"


def test_an_id_not_in_the_cache_says_where_it_looked(hub):
    with pytest.raises(ConfigError) as err:
        resolve_model("org/missing")
    text = str(err.value)
    assert text.startswith(f"field 'model': unknown model 'org/missing', not in the local "
                           f"Hugging Face cache ({hub}; `huggingface-cli download org/missing "
                           "config.json` puts it there); known: ")
    assert "\n" not in text


def test_an_unsupported_architecture_lists_the_supported_ones(hub):
    path = put(hub, "google-bert/bert-base-uncased", {"model_type": "bert",
                                                       "architectures": ["BertForMaskedLM"]})
    with pytest.raises(ConfigError) as err:
        resolve_model("google-bert/bert-base-uncased")
    assert str(err.value) == (
        f"{path}: field 'model': BertForMaskedLM (model_type 'bert') is not supported; "
        "supported model types: llama, mistral, qwen2, opt, qwen3, qwen3_moe, qwen2_moe, "
        "mixtral, deepseek_v2, deepseek_v3, gpt_oss, gemma3, gemma3_text, llama4, llama4_text")


def test_kvsim_run_takes_a_cached_id(tmp_path):
    put(tmp_path / "hub", "meta-llama/Llama-3.2-1B", SMALL_LLAMA)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub")}
    done = subprocess.run([sys.executable, "-m", "kvsim.cli", "run", "sample:azure-conv",
                           "--limit", "10", "--model", "meta-llama/Llama-3.2-1B", "--out",
                           str(tmp_path / "o"), "--json"], capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["config"]["model"] == "meta-llama/Llama-3.2-1B"
